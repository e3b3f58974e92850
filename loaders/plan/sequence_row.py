"""The `sequence` row's memory: what every GPU holds when they all run every block.

The blocks are planned over every listed GPU as the loader plans them (``block_plan.plan_as_loaded``);
one forward runs with the real engine on fake devices (``fake_sequence``): cond + uncond together,
split first; where they do not fit together (or the family never batches them, MiniMax H3) one
after the other, each over every GPU (lean). Each rank keeps resident the blocks it streams that fit
the room left beside its peak (``cost/resident``, as the nodes' ``auto`` does at sampling time).
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from ...parallel.cost.resident import describe_resident, resident_per_rank
from ...parallel.cost.rows import SequencePricing
from ...parallel.units import format_gib
from .block_plan import plan_as_loaded
from .context import SimContext
from .fake_sequence import run_fake_sequence_forward
from .findings import device_report

__all__ = ["SequenceRun", "simulate_sequence"]


@dataclass
class SequenceRun:
    block_devices: list
    home: str
    peaks: list
    """``RankMemory`` per rank, in rank order."""
    reports: list
    """The same ranks as ``DeviceReport`` (blocks owned, home, prefetch), for the picture."""
    fits: bool
    pricing: SequencePricing
    """What the cost model prices (``cost/rows``)."""

    @property
    def resident(self) -> dict:
        """Per rank: (blocks it keeps resident, blocks it streams without them)."""
        return {p.device: (len(k), sum(1 for d in self.block_devices if d != p.device))
                for p, k in zip(self.peaks, self.pricing.kept, strict=True)}


def simulate_sequence(ctx: SimContext, batch: int) -> SequenceRun | None:
    """The `sequence` row's run at ``batch`` (the workload's: 2 at cfg > 1); None where the plan
    over every GPU puts the blocks on fewer than two."""
    seq_ctx = replace(ctx, request=replace(ctx.request, devices=ctx.every_gpu))
    planned = plan_as_loaded(seq_ctx)  # the measured peaks below decide whether it fits
    block_devices, home = planned.block_devices, planned.home
    ranks = list(dict.fromkeys(block_devices))
    if len(ranks) < 2:
        return None
    apart = batch > ctx.family.max_batch  # a family whose conds ComfyUI never batches (MiniMax H3)
    flops = [ctx.gpus.flops[r] for r in ranks]
    speeds = flops if len(set(flops)) > 1 else None  # the engine shares by speed (loaders/comfy/shard/sequence_shares)
    usable = ctx.usable
    runs = []
    for b in ([1] if apart or batch == 1 else [batch, 1]):  # lean (batch 1) only where the batched split does not fit
        peaks = run_fake_sequence_forward(ctx, b, block_devices, home, speeds)
        runs.append((peaks, all(usable.get(p.device) is None or p.total <= usable[p.device] for p in peaks)))
        if runs[-1][1]:
            break
    (peaks, fits), lean_note = runs[0], ""
    if apart:
        lean_note = (f"{ctx.family.title}: ComfyUI runs cond and uncond one after the other, so "
                     "each runs over every GPU (weights streamed twice per step)")
    elif len(runs) == 2 and runs[1][1]:
        worst = max(peaks, key=lambda p: p.total - (usable.get(p.device) or 0))
        lean_note = (f"lean: cond and uncond together do not fit ({worst.device} "
                     f"{format_gib(worst.total)} of {format_gib(usable[worst.device])} GiB), so they run "
                     "one after the other, each over every GPU (weights streamed twice per step)")
        peaks, fits = runs[1]
    # priced with the blocks each rank keeps in the room beside its plan (as the nodes' `auto`)
    budgets = [max(0, (usable.get(p.device) or 0) - p.total) for p in peaks]
    kept = resident_per_rank(ctx.block_bytes, block_devices, [p.device for p in peaks], budgets)
    said = describe_resident(block_devices, [p.device for p in peaks], kept)
    reports = [device_report(ctx.inventory, p.device, usable.get(p.device), p.weights, p.activations, block_devices,
                             home, p.prefetch) for p in peaks]
    pricing = SequencePricing(tuple(ranks), tuple(block_devices.count(r) for r in ranks), bool(lean_note), kept,
                              (lean_note, said if said.startswith("with every block") else ""))
    return SequenceRun(block_devices, home, peaks, reports, fits, pricing)
