"""Where a text encoder's layers go when it fits no single device (pure, no torch).

The DiT's ``blocks`` rules, applied to the encoder's layer list: its non-layer part ("home":
embeddings, final norm, projections) lives on the first device, with its first layers; layers are
split in contiguous ranges proportional to each device's room (``compute_block_ranges``), under
each device's cap; ``auto`` takes the fewest GPUs (most room first) that hold the encoder, and
only when all GPUs together do not, the CPU takes the layers left over (GPU before CPU). An
explicit list keeps its order; weights (``cuda:0:3,cuda:1:1``) replace the proportions; a list
that ends in ``cpu`` after GPUs fills the GPUs first and gives the CPU the rest.

``rooms``: bytes each device may still take for the encoder (free + held - reserve - what is
already placed there - the encoder's activation headroom); a device missing from ``rooms`` has no
limit (the CPU when the inventory does not know its RAM).
"""
from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from ..units import GiB
from .devices import DEVICES_FORM, DevicePlan
from .plan_ranges import compute_block_ranges
from .plan_text import PlacementError
from .plan_types import BlockRange, block_devices_of
from ..errors import InputError

__all__ = ["LayerSplit", "plan_layer_split"]

_SHARE_CAP = float(1 << 54)  # an unlimited room's share: finite, so shares can be summed


@dataclass(frozen=True)
class LayerSplit:
    """The encoder's layers over devices: ``ranges`` in order from layer 0; ``home`` holds the
    rest of the encoder (the first listed device, even when the split leaves it no layer)."""

    ranges: tuple[BlockRange, ...]
    home: str
    notes: tuple[str, ...] = ()

    @property
    def devices(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys([self.home] + [r.device for r in self.ranges]))

    def layer_devices(self) -> tuple[str, ...]:
        return block_devices_of(self.ranges)

    def describe(self) -> str:
        """``cuda:0 layers 0-29, cpu layers 30-47`` (first and last layer of each range)."""
        return ", ".join(f"{r.device} layers {r.start}-{r.stop - 1}" for r in self.ranges)


def plan_layer_split(layer_bytes: Sequence[int], home_bytes: int, rooms: Mapping[str, int],
                     devices: DevicePlan = DevicePlan(auto=True)) -> LayerSplit:
    """Split ``layer_bytes`` (per layer, in order) plus ``home_bytes`` over ``devices``
    (``auto`` or a device list: ``parse_device_plan``'s value). PlacementError (GiB needed vs room per device) when it cannot."""
    layer_bytes = tuple(int(b) for b in layer_bytes)
    if not layer_bytes or min(layer_bytes) <= 0:
        raise InputError(f"layer_bytes must be a non-empty list of positive sizes, got {layer_bytes[:8]}")
    devlist = devices
    notes: list[str] = []
    if devlist.auto:
        entries, weights = _auto_entries(layer_bytes, home_bytes, rooms, notes), None
    else:
        entries = [e.device for e in devlist.entries]
        weights = [e.weight for e in devlist.entries] if devlist.weighted else None
    caps = _caps(entries, home_bytes, rooms)
    ranges = _ranges(layer_bytes, entries, caps, weights)
    if ranges is None:
        raise PlacementError(_error(layer_bytes, home_bytes, entries, caps, devices.text))
    kept = []
    for device, (start, stop) in zip(entries, ranges):
        if start == stop:
            notes.append(f"{device} gets no text encoder layers (the others hold them all)")
        else:
            kept.append(BlockRange(device, start, stop))
    return LayerSplit(tuple(kept), entries[0], tuple(notes))


def _room(rooms: Mapping[str, int], device: str) -> float:
    return rooms.get(device, math.inf)


def _auto_entries(layer_bytes, home_bytes, rooms, notes) -> list[str]:
    """Fewest GPUs (most room first, ties: listed order) that hold it all; else every GPU that
    holds a layer, then the CPU for the rest."""
    gpus = [d for d in rooms if d != "cpu"]
    order = sorted(gpus, key=lambda d: -rooms[d])
    fit = [d for d in order if rooms[d] >= max(layer_bytes) + (home_bytes if d == order[0] else 0)]
    for k in range(1, len(fit) + 1):
        if _ranges(layer_bytes, fit[:k], _caps(fit[:k], home_bytes, rooms), None) is not None:
            if k > 1:
                notes.append(f"text encoder split over {k} GPUs ({', '.join(fit[:k])}): it fits on no fewer")
            return fit[:k]
    if fit:
        notes.append(f"text encoder fits no GPU set ({', '.join(fit)} hold what they can): the CPU takes the rest")
    return fit + ["cpu"]


def _caps(entries, home_bytes, rooms) -> list[float]:
    """Bytes of layers each entry may hold: its room, less home on the first; a repeated
    device's room split evenly."""
    counts = {d: entries.count(d) for d in entries}
    room = {d: _room(rooms, d) - (home_bytes if d == entries[0] else 0) for d in counts}
    return [room[d] / counts[d] for d in entries]


def _ranges(layer_bytes, entries, caps, weights):
    if min(caps) < 0:
        return None
    if weights is not None:
        ranges = compute_block_ranges(layer_bytes, weights)
        fits = all(sum(layer_bytes[a:b]) <= c for (a, b), c in zip(ranges, caps))
        return ranges if fits else None
    shares = [min(c, _SHARE_CAP) for c in caps]
    gpus_then_cpu = entries[-1] == "cpu" and any(d != "cpu" for d in entries)
    if gpus_then_cpu:  # GPU before CPU: the GPUs up to their caps, the CPU what is left
        first = next(i for i, d in enumerate(entries) if d == "cpu")
        held = sum(min(c, sum(layer_bytes)) for c in caps[:first])
        left = max(sum(layer_bytes) - held, 0)
        shares = shares[:first] + [left / (len(entries) - first)] * (len(entries) - first)
    if sum(shares) <= 0:
        return None
    return compute_block_ranges(layer_bytes, shares, caps)


def _error(layer_bytes, home_bytes, entries, caps, devices) -> str:
    need = (sum(layer_bytes) + home_bytes) / GiB
    rooms = ", ".join(f"{d} {c / GiB:.2f} GiB" if math.isfinite(c) else f"{d} no limit"
                      for d, c in zip(entries, caps))
    return (f"[ShardDiT] the text encoder ({need:.2f} GiB: {len(layer_bytes)} layers of up to "
            f"{max(layer_bytes) / GiB:.2f} GiB + {home_bytes / GiB:.2f} GiB outside them) does not fit "
            f"device {devices!r} (room for layers: {rooms}). Add devices (e.g. end the list with ',cpu'), "
            f"free memory, or lower reserve_vram_gb; accepted: {DEVICES_FORM}.")
