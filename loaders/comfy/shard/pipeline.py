"""One way through a sharding call, in four steps, each called once and in this order:

1. resolve the devices (``which_devices.resolve_devices``): ``auto`` made explicit, workers checked;
2. decide the mode (``mode_decision.decide_mode``): the shards planned (or found built) and
   ``parallel`` decided against that plan, so a refused mode moves no weight;
3. get or build the shards (``sharded_model.get_or_build_shards``);
4. attach the mode (``attach_mode.attach_mode``).

Each step returns one of ``step_values``' values and none calls back here. A MODEL already sharded
only changes its mode: steps 2 and 4 on its shard state (``set_parallel_mode``).
"""
from __future__ import annotations

import logging

from ....parallel.cost.mode import DEFAULT_PARALLEL, check_parallel
from ....parallel.placement.devices import DevicePlan, parse_device_plan
from ....parallel.placement.plan_types import DEFAULT_DEVICES, DEFAULT_RESERVE_VRAM_GB
from ..core.running_state import sync_pinned_memory
from ..core.patcher_clone import clonable
from .attach_mode import attach_mode
from .which_devices import resolve_devices
from .hooks import get_shard_state
from ..models.specs import unshardable_reason
from .mode_decision import decide_for_state, decide_mode
from .step_values import ShardRequest, Shards
from .sharded_model import get_or_build_shards

__all__ = ["set_parallel_mode", "shard_model"]


def shard_model(model, devices: DevicePlan | str = DEFAULT_DEVICES, reserve_vram_gb: float = DEFAULT_RESERVE_VRAM_GB,
                inventory=None, parallel: str = DEFAULT_PARALLEL):
    """A sharded clone of ``model`` (a ComfyUI ModelPatcher, not mutated) running ``parallel``
    (``auto``, ``blocks`` or ``sequence``; the shards are the same for every mode).

    Everything that can fail on user input (unknown architecture, bad device string, a plan that
    does not fit, a mode that cannot run) fails in steps 1 and 2, before any weight moves.

    With ``devices="auto"`` a model ShardDiT cannot shard (an image UNet, a segmentation model that
    a sharded workflow's loader also feeds) is returned as it came, with one log line: ``auto``
    asks for the best this model allows, and the shard transform puts a Shard node after every
    loader. A device list asks for sharding: there it is an error.

    ``devices``: the node's input, parsed here once (or its ``DevicePlan``, already parsed)."""
    devices = devices if isinstance(devices, DevicePlan) else parse_device_plan(devices)
    if devices.auto and not devices.members:
        reason = unshardable_reason(type(model.get_model_object("diffusion_model")).__name__)
        if reason is not None:
            logging.getLogger("sharddit").info("%s; devices 'auto': the model passes through unsharded", reason)
            return model
    sync_pinned_memory()  # the block ring follows ComfyUI's --disable-pinned-memory
    model = clonable(model)  # a pack's patcher subclass that core's clone() cannot rebuild (fast_disk)
    request = ShardRequest(model, devices, float(reserve_vram_gb), check_parallel(parallel), inventory)
    where = resolve_devices(request)
    choice = decide_mode(request, where)
    shards = get_or_build_shards(request, where, choice)
    return attach_mode(shards, choice)


def set_parallel_mode(m, parallel: str):
    """Bind ``m`` (a sharded clone, changed in place) to another parallel mode; returns ``m``."""
    state = get_shard_state(m)
    choice = decide_for_state(state, check_parallel(parallel))
    return attach_mode(Shards(m, state), choice)
