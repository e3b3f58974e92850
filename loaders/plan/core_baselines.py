"""The plan's rows for core ComfyUI's own options on the same GPUs, where this ComfyUI has them:
one GPU with dynamic VRAM and core's MultiGPU CFG Split (``parallel/cost/baselines``).

Memory comes from the simulated `blocks` run: the whole DiT as measured (a full copy), and one
sample's peak activations (the run's peak over its batch: activations grow with the batch, 2.9 ->
5.7 GiB for Wan 14B at 480p). Speed from the same cost model as ShardDiT's rows.
"""
from __future__ import annotations

from ...parallel.cost.baselines import CoreSetup
from ..comfy.core.features import (
    NONE_HERE,
    core_cfg_split_available,
    dynamic_vram_available,
    dynamic_vram_condition,
)

__all__ = ["absent_note", "core_setup"]


def core_setup(ctx, report) -> CoreSetup | None:
    """What core's options would hold on the inventory's GPUs (None without GPUs)."""
    gpus = [g.device for g in ctx.inventory.gpus]
    if not gpus:
        return None
    act = max((d.peak_activations for d in report.devices), default=0)
    return CoreSetup(dit_bytes=sum(ctx.block_bytes) + ctx.home_bytes, home_bytes=ctx.home_bytes,
                     activation_per_sample=act // max(1, report.batch), usable=tuple(ctx.usable.get(g) for g in gpus),
                     cfg_split=core_cfg_split_available(), dynamic_vram=dynamic_vram_available(),
                     dynamic_condition=dynamic_vram_condition())


def absent_note() -> str:
    """A line for the plan when this ComfyUI lacks one or both of core's options ('' when it has both)."""
    cfg, dyn = core_cfg_split_available(), dynamic_vram_available()
    if cfg and dyn:
        return ""
    if not cfg and not dyn:
        return NONE_HERE
    missing = "core's MultiGPU CFG Split (0.23+)" if not cfg else "dynamic VRAM (0.16+)"
    return f"core's own options: {missing} is not in this ComfyUI"
