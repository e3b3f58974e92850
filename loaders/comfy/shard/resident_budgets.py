"""Resident blocks for one sampling run (issue 34, part 1): the ComfyUI side of
``parallel/sequence/stream.BlockStream.keep_resident``.

In `sequence` every GPU streams the blocks it does not own, two at a time. Where a GPU has room, it
keeps them instead: once the models are loaded for a sampling run (``PREPARE_SAMPLING``), each GPU
rank may keep, beyond its own share, as many of the blocks it streams as its free memory allows
after the plan's activations and ring buffers for this latent and the reserve
(``resident_budgets``); a GPU with room for the whole model streams nothing after the first step.
The copies are a cache, not a claim: they are dropped when the sampling run ends
(``OUTER_SAMPLE``), before the VAE or another model needs the memory, and decided again from the
free memory of the next run. ``SHARDDIT_RESIDENT=0`` turns it off.

Mid-run, another model's load asks ComfyUI's manager for room (``free_memory``: per device, each
loaded model's ``LoadedModel.model_unload(memory_to_free)``, which calls the patcher's
``partially_unload`` or ``detach``; the same in 0.3.64 and 0.33). The seam is our own shard
patchers, never ``comfy.model_management``: each loaded shard whose rank keeps copies gives them
back first (``give_back_first``: its ``partially_unload`` and ``detach``, on that instance), and
when they free enough its weights stay loaded. The rank then streams for the rest of the run.
"""
from __future__ import annotations

import logging
import os
import weakref

from ....parallel.units import GiB

__all__ = ["RESIDENT_ENV", "apply_resident_budgets", "drop_resident_wrapper", "give_back_first", "resident_budgets"]

log = logging.getLogger("sharddit")
RESIDENT_ENV = "SHARDDIT_RESIDENT"


def resident_budgets(rows, inventory, reserve_bytes: int, held_ring: dict) -> list[int]:
    """Per rank (``rows``: the plan's ``RankMemory`` for this latent, loaded weights already on
    their GPUs): bytes it may keep = what is available now on its GPU (free, plus what ShardDiT and
    ComfyUI's manager hold and can give) - the planned activations - the ring it has not allocated
    yet (``held_ring``: bytes its ring holds now) - the reserve. CPU ranks and GPUs the inventory
    does not list keep nothing."""
    out = []
    for r in rows:
        info = inventory.get(r.device) if r.device.startswith("cuda") and r.device in inventory.names else None
        if info is None:
            out.append(0)
            continue
        ring_to_come = max(0, r.prefetch - held_ring.get(r.device, 0))
        out.append(max(0, info.free_bytes + info.releasable_bytes - r.activations - ring_to_come - reserve_bytes))
    return out


def apply_resident_budgets(engine, rows, inventory, reserve_bytes: int, shards=()) -> list[int] | None:
    """Set the engine's budgets for this sampling run (None when turned off); logged once per run.
    ``shards``: the loaded shard patchers, one per row: each gives its rank's copies back first
    when ComfyUI asks it for room (``give_back_first``)."""
    if os.environ.get(RESIDENT_ENV, "").strip() == "0":
        return None
    held = {str(s.device): s.held()["device"] for s in engine.streams}
    budgets = resident_budgets(rows, inventory, reserve_bytes, held)
    engine.keep_resident(budgets)
    for shard, r, b in zip(shards, rows, budgets):
        if b:
            give_back_first(shard, engine, r.device)
    if any(budgets):
        log.info("[ShardDiT] resident blocks this run: %s (the rest streams; %s=0 turns this off)",
                 ", ".join(f"{r.device} up to {b / GiB:.1f} GiB" for r, b in zip(rows, budgets, strict=True) if b),
                 RESIDENT_ENV)
    return budgets


def drop_resident_wrapper(engine_of, executor, *args, **kwargs):
    """``OUTER_SAMPLE`` wrapper: after the sampling run (or its failure) the resident copies go."""
    try:
        return executor(*args, **kwargs)
    finally:
        engine = engine_of()
        if engine is not None:
            engine.drop_resident()


_GIVES_BACK = "_sharddit_gives_back_first"


def give_back_first(shard, engine, device: str) -> None:
    """``shard`` (a loaded ModelPatcher) gives back the resident copies of the ranks on ``device``
    before any of its weights when ComfyUI asks it for room; idempotent. Weak references only: the
    patcher and the engine are not kept alive by it."""
    if shard.__dict__.get(_GIVES_BACK) is not None:
        shard.__dict__[_GIVES_BACK] = weakref.ref(engine)
        return
    me, cls = weakref.ref(shard), type(shard)

    def give_back() -> int:
        engine_ref = me().__dict__.get(_GIVES_BACK)
        alive = engine_ref() if engine_ref is not None else None
        freed = alive.drop_resident(device) if alive is not None else 0
        if freed:
            log.info("[ShardDiT] %s: %.2f GiB of resident blocks given back to ComfyUI (another model needs "
                     "room); the rest of this run streams them", device, freed / GiB)
        return freed

    def partially_unload(device_to, memory_to_free=0, *args, **kwargs):
        freed = give_back()
        if freed >= memory_to_free:
            return freed
        return freed + cls.partially_unload(me(), device_to, memory_to_free - freed, *args, **kwargs)

    def detach(*args, **kwargs):
        give_back()
        return cls.detach(me(), *args, **kwargs)

    shard.__dict__[_GIVES_BACK] = weakref.ref(engine)
    shard.partially_unload, shard.detach = partially_unload, detach
