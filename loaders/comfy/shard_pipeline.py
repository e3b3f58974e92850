"""One way through a sharding call, in four steps, each called once and in this order:

1. resolve the devices (``shard_devices.resolve_devices``): ``auto`` made explicit, workers checked;
2. decide the mode (``shard_plan.decide_mode``): the shards planned (or found built) and
   ``parallel`` decided against that plan, so a refused mode moves no weight;
3. get or build the shards (``sharded_model.get_or_build_shards``);
4. attach the mode (``shard_mode.attach_mode``).

Each step returns one of ``shard_steps``' values and none calls back here. A MODEL already sharded
only changes its mode: steps 2 and 4 on its shard state (``set_parallel_mode``).
"""
from __future__ import annotations

from ...parallel.cost.mode import DEFAULT_PARALLEL, check_parallel
from ...parallel.placement.plan_types import DEFAULT_DEVICES, DEFAULT_RESERVE_VRAM_GB
from .shard_mode import attach_mode
from .shard_devices import resolve_devices
from .shard_hooks import get_shard_state
from .shard_plan import decide_for_state, decide_mode
from .shard_steps import ShardRequest, Shards
from .sharded_model import get_or_build_shards

__all__ = ["set_parallel_mode", "shard_model"]


def shard_model(model, devices: str = DEFAULT_DEVICES, reserve_vram_gb: float = DEFAULT_RESERVE_VRAM_GB,
                inventory=None, parallel: str = DEFAULT_PARALLEL):
    """A sharded clone of ``model`` (a ComfyUI ModelPatcher, not mutated) running ``parallel``
    (``auto``, ``blocks`` or ``sequence``; the shards are the same for every mode).

    Everything that can fail on user input (unknown architecture, bad device string, a plan that
    does not fit, a mode that cannot run) fails in steps 1 and 2, before any weight moves."""
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
