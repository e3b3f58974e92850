"""Where ShardDiT puts the text encoder and the VAE: the planner's rules, applied to what this
process already placed, so ``auto`` is deterministic for a given inventory and re-queuing the same
workflow moves nothing.

The registry below is the only process-wide state: the last plan of each component ShardDiT
loaded (device and bytes). Components of a loaded DiT are pinned to where they are.
"""
from __future__ import annotations

import logging
import threading
from dataclasses import replace
from typing import NamedTuple

import comfy.model_management as mm

from ....parallel.placement.devices import DevicePlan
from ....parallel.placement.inventory import Inventory, read_inventory
from ....parallel.placement.plan_types import DEFAULT_RESERVE_VRAM_GB
from ....parallel.placement.planner import plan_placement
from ....parallel.placement.plan_types import Footprint, PlacementRequest
from .running_state import with_releasable

log = logging.getLogger("sharddit")

_LOCK = threading.Lock()
_PLACED: dict[str, dict] = {}  # "text_encoder"/"vae" -> {"device", "bytes"}; "dit" -> {"footprint", "devices"}

_COMPONENTS = ("text_encoder", "vae")
SHARDDIT_ATTR = "sharddit_component"  # set on the torch module of every model ShardDiT loads


def record_dit(footprint: Footprint, block_devices: DevicePlan) -> None:
    """Called when a DiT is sharded: later ``auto`` components plan around it."""
    with _LOCK:
        _PLACED["dit"] = {"footprint": footprint, "devices": block_devices}


def record_component(kind: str, device: str, nbytes: int) -> None:
    with _LOCK:
        _PLACED[kind] = {"device": device, "bytes": int(nbytes)}


def placed() -> dict:
    with _LOCK:
        return {k: dict(v) for k, v in _PLACED.items()}


def plan_component_device(kind: str, nbytes: int, device: str, reserve_vram_gb: float = DEFAULT_RESERVE_VRAM_GB,
                          inventory: Inventory | None = None) -> str:
    """Device for a text encoder or VAE of ``nbytes``: ``device`` if explicit (checked to exist),
    else the planner's choice: a GPU the DiT does not use when one fits, else beside the DiT,
    else the CPU. Raises ValueError (naming the value and the fix) before anything is loaded."""
    assert kind in _COMPONENTS, kind
    state = placed()
    inventory = inventory if inventory is not None else current_inventory()
    footprint, request = footprint_and_request(kind, nbytes, device, reserve_vram_gb, state)
    plan = plan_placement(inventory, footprint, request)
    chosen = plan.text_encoder_device if kind == "text_encoder" else plan.vae_device
    if str(device).strip().lower() == "auto":
        why = [n for n in plan.notes if kind.replace("_", " ") in n.lower()]
        log.info("[ShardDiT] %s (%.2f GiB) -> %s%s", kind.replace("_", " "), nbytes / 2**30, chosen,
                 f" ({why[0]})" if why else "")
    return chosen


def footprint_and_request(kind, nbytes, device, reserve_vram_gb, state):
    """The DiT and the other component as already placed (pinned), plus this component."""
    dit = state.get("dit")
    footprint = dit["footprint"] if dit else Footprint(block_bytes=(1,))
    pinned = {}
    for other in _COMPONENTS:
        if other != kind and other in state:
            footprint = replace(footprint, **{f"{other}_bytes": state[other]["bytes"]})
            pinned[f"{other}_device"] = state[other]["device"]
    footprint = replace(footprint, **{f"{kind}_bytes": int(nbytes)})
    request = PlacementRequest(devices=dit["devices"] if dit else DevicePlan(auto=True), reserve_vram_gb=reserve_vram_gb,
                               **pinned, **{f"{kind}_device": str(device).strip()})
    return footprint, request


class LoadedModel(NamedTuple):
    """One model ComfyUI holds loaded now."""

    device: str  # its load device
    patcher: object  # comfy.model_patcher.ModelPatcher
    loaded_bytes: int  # what sits on ``device`` now (lowvram: part of it)
    sharddit: bool  # loaded by ShardDiT (sharded main, shard, text encoder or VAE)


def read_loaded() -> list[LoadedModel]:
    """What ComfyUI holds loaded now, through its public ``loaded_models()``: the one reader of
    ComfyUI's list for ShardDiT (placement, the Plan node, the shard hooks)."""
    return [LoadedModel(str(p.load_device), p, int(p.loaded_size()), is_sharddit_patcher(p))
            for p in mm.loaded_models() if p is not None]


def sharddit_holdings() -> dict[str, int]:
    """Bytes ShardDiT's own loaded models hold per device (they are re-placed, not in the way)."""
    held: dict[str, int] = {}
    for loaded in read_loaded():
        if loaded.sharddit:
            held[loaded.device] = held.get(loaded.device, 0) + loaded.loaded_bytes
    return held


def is_sharddit_patcher(patcher) -> bool:
    if getattr(patcher.model, SHARDDIT_ATTR, None) is not None:
        return True
    get = getattr(patcher, "get_attachment", None)
    return callable(get) and get("sharddit") is not None


def current_inventory() -> Inventory:
    """The inventory now, with bytes ShardDiT's own loaded models hold counted as available, and
    what ComfyUI's memory manager can release (comfy-aimdo, torch's cache: ``running_state``)."""
    inventory = read_inventory()
    held = {d: b for d, b in sharddit_holdings().items() if d in inventory.names}
    return with_releasable(inventory.with_held_bytes(held))
