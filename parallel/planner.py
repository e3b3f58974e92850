"""Placement planner: inventory + footprint + request -> frozen Plan (pure, no torch).

Memory model, per device: every model placed there keeps its weights resident, and the models
run one after another (encode -> sample -> decode), so the device needs
``sum(weights) + max(activation headroom)`` <= ``free + held - reserve`` (reserve on GPUs only).
``cpu`` offers system RAM (assumed enough when the inventory has no ``cpu`` entry).

Rules for ``auto`` (deterministic for a given inventory):

1. text encoder / VAE given explicitly are placed first;
2. DiT: GPUs ordered by usable memory, most first (ties: lower index); GPUs that cannot hold one
   block are skipped with a note; the DiT goes on the first k GPUs for the smallest k that fits;
   its non-block part ("home") lives on the first of them; blocks are split in contiguous
   ranges proportional to each GPU's usable memory. No GPU at all -> the DiT runs on ``cpu``;
3. VAE, then text encoder (the VAE first: decoding video on the CPU hurts most): on a GPU the DiT
   does not use (most room first), else beside the DiT if the blocks still fit, else ``cpu``.

An explicit ``devices`` list keeps its order (home on the first entry); weights replace the
proportions. When nothing fits, ``PlacementError`` gives GiB needed vs usable per device.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from .devices import DeviceEntry, DeviceList, check_devices_exist, parse_component_device, parse_devices
from .inventory import GiB, Inventory
from .plan_ranges import compute_block_ranges
from .plan_text import (
    PlacementError,
    format_component_note,
    format_dit_error,
    format_plan_table,
    format_skip_note,
    format_weight_error,
)

__all__ = ["Footprint", "PlacementRequest", "BlockRange", "DeviceLoad", "Plan", "PlacementError", "plan_placement"]

_UNLIMITED = 1 << 62


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
            raise ValueError(f"block_bytes must be a non-empty list of positive sizes, got {self.block_bytes[:8]}")
        for name in ("dit_home_bytes", "dit_activation_bytes", "text_encoder_bytes",
                     "text_encoder_activation_bytes", "vae_bytes", "vae_activation_bytes"):
            if int(getattr(self, name)) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")

    @property
    def dit_bytes(self) -> int:
        """All DiT weights: home plus blocks."""
        return self.dit_home_bytes + sum(self.block_bytes)


@dataclass(frozen=True)
class PlacementRequest:
    """What the user asked for (node inputs)."""

    devices: str = "auto"
    """DiT devices: ``auto``, ``cuda:0,cuda:1``, ``cpu,cpu`` or weighted ``cuda:0:3,cuda:1:1``."""
    text_encoder_device: str = "auto"
    """``auto``, ``cpu`` or ``cuda:N``."""
    vae_device: str = "auto"
    """``auto``, ``cpu`` or ``cuda:N``."""
    reserve_vram_gb: float = 0.0
    """GiB to leave free on every GPU (other apps, CUDA context, fragmentation)."""

    def __post_init__(self) -> None:
        parse_devices(self.devices)
        object.__setattr__(self, "text_encoder_device", parse_component_device(self.text_encoder_device))
        object.__setattr__(self, "vae_device", parse_component_device(self.vae_device))
        reserve = self.reserve_vram_gb
        if isinstance(reserve, bool) or not isinstance(reserve, (int, float)) or not math.isfinite(reserve) or reserve < 0:
            raise ValueError(f"reserve_vram_gb {reserve!r} must be a number >= 0 (GiB left free on each GPU)")

    @property
    def device_list(self) -> DeviceList:
        return parse_devices(self.devices)

    @property
    def reserve_bytes(self) -> int:
        return int(round(self.reserve_vram_gb * GiB))


@dataclass(frozen=True)
class BlockRange:
    """DiT blocks ``start <= i < stop`` live and run on ``device``."""

    device: str
    start: int
    stop: int


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

    def to_dict(self) -> dict:
        return {
            "text_encoder": self.text_encoder_device,
            "vae": self.vae_device,
            "home": self.home_device,
            "blocks": [[r.device, r.start, r.stop] for r in self.block_ranges],
            "loads": {l.device: {"weights": l.weight_bytes, "activations": l.activation_bytes} for l in self.loads},
            "notes": list(self.notes),
        }

    def to_text(self, inventory: Inventory) -> str:
        return format_plan_table(self, inventory)


@dataclass(frozen=True)
class _Ctx:
    inventory: Inventory
    footprint: Footprint
    request: PlacementRequest

    def capacity(self, device: str) -> int:
        """Bytes the plan may use on ``device``: free + held - reserve (GPU), RAM (cpu)."""
        if device == "cpu":
            cpu = self.inventory.cpu
            return cpu.available_bytes if cpu is not None and cpu.total_bytes > 0 else _UNLIMITED
        return self.inventory.get(device).available_bytes - self.request.reserve_bytes

    def room(self, device: str, loads: dict, weight: int = 0, activation: int = 0) -> int:
        """Bytes left on ``device`` after ``loads`` plus one more model; < 0: it does not fit."""
        w, a = loads.get(device, (0, 0))
        return self.capacity(device) - (w + weight) - max(a, activation)


def plan_placement(inventory: Inventory, footprint: Footprint, request: PlacementRequest) -> Plan:
    """Place text encoder, VAE, DiT home and DiT block ranges. PlacementError when it cannot."""
    ctx = _Ctx(inventory, footprint, request)
    devlist = request.device_list
    explicit = [e.device for e in devlist.entries] + [request.text_encoder_device, request.vae_device]
    existing = inventory.names if inventory.cpu is not None else inventory.names + ("cpu",)
    check_devices_exist([d for d in explicit if d != "auto"], existing)
    loads: dict = {}
    notes: list[str] = []
    te, vae = request.text_encoder_device, request.vae_device
    for name, device, w, a in _components(footprint, te, vae):
        if device != "auto" and (w or a):
            room = ctx.room(device, loads, w, a)
            if room < 0:
                notes.append(format_component_note(name, device, "short", w + a, room + w + a))
            _add(loads, device, w, a)
    entries = _choose_auto_entries(ctx, loads, notes) if devlist.auto else devlist.entries
    placed = {}
    for name, device, w, a in _components(footprint, te, vae):
        placed[name] = device if device != "auto" else _place_auto(ctx, name, w, a, entries, loads, notes)
    ranges = _compute_ranges(ctx, entries, loads, weighted=devlist.weighted)
    return _build_plan(ctx, placed, entries, ranges, loads, notes)


def _components(fp: Footprint, te: str, vae: str):
    """(name, requested device, weights, activations): VAE first, then text encoder."""
    return (("VAE", vae, fp.vae_bytes, fp.vae_activation_bytes),
            ("text encoder", te, fp.text_encoder_bytes, fp.text_encoder_activation_bytes))


def _add(loads: dict, device: str, weight: int, activation: int) -> None:
    w, a = loads.get(device, (0, 0))
    loads[device] = (w + weight, max(a, activation))


def _choose_auto_entries(ctx: _Ctx, loads: dict, notes: list) -> tuple[DeviceEntry, ...]:
    """Fewest GPUs (most usable first) that hold the DiT; cpu when there is no GPU."""
    gpus = ctx.inventory.gpus
    if not gpus:
        notes.append("no GPU found: the DiT runs on cpu (slow)")
        return (DeviceEntry("cpu"),)
    fp = ctx.footprint
    usable = {g.device: ctx.room(g.device, loads, 0, fp.dit_activation_bytes) for g in gpus}
    order = sorted(gpus, key=lambda g: (-usable[g.device], g.torch_index))
    candidates = []
    for g in order:
        if usable[g.device] < max(fp.block_bytes):
            notes.append(format_skip_note(ctx, g.device, loads, max(fp.block_bytes)))
        else:
            candidates.append(DeviceEntry(g.device))
    for k in range(1, len(candidates) + 1):
        if _try_ranges(ctx, tuple(candidates[:k]), loads) is not None:
            if k > 1:
                notes.append(f"DiT split over {k} GPUs ({', '.join(e.device for e in candidates[:k])}): it fits on no fewer")
            return tuple(candidates[:k])
    raise PlacementError(format_dit_error(ctx, [g.device for g in order], loads))


def _block_caps(ctx: _Ctx, entries, loads: dict) -> list[int]:
    """Bytes of blocks each entry may hold (a repeated device's room is split evenly)."""
    home = entries[0].device
    fp = ctx.footprint
    counts = {e.device: sum(1 for x in entries if x.device == e.device) for e in entries}
    rooms = {d: ctx.room(d, loads, fp.dit_home_bytes if d == home else 0, fp.dit_activation_bytes) for d in counts}
    return [rooms[e.device] // counts[e.device] for e in entries]


def _try_ranges(ctx: _Ctx, entries, loads: dict):
    """Proportional ranges under the caps, or None when the DiT does not fit."""
    caps = _block_caps(ctx, entries, loads)
    if min(caps) < 0 or max(caps) <= 0:
        return None
    return compute_block_ranges(ctx.footprint.block_bytes, [min(c, _UNLIMITED >> 8) for c in caps], caps)


def _compute_ranges(ctx: _Ctx, entries, loads: dict, weighted: bool):
    if not weighted:
        ranges = _try_ranges(ctx, entries, loads)
        if ranges is None:
            raise PlacementError(format_dit_error(ctx, list(dict.fromkeys(e.device for e in entries)), loads))
        return ranges
    ranges = compute_block_ranges(ctx.footprint.block_bytes, [e.weight for e in entries])
    caps = _block_caps(ctx, entries, loads)
    for entry, cap, (start, stop) in zip(entries, caps, ranges):
        if sum(ctx.footprint.block_bytes[start:stop]) > cap:
            raise PlacementError(format_weight_error(ctx, entry, start, stop, cap))
    return ranges


def _place_auto(ctx: _Ctx, name: str, weight: int, act: int, entries, loads: dict, notes: list) -> str:
    """Other GPU with most room, else beside the DiT if the blocks still fit, else cpu.

    A component of 0 bytes (not in this workflow) goes with the DiT home and costs nothing.
    """
    if weight == 0 and act == 0:
        return entries[0].device
    dit = list(dict.fromkeys(e.device for e in entries))
    others = [g.device for g in ctx.inventory.gpus if g.device not in dit]
    for device in sorted(others, key=lambda d: -ctx.room(d, loads, weight, act)):
        if ctx.room(device, loads, weight, act) >= 0:
            _add(loads, device, weight, act)
            return device
    for device in sorted(dit, key=lambda d: -ctx.room(d, loads, weight, act)):
        trial = dict(loads)
        _add(trial, device, weight, act)
        if ctx.room(device, trial) >= 0 and _try_ranges(ctx, entries, trial) is not None:
            loads.update(trial)
            if device != "cpu":
                notes.append(format_component_note(name, device, "beside", weight + act, 0))
            return device
    _add(loads, "cpu", weight, act)
    notes.append(format_component_note(name, "cpu", "cpu", weight + act, 0))
    return "cpu"


def _build_plan(ctx: _Ctx, placed: dict, entries, ranges, loads: dict, notes: list) -> Plan:
    fp = ctx.footprint
    block_ranges = []
    for entry, (start, stop) in zip(entries, ranges):
        if start == stop:
            notes.append(f"{entry.device} gets no blocks: {len(fp.block_bytes)} blocks do not reach it")
            continue
        block_ranges.append(BlockRange(entry.device, start, stop))
        _add(loads, entry.device, sum(fp.block_bytes[start:stop]), fp.dit_activation_bytes)
    _add(loads, entries[0].device, fp.dit_home_bytes, fp.dit_activation_bytes)
    order = list(ctx.inventory.names) + ["cpu"]
    device_loads = tuple(DeviceLoad(d, *loads[d]) for d in sorted(loads, key=order.index))
    return Plan(
        text_encoder_device=placed["text encoder"],
        vae_device=placed["VAE"],
        home_device=entries[0].device,
        block_ranges=tuple(block_ranges),
        loads=device_loads,
        notes=tuple(notes),
    )
