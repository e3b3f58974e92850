"""The plan's strategy rows: one GPU, `blocks`, `sequence` — peaks simulated, speed predicted.

- ``blocks``: the simulator's usual run (the planner's fewest GPUs, one device computing at a time).
- ``sequence``: blocks planned over every listed GPU (the loader's ``devices`` for this mode), one
  forward with the real engine on fake devices (``fake_sequence``): cond / uncond split
  first at cfg > 1, then tokens; every rank holds its blocks + two streamed blocks per block shape it streams.
- one GPU: every weight on the first GPU with the activations the `blocks` run measured per device
  (both run the whole batch over all tokens).
- core's own options where this ComfyUI has them (``core_baselines``): one GPU with dynamic
  VRAM, core's MultiGPU CFG Split — shown, never picked; the decision line names them when they are
  predicted as fast or faster (``cost/baselines.compare_with_core``).
Speed: ``parallel/cost/model`` (FLOPs / throughput, bytes / link) for the same devices; ``auto``
picks the fastest of ShardDiT's modes that fits (``cost/report.choose_strategy``).
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field, replace

from ...parallel.cost.baselines import compare_with_core
from ...parallel.cost.inputs import (
    DEFAULT_GPU,
    gpu_names,
    table_gpu_name,
)
from ...parallel.placement.devices import DevicePlan
from ...parallel.cost.model import (
    BASELINES,
    STRATEGIES,
    Workload,
    estimate_blocks,
    estimate_one_gpu,
    estimate_sequence,
    estimate_sequence_lean,
    hardware_from_options,
)
from ...parallel.cost.resident import describe_resident, resident_per_rank
from ...parallel.cost.report import DevicePeak, choose_strategy, format_strategy_rows
from ...parallel.cost.mode import prefetch_bytes
from .core_baselines import absent_note, baseline_rows
from .block_plan import plan_blocks
from .findings import device_report, format_table, usable_bytes
from ...parallel.units import format_gib
from ...parallel.errors import InputError, reason_of

log = logging.getLogger("sharddit")

__all__ = ["StrategyReport", "compute_strategies"]

_DEVICE_NOTES = {"blocks": " (the planner's fewest GPUs)",
                 "sequence": " (every listed GPU: give the loader these devices)",
                 "dynamic_vram": " (core, no ShardDiT: one GPU, the weights that do not fit streamed from pinned "
                                 "host RAM every step)",
                 "core_cfg_split": " (core's MultiGPU CFG Split node: a full copy of the DiT on each)"}


@dataclass
class StrategyReport:
    requested: str
    chosen: str | None
    reason: str
    cfg: float
    costs: dict
    peaks: dict
    fits: dict
    sequence_devices: list = field(default_factory=list)
    """``RankMemory`` per rank, with ``usable`` bytes beside it."""
    sequence_reports: list = field(default_factory=list)
    """The same ranks as ``DeviceReport`` (blocks owned, home, prefetch), for the picture."""
    resident: dict = field(default_factory=dict)
    """Per `sequence` device: (blocks it keeps resident, blocks it streams without them) by the room
    left beside the plan (``loaders/comfy/shard/resident_budgets``)."""
    usable: dict = field(default_factory=dict)
    hardware_note: str = ""
    baseline_name: str = "GPU"
    devices: dict = field(default_factory=dict)
    """Strategy -> the devices it runs on."""
    core_note: str = ""
    """Which of core's own options this ComfyUI lacks ('' when it has both)."""
    sequence_note: str = ""
    """Why there is no `sequence` row (a family or class that runs blocks only), '' otherwise."""
    sequence_lean: bool = False
    """The `sequence` row is lean (``sequence/lean``): cond and uncond did not fit together, so they
    run one after the other over every GPU (its peaks are one pass's, its cost two passes')."""

    @property
    def ok(self) -> bool:
        return self.chosen is not None and self.fits.get(self.chosen, False)

    def fitting_core(self) -> str | None:
        """The first of core's own options (``BASELINES``) whose row fits, when no ShardDiT mode does;
        else None. The verdict (``core_fits``) and ``auto``'s line both say it, so they agree with the rows."""
        if self.ok:
            return None
        return next((name for name in BASELINES if self.fits.get(name) and name in self.costs), None)

    def core_fits(self) -> str:
        """``fitting_core`` as a sentence naming its devices and its predicted speed; '' without one."""
        name = self.fitting_core()
        if name is None:
            return ""
        how = _DEVICE_NOTES.get(name, "").strip(" ()")
        return (f"core's own {name} fits these GPUs ({how}; on {','.join(self.devices.get(name, []))}, "
                f"predicted {self.costs[name].speedup:.2f}× vs 1 GPU): run the model with core's nodes "
                "alone, without ShardDiT")

    def to_text(self) -> str:
        batch = "cond + uncond every step (sequence splits them first)" if self.cfg > 1 else "cond only, batch 1"
        lines = [f"Strategies (cfg {self.cfg:g}: {batch}):",
                 format_strategy_rows(self.costs, self.peaks, self.fits, self.baseline_name, self.hardware_note)]
        if self.core_note:
            lines.append(self.core_note)
        if self.sequence_note:
            lines.append(self.sequence_note)
        for name, devs in self.devices.items():
            if name in self.costs:
                lines.append(f"{name} on {','.join(devs)}" + _DEVICE_NOTES.get(name, ""))
        if self.sequence_devices:
            rows = [("device", "weights", "activations", "prefetch", "total", "usable")]
            for p in self.sequence_devices:
                u = self.usable.get(p.device)
                rows.append((p.device, format_gib(p.weights), format_gib(p.activations), format_gib(p.prefetch),
                             format_gib(p.total), "-" if u is None else format_gib(u)))
            what = "sequence lean: cond, then uncond, each over every GPU" if self.sequence_lean else "sequence"
            lines += ["", f"Simulated forward ({what}, per device):", format_table(rows, right=(1, 2, 3, 4, 5)),
                      "(GiB)"]
            if self.resident:
                lines.append("resident blocks (room beside the plan; dropped after each run): " + "; ".join(
                    f"{d}: {k} of {n} resident, " + ("nothing streamed" if k == n else f"{n - k} streamed")
                    for d, (k, n) in self.resident.items() if n))
        lines += ["", self.decision_line()]
        return "\n".join(lines)

    def decision_line(self) -> str:
        arrow = "auto → " if self.requested == "auto" else f"{self.requested} (requested) → "
        return f"{arrow}{self.reason}"

    def to_dict(self) -> dict:
        return {"requested": self.requested, "chosen": self.chosen, "reason": self.reason, "cfg": self.cfg,
                "core_note": self.core_note, "sequence_note": self.sequence_note, "sequence_lean": self.sequence_lean,
                "sequence_devices": {p.device: {"weights": p.weights, "activations": p.activations,
                                                "prefetch": p.prefetch, "usable": self.usable.get(p.device),
                                                "resident_blocks": self.resident.get(p.device, (0, 0))[0],
                                                "streamed_blocks": self.resident.get(p.device, (0, 0))[1]}
                                     for p in self.sequence_devices},
                "strategies": {name: {"devices": self.devices.get(name, []), "seconds_per_step": c.seconds_per_step, "speedup": c.speedup,
                                      "streamed_bytes_per_step": c.streamed_bytes,
                                      "fits": self.fits.get(name, False),
                                      "peak": vars(self.peaks[name]) if name in self.peaks else None}
                               for name, c in self.costs.items()}}


def compute_strategies(ctx, report, parallel: str, cfg: float, gpu: str | None, link_gbps) -> StrategyReport:
    """Strategy rows for a finished `blocks` ``report`` (``findings.SimulationReport``)."""
    from ..comfy.models.specs import find_arch_spec
    from .fake_sequence import run_fake_sequence_forward

    inventory = ctx.inventory
    gpus = [g.device for g in inventory.gpus]
    usable = {d.device: d.usable for d in report.devices}
    work = Workload(ctx.shape, *ctx.size, cfg=cfg, weight_bytes=1.0 if ctx.dtype == "fp8" else 2.0)
    blocks_ranks = list(dict.fromkeys(d.device for d in report.devices if d.blocks))
    names = _gpu_names(inventory, gpu)
    peaks, fits, costs = {}, {}, {}

    hw_first = hardware_from_options(names.get(blocks_ranks[0] if blocks_ranks else "", names["*"]), 1,
                                     link_gbps=link_gbps)
    costs["one_gpu"] = estimate_one_gpu(work, hw_first)
    first = gpus[0] if gpus else "cpu"
    whole = sum(ctx.block_bytes) + ctx.home_bytes
    act = max((d.peak_activations for d in report.devices), default=0)
    peaks["one_gpu"] = DevicePeak(whole, act, 0)
    first_usable = usable_bytes(inventory, first, ctx.request.reserve_bytes)
    fits["one_gpu"] = first_usable is None or whole + act <= first_usable
    if len(blocks_ranks) == 1:  # the planner put the whole DiT on one device: that run is the one-GPU row
        only = next(d for d in report.devices if d.blocks)
        peaks["one_gpu"] = DevicePeak(only.weights, only.peak_activations, 0)
        fits["one_gpu"] = report.blocks_fit

    if len(blocks_ranks) > 1:
        hw = hardware_from_options([names.get(d, names["*"]) for d in blocks_ranks], link_gbps=link_gbps)
        owned = [sum(1 for d in report.devices if d.device == r for _ in d.blocks) for r in blocks_ranks]
        costs["blocks"] = estimate_blocks(work, hw, owned)
    worst = max(report.devices, key=lambda d: d.need)
    peaks["blocks"] = DevicePeak(worst.weights, worst.peak_activations, 0)
    fits["blocks"] = report.blocks_fit

    seq, seq_reports, lean_note, speed_note, resident, resident_note = [], [], "", "", {}, ""
    arch = find_arch_spec(type(ctx.dit).__name__)
    seq_specs, blocks_only = arch.sequence_specs(ctx.dit)
    if seq_specs is None and arch.token_specs is not None:
        log.warning("[ShardDiT] %s", blocks_only)
    if len(gpus) > 1 and seq_specs is not None:
        seq_ctx = replace(ctx, request=replace(ctx.request, devices=DevicePlan.of_devices(gpus)))
        # plan as the loader does (two blocks of activation room, before any latent is known); the
        # measured peaks below decide whether it fits
        _, _, block_devices, home = plan_blocks(seq_ctx, prefetch_bytes(ctx.block_bytes))
        ranks = list(dict.fromkeys(block_devices))
        if len(ranks) > 1:
            # a family whose conds ComfyUI never batches (MiniMax H3): cond, then uncond, each split
            apart = work.batch > ctx.family.max_batch
            hw = hardware_from_options([names.get(d, names["*"]) for d in ranks], link_gbps=link_gbps)
            mixed = len(set(hw.flops)) > 1  # the engine weights the shares by speed (loaders/comfy/shard/sequence_shares)
            speeds = hw.flops if mixed else None
            seq = run_fake_sequence_forward(ctx, 1 if apart else work.batch, block_devices, home, speeds)
            for p in seq:
                usable.setdefault(p.device, usable_bytes(inventory, p.device, ctx.request.reserve_bytes))
            # priced with the blocks each rank keeps in the room beside its plan (as the nodes' `auto`)
            kept = _resident_blocks(seq, usable, ctx.block_bytes, block_devices)
            estimate = estimate_sequence_lean if apart else estimate_sequence
            counts = [block_devices.count(r) for r in ranks]
            piped = all(str(r).startswith("cuda") for r in ranks)  # the exchange pipelined between GPUs only
            costs["sequence"] = estimate(work, hw, counts, weighted=mixed, resident=kept, pipelined=piped)
            gain = (estimate(work, hw, counts, resident=kept, pipelined=piped).seconds_per_step
                    / costs["sequence"].seconds_per_step
                    if mixed else 1.0)
            if gain > 1.005:  # a group of several ranks of different speeds (cfg > 1 on 2: one rank per group)
                share = ", ".join(f"{r} {100 * f / sum(hw.flops):.0f}%" for r, f in zip(ranks, hw.flops, strict=True))
                speed_note = f"shares by speed: {share} of the tokens and heads, predicted {gain:.2f}x an even split"
            if apart:
                lean_note = (f"{ctx.family.title}: ComfyUI runs cond and uncond one after the other, so "
                             "each runs over every GPU (weights streamed twice per step)")
            costs["one_gpu"] = estimate_one_gpu(work, hw)
            seq_reports = [device_report(inventory, p.device, usable[p.device], p.weights, p.activations, block_devices, home, p.prefetch) for p in seq]
            fits["sequence"] = _all_fit(seq, usable)
            if not fits["sequence"] and work.batch > 1 and not apart:
                lean = run_fake_sequence_forward(ctx, 1, block_devices, home, speeds)  # one pass: one sample
                if _all_fit(lean, usable):  # lean only where the batched split does not fit
                    worst = max(seq, key=lambda p: p.total - (usable[p.device] or 0))
                    lean_note = (f"lean: cond and uncond together do not fit ({worst.device} "
                                 f"{format_gib(worst.total)} of {format_gib(usable[worst.device])} GiB), so they run "
                                 "one after the other, each over every GPU (weights streamed twice per step)")
                    seq = lean
                    kept = _resident_blocks(seq, usable, ctx.block_bytes, block_devices)
                    costs["sequence"] = estimate_sequence_lean(work, hw, counts, weighted=mixed, resident=kept,
                                                               pipelined=piped)
                    fits["sequence"] = True
                    seq_reports = [device_report(inventory, p.device, usable[p.device], p.weights, p.activations, block_devices, home, p.prefetch) for p in seq]
            top = max(seq, key=lambda p: p.total)
            peaks["sequence"] = DevicePeak(top.weights, top.activations, top.prefetch)
            resident = {p.device: (len(k), sum(1 for d in block_devices if d != p.device))
                        for p, k in zip(seq, kept, strict=True)}
            said = describe_resident(block_devices, [p.device for p in seq], kept)
            resident_note = said if said.startswith("with every block") else ""
    devices = {"one_gpu": [first], "blocks": blocks_ranks, "sequence": [p.device for p in seq]}
    core = baseline_rows(ctx, report, work, names, link_gbps,
                         lambda d: usable_bytes(inventory, d, ctx.request.reserve_bytes))
    for name, row in core.items():
        costs[name], peaks[name], fits[name], devices[name] = row.cost, row.peak, row.fits, list(row.devices)
    costs = _rebase(costs)
    chosen, reason = _choose(parallel, costs, fits)
    if lean_note and chosen == "sequence":
        reason = f"{reason}; {lean_note}"
    if speed_note and chosen == "sequence":
        reason = f"{reason}; {speed_note}"
    if resident_note and chosen == "sequence":
        reason = f"{reason}; {resident_note}"
    if chosen in costs:
        rebased = {k: replace(r, cost=costs[k]) for k, r in core.items()}
        said = compare_with_core(_label(chosen), costs[chosen], rebased)
        reason = f"{reason}; {said}" if said else reason
    hw_note = hardware_from_options(names["*"], 1, link_gbps=link_gbps).note
    if names.get("default"):
        hw_note = f"{DEFAULT_GPU} assumed (no GPU name in the throughput table; pass --gpu NAME): {hw_note}"
    out = StrategyReport(parallel, chosen, reason, cfg, costs, peaks, fits, sequence_devices=seq,
                         sequence_reports=seq_reports, usable=usable, hardware_note=hw_note, resident=resident,
                         baseline_name=names["*"] if gpu else names.get(first, names["*"]), devices=devices,
                         core_note=absent_note(), sequence_lean=bool(lean_note),
                         sequence_note=f"no sequence row: {blocks_only}" if seq_specs is None and len(gpus) > 1 else "")
    if out.fitting_core():
        out.reason = f"{out.reason}; core's own {out.fitting_core()} fits (its row)"
    log.info("[ShardDiT] %s", out.decision_line())
    return out


def _resident_blocks(seq, usable: dict, block_bytes, block_devices) -> tuple:
    """Per rank: the blocks it keeps resident in the room beside its planned total (``usable`` less
    the simulated peak, as ``loaders/comfy/shard/resident_budgets.resident_budgets`` at sampling time), by the
    rule the engine and the cost model share (``cost/resident.kept_blocks``)."""
    budgets = [max(0, (usable.get(p.device) or 0) - p.total) for p in seq]
    return resident_per_rank(block_bytes, block_devices, [p.device for p in seq], budgets)


def _rebase(costs: dict) -> dict:
    """Speed-ups against the one-GPU row (estimates made with different device counts)."""
    base = costs["one_gpu"].seconds_per_step
    return {k: replace(c, speedup=base / c.seconds_per_step) for k, c in costs.items()}


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


def _all_fit(peaks, usable: dict) -> bool:
    return all(usable[p.device] is None or p.total <= usable[p.device] for p in peaks)


def _label(name: str) -> str:
    return "1 GPU" if name == "one_gpu" else name


def _gpu_names(inventory, gpu: str | None) -> dict:
    """Device -> table name; ``"*"``: the name for the note and unknown devices."""
    if gpu:
        given = gpu_names(gpu)  # ValueError names the table
        if len(given) not in (1, len(inventory.gpus)):
            raise InputError(f"--gpu {gpu!r} names {len(given)} GPUs for {len(inventory.gpus)}: give one "
                             "name for all, or one per GPU in order (e.g. 'RTX 5090,RTX 4090')")
        per = given * len(inventory.gpus) if len(given) == 1 else given
        return {"*": given[0], **{g.device: n for g, n in zip(inventory.gpus, per, strict=True)}}
    names = {}
    for g in inventory.gpus:
        names[g.device] = table_gpu_name(g.name) or DEFAULT_GPU
        if names[g.device] != g.name:
            names["default"] = True
    names["*"] = next((names[g.device] for g in inventory.gpus), DEFAULT_GPU)
    if not inventory.gpus:
        names["default"] = True
    return names
