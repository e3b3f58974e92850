"""The plan's strategy rows priced, and one chosen (pure, no torch).

``price_rows`` takes what the dry run measured (which devices each mode uses, what fits) and prices
every row on the same cost model (``model``): one GPU, ``blocks``, ``sequence`` (batched or lean,
shares by speed where the GPUs differ, with the blocks each rank keeps resident) and core ComfyUI's
own options where this ComfyUI has them (``baselines``); speed-ups are against the one-GPU row. It
then picks the row ``parallel`` asks for (``auto``: the fastest of ShardDiT's modes that fits,
``report.choose_strategy``) and says why, naming core's options when they are predicted as fast.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace

from .baselines import CoreSetup, compare_with_core, core_baselines
from .inputs import DEFAULT_GPU, GpuTable
from .model import (
    STRATEGIES,
    Workload,
    estimate_blocks,
    estimate_one_gpu,
    estimate_sequence,
    estimate_sequence_lean,
    hardware_from_options,
)
from .report import choose_strategy
from ..errors import reason_of

__all__ = ["PricedRows", "SequencePricing", "price_rows"]


@dataclass(frozen=True)
class SequencePricing:
    """What the `sequence` row runs, as the dry run measured it."""

    ranks: tuple
    """Its devices, in rank order."""
    counts: tuple
    """Blocks each rank owns."""
    lean: bool
    """Cond and uncond one after the other, each over every rank (``sequence/lean``)."""
    kept: tuple
    """Per rank, the blocks it keeps resident (``resident.resident_per_rank``)."""
    notes: tuple = ()
    """Clauses for the reason when `sequence` is chosen (lean, resident blocks), in order."""

    @property
    def pipelined(self) -> bool:
        """The engine pipelines its exchange between GPUs only."""
        return all(str(r).startswith("cuda") for r in self.ranks)


@dataclass
class PricedRows:
    costs: dict
    """Row -> ``StrategyCost``, speed-ups against the one-GPU row (core's rows included)."""
    fits: dict
    """Row -> whether it fits (core's rows included)."""
    core: dict = field(default_factory=dict)
    """Core's option -> its ``BaselineRow`` (costs as in ``costs``)."""
    chosen: str | None = None
    reason: str = ""
    hardware_note: str = ""


def price_rows(work: Workload, gpus: GpuTable, link_gbps, parallel: str, fits: dict, blocks_ranks, owned,
               seq: SequencePricing | None = None, core: CoreSetup | None = None, core_devices=()) -> PricedRows:
    """Every row priced, and the one ``parallel`` (``auto``, ``blocks``, ``sequence``) picks.

    ``fits``: ShardDiT's rows that were measured (one_gpu, blocks, sequence) -> whether they fit;
    ``blocks_ranks``/``owned``: the `blocks` plan's devices and their block counts; ``seq``: the
    `sequence` row (None: none); ``core``: what core's options would hold on ``core_devices`` (None:
    no core rows)."""
    first = blocks_ranks[0] if blocks_ranks else ""
    costs = {"one_gpu": estimate_one_gpu(work, hardware_from_options(gpus.name(first), 1, link_gbps=link_gbps))}
    if len(blocks_ranks) > 1:
        hw = hardware_from_options([gpus.name(d) for d in blocks_ranks], link_gbps=link_gbps)
        costs["blocks"] = estimate_blocks(work, hw, owned)
    even = None
    if seq is not None:
        hw = hardware_from_options([gpus.name(d) for d in seq.ranks], link_gbps=link_gbps)
        weighted = len(set(hw.flops)) > 1  # the engine weights the shares by speed
        estimate = estimate_sequence_lean if seq.lean else estimate_sequence
        costs["sequence"] = estimate(work, hw, seq.counts, weighted=weighted, resident=seq.kept,
                                     pipelined=seq.pipelined)
        even = estimate(work, hw, seq.counts, resident=seq.kept, pipelined=seq.pipelined) if weighted else None
        costs["one_gpu"] = estimate_one_gpu(work, hw)
    hw_note = hardware_from_options(gpus.shown, 1, link_gbps=link_gbps).note
    if core is not None and core_devices:
        core_hw = hardware_from_options([gpus.name(d) for d in core_devices], link_gbps=link_gbps)
        rows = core_baselines(work, core_hw, core, list(core_devices))
    else:
        rows = {}
    fits = dict(fits)
    for name, row in rows.items():
        costs[name], fits[name] = row.cost, row.fits
    base = costs["one_gpu"].seconds_per_step
    costs = {k: replace(c, speedup=base / c.seconds_per_step) for k, c in costs.items()}
    rows = {k: replace(r, cost=costs[k]) for k, r in rows.items()}
    chosen, reason = _choose(parallel, costs, fits)
    if chosen == "sequence":
        notes = list(seq.notes[:1])  # lean first, then the speed shares, then resident blocks
        gain = even.seconds_per_step / costs["sequence"].seconds_per_step if even is not None else 1.0
        if gain > 1.005:  # a group of several ranks of different speeds (cfg > 1 on 2: one rank per group)
            share = ", ".join(f"{r} {100 * f / sum(hw.flops):.0f}%" for r, f in zip(seq.ranks, hw.flops, strict=True))
            notes.append(f"shares by speed: {share} of the tokens and heads, predicted {gain:.2f}x an even split")
        notes += seq.notes[1:]
        reason = "; ".join([reason, *(n for n in notes if n)])
    if chosen in costs:
        said = compare_with_core(_label(chosen), costs[chosen], rows)
        reason = f"{reason}; {said}" if said else reason
    if gpus.assumed:
        hw_note = f"{DEFAULT_GPU} assumed (no GPU name in the throughput table; pass --gpu NAME): {hw_note}"
    return PricedRows(costs, fits, rows, chosen, reason, hw_note)


def _choose(parallel: str, costs: dict, fits: dict) -> tuple[str | None, str]:
    if parallel == "auto":
        try:
            return choose_strategy(costs, {k: fits.get(k, False) for k in costs})
        except ValueError as err:
            return None, reason_of(err)
    if parallel == "blocks" and "blocks" not in costs:  # the planner put the whole DiT on one device
        return "one_gpu", "blocks: the whole DiT fits on one device, which runs it alone (1 GPU, 1.00×)"
    if parallel not in costs:
        return None, f"{parallel}: needs two or more GPUs holding blocks (and a model sequence mode splits)"
    c = costs[parallel]
    others = "; ".join(f"{_label(k)} {v.speedup:.2f}×" for k, v in costs.items() if k != parallel and k in STRATEGIES)
    tail = "" if fits.get(parallel) else " (does NOT fit)"
    return parallel, f"{parallel}: predicted {c.speedup:.2f}× vs 1 GPU{tail}; {others}"


def _label(name: str) -> str:
    return "1 GPU" if name == "one_gpu" else name
