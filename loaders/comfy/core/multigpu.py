"""A ShardDiT MODEL next to core's own multi-GPU nodes (core 0.23+: ``comfy/multigpu.py``,
``comfy_extras/nodes_multigpu.py``): what composes, and what is refused at once, naming the node.

Core's nodes give a GPU a *full* copy of the DiT: ``MultiGPU_WorkUnits`` ("MultiGPU CFG Split") keeps
one deep clone per extra GPU (reloaded from the loader's ``cached_patcher_init``) and hands conds out
round-robin; ``SelectModelDevice`` with another GPU deep-clones the model there the same way. Either
would put a whole DiT on a GPU beside, or instead of, ShardDiT's shards (more than the plan says),
and a deep clone of a sharded MODEL would carry proxies to the original blocks. So:

- core node after ShardDiT: the sharded MODEL's ``cached_patcher_init`` is a factory that raises
  (core calls it for every deep clone before loading anything), naming the node and what to use;
- core's CFG split before ShardDiT: refused when ShardDiT shards (the MODEL carries its clones);
- ``SelectModelDevice`` to ``cpu`` after ShardDiT moves only the main patcher's load device: refused
  when sampling starts, before anything loads (``check_home_device``);
- ``SelectModelDevice`` before ShardDiT composes: ShardDiT's ``devices`` decide where the DiT goes
  (logged when that differs from the MODEL's load device). Same device (or ``default``) after
  ShardDiT composes too: core only sets the offload device.

ShardDiT's ``parallel=sequence`` already splits cond and uncond over the GPUs, with 1/N of the
weights per GPU. Only read here: core's clones are found through core's own ``additional_models``
entry and ``multigpu_options``; ShardDiT stores nothing under them.
"""
from __future__ import annotations

import logging
import traceback
from ....parallel.errors import InputError

log = logging.getLogger("sharddit")

__all__ = ["check_home_device", "check_incoming", "check_no_core_copies", "original_patcher_init", "refuse_full_copies"]

CFG_SPLIT = "core's MultiGPU CFG Split node (MultiGPU_WorkUnits)"
SELECT = "core's Select Model Device node (SelectModelDevice)"
INSTEAD = ("ShardDiT's parallel=sequence (or auto) already splits cond and uncond over the GPUs, each holding "
           "1/N of the weights; choose the GPUs in ShardDiT's devices input")
_CORE_KEY = "multigpu"  # core's additional_models entry of its CFG split clones (read, never written)


def _core_copies(model) -> list:
    get = getattr(model, "get_additional_models_with_key", None)
    return list(get(_CORE_KEY)) if callable(get) else []


def check_incoming(model, home: str) -> None:
    """Before sharding ``model`` with its DiT home on ``home``: refuse core's full copies, and say
    when ShardDiT's plan replaces the MODEL's own load device."""
    check_no_core_copies(model)
    note_incoming_device(model, home)


def check_no_core_copies(model) -> None:
    """A MODEL that went through core's CFG split holds a full DiT per extra GPU."""
    copies = _core_copies(model)
    if copies or "multigpu_options" in getattr(model, "model_options", {}):
        where = ", ".join(str(c.load_device) for c in copies) or "other GPUs"
        raise InputError(f"this MODEL went through {CFG_SPLIT}: it keeps a full copy of the DiT on "
                         f"{where}, which ShardDiT's plan does not count. Remove that node: {INSTEAD}.")


def refuse_full_copies(sharded) -> None:
    """Make every deep clone core asks of ``sharded`` (a sharded main) fail before it loads anything."""
    sharded.cached_patcher_init = (_refuse_full_copy, (original_patcher_init(sharded),))


def original_patcher_init(model):
    """The loader's ``cached_patcher_init`` under ShardDiT's refusal (as is when there is none)."""
    init = getattr(model, "cached_patcher_init", None)
    return init[1][0] if init is not None and init[0] is _refuse_full_copy else init


def _refuse_full_copy(_original, *args, **kwargs):
    """Called by core instead of the loader when it wants a full copy of a sharded MODEL."""
    frames = {f.name for f in traceback.extract_stack()}
    node = (CFG_SPLIT if "create_multigpu_deepclones" in frames else SELECT if "_retarget_patcher" in frames
            else f"{CFG_SPLIT} or {SELECT}")
    raise InputError(f"{node} asked for a full copy of a sharded MODEL on another GPU: ShardDiT has "
                     f"placed its blocks already and a full copy would not fit the plan. Remove that node: "
                     f"{INSTEAD}.")


def check_home_device(model, home: str) -> None:
    """When sampling starts: the sharded main must still load on the plan's home device."""
    if str(model.load_device) != str(home):
        raise InputError(f"the sharded MODEL's load device was changed to {model.load_device} (e.g. by "
                         f"{SELECT}), but ShardDiT planned its home on {home}. Remove that node, or put it before "
                         "ShardDiT's node and choose the GPUs in ShardDiT's devices input.")


def note_incoming_device(model, home: str) -> None:
    """Say when ShardDiT's plan replaces the MODEL's own load device."""
    import comfy.model_management as mm

    if str(model.load_device) not in (str(home), str(mm.get_torch_device())):
        log.info("[ShardDiT] the MODEL's load device %s (e.g. from %s) gives way to ShardDiT's plan: DiT home on %s",
                 model.load_device, SELECT, home)
