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

from dataclasses import dataclass

from .devices import DeviceEntry, check_devices_exist
from .inventory import Inventory
from .plan_ranges import compute_block_ranges
from .plan_text import (
    PlacementError,
    format_component_note,
    format_dit_error,
    format_skip_note,
    format_weight_error,
)
from .plan_types import BlockRange, DeviceLoad, Footprint, PlacementRequest, Plan

__all__ = ["plan_placement"]

_UNLIMITED = 1 << 62


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
    devlist = request.devices
    components = _components(footprint, request)
    explicit = [e.device for e in devlist.entries] + [request.text_encoder_device, request.vae_device]
    existing = inventory.names if inventory.cpu is not None else inventory.names + ("cpu",)
    check_devices_exist([d for d in explicit if d != "auto"], existing, inventory.hidden_note)
    loads: dict = {}
    notes: list[str] = []
    for name, device, w, a in components:
        if device != "auto" and (w or a):
            room = ctx.room(device, loads, w, a)
            if room < 0:
                notes.append(format_component_note(name, device, "short", w + a, room + w + a))
            _add(loads, device, w, a)
    entries = _choose_auto_entries(ctx, loads, notes) if devlist.auto else devlist.entries
    placed = {}
    for name, device, w, a in components:
        placed[name] = device if device != "auto" else _place_auto(ctx, name, w, a, entries, loads, notes)
    ranges = _compute_ranges(ctx, entries, loads)
    return _build_plan(ctx, placed, entries, ranges, loads, notes)


def _components(fp: Footprint, request: PlacementRequest):
    """(name, requested device, weights, activations): VAE first, then text encoder."""
    return (("VAE", request.vae_device, fp.vae_bytes, fp.vae_activation_bytes),
            ("text encoder", request.text_encoder_device, fp.text_encoder_bytes, fp.text_encoder_activation_bytes))


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


def _compute_ranges(ctx: _Ctx, entries, loads: dict):
    """Block ranges of ``entries``: proportional to their room, or to their weights when the
    request's devices give weights; PlacementError when the DiT does not fit."""
    if not ctx.request.devices.weighted:
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
    left = _leftover(ctx, entries, loads)
    for device in sorted(dit, key=lambda d: -left[d]):
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


def _leftover(ctx: _Ctx, entries, loads: dict) -> dict:
    """Bytes each DiT device keeps free once its blocks are placed (proportional split)."""
    ranges = _try_ranges(ctx, entries, loads) or [(0, 0)] * len(entries)
    left: dict = {}
    for entry, cap, (start, stop) in zip(entries, _block_caps(ctx, entries, loads), ranges):
        left[entry.device] = left.get(entry.device, 0) + cap - sum(ctx.footprint.block_bytes[start:stop])
    return left


def _build_plan(ctx: _Ctx, placed: dict, entries, ranges, loads: dict, notes: list) -> Plan:
    fp = ctx.footprint
    block_ranges = []
    for entry, (start, stop) in zip(entries, ranges):
        if start == stop:
            notes.append(f"{entry.device} gets no blocks (the proportional split of {len(fp.block_bytes)} leaves it none)")
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
