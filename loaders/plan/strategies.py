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
from dataclasses import dataclass, field

from ...parallel.cost.model import BASELINES, Workload
from ...parallel.cost.report import DevicePeak, format_strategy_rows
from ...parallel.cost.rows import price_rows
from ...parallel.units import format_gib
from .core_baselines import absent_note, core_setup
from .findings import format_table
from .sequence_row import simulate_sequence

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


def compute_strategies(ctx, report, parallel: str, cfg: float, link_gbps) -> StrategyReport:
    """Strategy rows for a finished `blocks` ``report`` (``findings.SimulationReport``): the memory
    each mode needs, as simulated, then every row priced and one chosen (``cost/rows.price_rows``)."""
    gpus = [g.device for g in ctx.inventory.gpus]
    work = Workload(ctx.shape, *ctx.size, cfg=cfg, weight_bytes=1.0 if ctx.dtype == "fp8" else 2.0)
    blocks_ranks = list(dict.fromkeys(d.device for d in report.devices if d.blocks))
    first = gpus[0] if gpus else "cpu"
    whole, act = sum(ctx.block_bytes) + ctx.home_bytes, max((d.peak_activations for d in report.devices), default=0)
    first_usable = ctx.usable.get(first)
    peaks = {"one_gpu": DevicePeak(whole, act, 0)}
    fits = {"one_gpu": first_usable is None or whole + act <= first_usable}
    if len(blocks_ranks) == 1:  # the planner put the whole DiT on one device: that run is the one-GPU row
        only = next(d for d in report.devices if d.blocks)
        peaks["one_gpu"], fits["one_gpu"] = DevicePeak(only.weights, only.peak_activations, 0), report.blocks_fit
    worst = max(report.devices, key=lambda d: d.need)
    peaks["blocks"], fits["blocks"] = DevicePeak(worst.weights, worst.peak_activations, 0), report.blocks_fit
    owned = [sum(len(d.blocks) for d in report.devices if d.device == r) for r in blocks_ranks]

    seq_specs, blocks_only = ctx.sequence
    if seq_specs is None and ctx.arch.token_specs is not None:
        log.warning("[ShardDiT] %s", blocks_only)
    seq = simulate_sequence(ctx, work.batch) if len(gpus) > 1 and seq_specs is not None else None
    if seq is not None:
        top = max(seq.peaks, key=lambda p: p.total)
        peaks["sequence"], fits["sequence"] = DevicePeak(top.weights, top.activations, top.prefetch), seq.fits
    priced = price_rows(work, ctx.gpus, link_gbps, parallel, fits, blocks_ranks, owned,
                        seq.pricing if seq is not None else None, core_setup(ctx, report), gpus)
    devices = {"one_gpu": [first], "blocks": blocks_ranks, "sequence": [p.device for p in seq.peaks] if seq else []}
    for name, row in priced.core.items():
        peaks[name], devices[name] = row.peak, list(row.devices)
    out = StrategyReport(parallel, priced.chosen, priced.reason, cfg, priced.costs, peaks, priced.fits,
                         sequence_devices=seq.peaks if seq else [], sequence_reports=seq.reports if seq else [],
                         usable=dict(ctx.usable), hardware_note=priced.hardware_note,
                         resident=seq.resident if seq else {},
                         baseline_name=ctx.gpus.shown if ctx.gpus.given else ctx.gpus.name(first), devices=devices,
                         core_note=absent_note(), sequence_lean=bool(seq and seq.pricing.lean),
                         sequence_note=f"no sequence row: {blocks_only}" if seq_specs is None and len(gpus) > 1 else "")
    if out.fitting_core():
        out.reason = f"{out.reason}; core's own {out.fitting_core()} fits (its row)"
    log.info("[ShardDiT] %s", out.decision_line())
    return out
