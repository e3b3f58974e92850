"""Data of the placement planner: what the models need, what the user asked, the plan (frozen)."""
from __future__ import annotations

import math
from dataclasses import dataclass

from .devices import DevicePlan, parse_component_device
from ..units import GiB
from .inventory import Inventory
from .plan_text import format_plan_table
from ..errors import InputError, InputTypeError

__all__ = ["BlockRange", "DeviceLoad", "Footprint", "PlacementRequest", "Plan"]


@dataclass(frozen=True)
class Footprint:
    """Bytes the models need (from the sizing module or a simulation)."""

    block_bytes: tuple[int, ...]
    """Weight bytes of each DiT block, in execution order."""
    dit_home_bytes: int = 0
    """Weight bytes of the DiT outside its blocks (embeddings, modulation, head)."""
    dit_activation_bytes: int = 0
    """Peak activation headroom on EACH device that runs DiT blocks."""
    text_encoder_bytes: int = 0
    """Weight bytes of the text encoder (0: none in this workflow)."""
    text_encoder_activation_bytes: int = 0
    """Peak activation headroom while the text encoder runs."""
    vae_bytes: int = 0
    """Weight bytes of the VAE (0: none)."""
    vae_activation_bytes: int = 0
    """Peak activation headroom while the VAE decodes (per tile batch)."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "block_bytes", tuple(int(b) for b in self.block_bytes))
        if not self.block_bytes or min(self.block_bytes) <= 0:
            raise InputError(f"block_bytes must be a non-empty list of positive sizes, got {self.block_bytes[:8]}")
        for name in ("dit_home_bytes", "dit_activation_bytes", "text_encoder_bytes",
                     "text_encoder_activation_bytes", "vae_bytes", "vae_activation_bytes"):
            if int(getattr(self, name)) < 0:
                raise InputError(f"{name} must be >= 0, got {getattr(self, name)}")

    @property
    def dit_bytes(self) -> int:
        """All DiT weights: home plus blocks."""
        return self.dit_home_bytes + sum(self.block_bytes)


DEFAULT_DEVICES = "auto"
"""The one default of every ``devices`` input (nodes, the KSampler path, the CLI)."""
DEFAULT_RESERVE_VRAM_GB = 1.0
"""The one default of every ``reserve_vram_gb`` input (nodes, the KSampler path, the CLI, the
simulator): GiB left free per GPU for the CUDA context (~0.5 GiB), other apps and slack.
``PlacementRequest`` itself keeps 0.0: the pure planner reserves exactly what it is given."""


@dataclass(frozen=True)
class PlacementRequest:
    """What the user asked for (node inputs)."""

    devices: DevicePlan = DevicePlan(auto=True)
    """DiT devices (``devices.parse_device_plan``'s value): ``auto``, ``cuda:0,cuda:1``, ``cpu,cpu`` or
    weighted ``cuda:0:3,cuda:1:1``; this machine's only (worker ranks are ``cpu`` entries here)."""
    text_encoder_device: str = "auto"
    """``auto``, ``cpu`` or ``cuda:N``."""
    vae_device: str = "auto"
    """``auto``, ``cpu`` or ``cuda:N``."""
    reserve_vram_gb: float = 0.0
    """GiB to leave free on every GPU (other apps, CUDA context, fragmentation). Callers that
    take it from a user pass it (default ``DEFAULT_RESERVE_VRAM_GB``)."""

    def __post_init__(self) -> None:
        if not isinstance(self.devices, DevicePlan) or self.devices.members:
            raise InputTypeError(f"devices must be a DevicePlan of this machine's devices (parse_device_plan, then "
                                 f"with_worker_shares), got {self.devices!r}")
        object.__setattr__(self, "text_encoder_device", parse_component_device(self.text_encoder_device))
        object.__setattr__(self, "vae_device", parse_component_device(self.vae_device))
        reserve = self.reserve_vram_gb
        if isinstance(reserve, bool) or not isinstance(reserve, (int, float)) or not math.isfinite(reserve) or reserve < 0:
            raise InputError(f"reserve_vram_gb {reserve!r} must be a number >= 0 (GiB left free on each GPU)")

    @property
    def reserve_bytes(self) -> int:
        return int(round(self.reserve_vram_gb * GiB))


@dataclass(frozen=True)
class BlockRange:
    """DiT blocks ``start <= i < stop`` live and run on ``device``."""

    device: str
    start: int
    stop: int


def block_devices_of(ranges) -> tuple[str, ...]:
    """Device of each block, in global block order, from contiguous ``BlockRange``s that start at
    block 0 and leave no gap (a plan's, or the simulator's forced split when nothing fits)."""
    devices: list[str] = []
    for r in ranges:
        if r.start != len(devices) or r.stop <= r.start:
            raise AssertionError(f"block ranges must be contiguous from block 0 without gaps: {list(ranges)}")
        devices += [r.device] * (r.stop - r.start)
    return tuple(devices)


@dataclass(frozen=True)
class DeviceLoad:
    """What the plan puts on one device."""

    device: str
    weight_bytes: int
    """Resident weights of every model placed there."""
    activation_bytes: int
    """Largest activation headroom among them (they run one after another)."""


@dataclass(frozen=True)
class Plan:
    """A placement. ``to_dict`` is what tests compare; ``to_text`` is what users read."""

    text_encoder_device: str
    vae_device: str
    home_device: str
    """Device of the DiT's non-block part; hidden states start and end there."""
    block_ranges: tuple[BlockRange, ...]
    """Contiguous, non-empty, in order, covering every block; a device may appear twice."""
    loads: tuple[DeviceLoad, ...]
    """Per device holding anything, in inventory order."""
    notes: tuple[str, ...] = ()
    """Why things went where they did (skipped GPUs, CPU fallbacks), for the log and the UI."""

    @property
    def dit_devices(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(r.device for r in self.block_ranges))

    def block_devices(self) -> tuple[str, ...]:
        """Device of each DiT block, in global block order."""
        return block_devices_of(self.block_ranges)

    def to_dict(self) -> dict:
        return {
            "text_encoder": self.text_encoder_device,
            "vae": self.vae_device,
            "home": self.home_device,
            "blocks": [[r.device, r.start, r.stop] for r in self.block_ranges],
            "loads": {ld.device: {"weights": ld.weight_bytes, "activations": ld.activation_bytes} for ld in self.loads},
            "notes": list(self.notes),
        }

    def to_text(self, inventory: Inventory) -> str:
        return format_plan_table(self, inventory)
