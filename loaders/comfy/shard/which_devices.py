"""Step 1 of a sharding call: which devices. ``devices=auto`` becomes an explicit list (this
machine's planner choice, plus every joined worker where the mode can use them); worker entries
are checked (joined, listed once, not with ``parallel=blocks``) before anything is planned."""
from __future__ import annotations

import logging

from ....parallel.placement.devices import DevicePlan
from ....parallel.placement.planner import plan_placement
from ....parallel.placement.plan_types import PlacementRequest
from ..remote.host_workers import check_workers, resolve_auto_devices
from ..core.component_placement import current_inventory
from .step_values import Devices, ShardRequest
from ..models.specs import find_arch_spec, get_arch_spec
from .mode_decision import footprint_of
from ....parallel.errors import InputError

__all__ = ["resolve_devices"]

log = logging.getLogger("sharddit")
_SAID: set = set()  # (choice, note) pairs logged: the inventory is read on every prompt


def resolve_devices(request: ShardRequest) -> Devices:
    model = request.model
    devices = resolve_auto_devices(request.devices, request.parallel,
                                   lambda: _local_auto_devices(model, request.reserve_vram_gb, request.inventory),
                                   lambda: _blocks_only(model))
    if devices.members and request.parallel == "blocks":
        raise InputError(f"devices {devices.text!r} names worker devices: they run parallel=sequence "
                         "only (set parallel to 'sequence' or 'auto')")
    check_workers(devices.text, devices.members)
    return Devices(devices, float(request.reserve_vram_gb))


def _blocks_only(model) -> str:
    """Why ``model`` runs in blocks mode only ('' when sequence mode splits its architecture)."""
    dit = model.get_model_object("diffusion_model")
    return find_arch_spec(type(dit).__name__).sequence_specs(dit)[1]


def _local_auto_devices(model, reserve_vram_gb, inventory) -> DevicePlan:
    """This machine's ``devices=auto`` choice as an explicit list: the planner's block-range
    devices, each once in order (``cuda:0,cuda:1``, ``cpu`` without a GPU)."""
    dit = model.get_model_object("diffusion_model")
    fp = footprint_of(dit, get_arch_spec(dit))
    inventory = inventory if inventory is not None else current_inventory()
    plan = plan_placement(inventory, fp, PlacementRequest(reserve_vram_gb=reserve_vram_gb))
    chosen = DevicePlan.of_devices(dict.fromkeys(r.device for r in plan.block_ranges))
    _say_hidden(chosen, inventory)
    return chosen


def _say_hidden(chosen: DevicePlan, inventory) -> None:
    """``auto`` chose among the GPUs this process sees; when the driver has more (ComfyUI's Windows
    default: one GPU unless started with ``--cuda-device all``) say so, once per choice."""
    note = inventory.hidden_note
    if note and (chosen.text, note) not in _SAID:
        _SAID.add((chosen.text, note))
        n = len(inventory.gpus)
        log.warning("[ShardDiT] devices 'auto' -> %s, chosen from the %d GPU%s this process sees. %s", chosen.text, n,
                    "" if n == 1 else "s", note)
