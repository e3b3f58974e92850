"""The plan's "several machines" part: each worker device's share and room, and the network per step.

The host's own devices are simulated as usual (``dry_run.simulate``), planned as the loader plans
a distributed run: ``devices.DevicePlan.with_worker_shares`` adds one ``cpu`` entry per worker (the host keeps
the workers' shares in RAM), so the host's GPUs hold their share only. This module plans that as
the loader does (two blocks of activation room), runs one `sequence` forward on fake devices for
the host's GPU peaks (the workers' ranks stand in on ``cpu``), and adds the worker rows (``parallel/cost/workers``: share, what it must hold, free, fits) and the network per worker and
step from the cost model, at ``--net-gbps``.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from ...parallel.cost.inputs import DEFAULT_GPU, gpu_flops, table_gpu_name
from ...parallel.cost.model import Workload
from ...parallel.distributed.config import WEIGHTS_ENV
from ...parallel.cost.workers import DEFAULT_NET_GBPS, NetworkStep, compute_network_step, compute_worker_needs
from ...parallel.placement.plan_ranges import compute_block_ranges
from .block_plan import plan_as_loaded
from .findings import format_table
from ...parallel.units import format_gib

__all__ = ["WorkerReport", "compute_worker_report"]


@dataclass
class WorkerReport:
    mode: str
    """``SHARDDIT_DIST_WEIGHTS`` asked for: auto, share or all."""
    keep_all: bool
    why: str
    needs: tuple
    """``cost/workers.WorkerNeed`` per worker device, in rank order."""
    network: NetworkStep
    host_ranks: list = field(default_factory=list)
    """The host's own DiT devices (ranks 0..), before the workers."""
    exchange: bool = False
    """Ulysses all-to-alls cross the network (cfg 1, or more ranks than cond/uncond groups)."""
    notes: list = field(default_factory=list)
    host_peaks: list = field(default_factory=list)
    """``RankMemory`` of this machine's GPU ranks in the simulated `sequence` forward."""
    usable: dict = field(default_factory=dict)
    planned: bool = True
    """The planner placed this machine's share (planned as the loader does: two blocks of activation room)."""

    def host_short(self, p) -> int:
        u = self.usable.get(p.device)
        return 0 if u is None else max(0, p.total - u)

    @property
    def ok(self) -> bool:
        return self.planned and all(n.fits for n in self.needs) and not any(self.host_short(p) for p in self.host_peaks)

    def shortfalls(self) -> dict:
        """Device -> bytes missing, this machine's and the workers'."""
        out = {p.device: self.host_short(p) for p in self.host_peaks if self.host_short(p)}
        return out | {f"{n.name}/{n.device}": n.short_bytes for n in self.needs if not n.fits}

    def host_text(self) -> str:
        rows = [("device", "weights", "activations", "prefetch", "total", "usable", "verdict")]
        for p in self.host_peaks:
            u, short = self.usable.get(p.device), self.host_short(p)
            rows.append((p.device, format_gib(p.weights), format_gib(p.activations), format_gib(p.prefetch),
                         format_gib(p.total), "-" if u is None else format_gib(u),
                         f"SHORT {format_gib(short)} GiB" if short else "ok"))
        return "\n".join(["Simulated forward (sequence, this machine's devices; the workers' ranks stand in on cpu):",
                          format_table(rows, right=(1, 2, 3, 4, 5)), "(GiB)"])

    def to_text(self) -> str:
        rows = [("worker device", "blocks", "share", "must hold", "free", "verdict")]
        for n in self.needs:
            free = "-" if n.free_bytes is None else format_gib(n.free_bytes)
            verdict = ("ok" if n.free_bytes is not None else "unknown free (not checked)") if n.fits \
                else f"SHORT {format_gib(n.short_bytes)} GiB"
            rows.append((f"{n.name}/{n.device}", f"{n.start}-{n.stop - 1}", format_gib(n.share_bytes),
                         format_gib(n.need_bytes), free, verdict))
        net = self.network
        what = " + ".join((["blocks it does not own"] if not self.keep_all else []) + (["Ulysses exchanges"] if
                          self.exchange else []) + ["hidden-state scatter"])
        head = (f"Several machines (sequence over {len(self.host_ranks)} host device(s) {','.join(self.host_ranks)} "
                f"+ {len(self.needs)} worker device(s)):")
        lines = [self.host_text(), "", head, f"{WEIGHTS_ENV} {self.why}",
                 format_table(rows, right=(2, 3, 4)),
                 f"(GiB; must hold: {self.needs[0].what})" if self.needs else "(GiB)"]
        lines += [f"- {note}" for note in self.notes]
        lines += [(f"Network per worker and step: {net.bytes_per_worker / 1e9:.1f} GB ({what}; cost model) = "
                   f"{net.seconds:.1f} s at {net.net_gbps:g} Gbit/s"),
                  net.verdict]
        return "\n".join(lines)

    def to_dict(self) -> dict:
        net = self.network
        return {"dist_weights": self.mode, "keep_all": self.keep_all, "why": self.why, "host_devices": self.host_ranks,
                "exchange": self.exchange,
                "host": {p.device: {"weights": p.weights, "activations": p.activations, "prefetch": p.prefetch,
                                    "usable": self.usable.get(p.device), "short_bytes": self.host_short(p)}
                         for p in self.host_peaks},
                "devices": {f"{n.name}/{n.device}": {"blocks": [n.start, n.stop - 1], "share_bytes": n.share_bytes,
                                                     "need_bytes": n.need_bytes, "free_bytes": n.free_bytes,
                                                     "short_bytes": n.short_bytes, "fits": n.fits}
                            for n in self.needs},
                "network": {"bytes_per_worker": net.bytes_per_worker, "seconds": net.seconds, "net_gbps": net.net_gbps,
                            "compute_s": net.compute_s, "step_s": net.step_s, "wait_s": net.wait_s, "bound": net.bound,
                            "verdict": net.verdict},
                "fits": self.ok}


def compute_worker_report(ctx, report, workers, mode: str, cfg: float, gpu: str | None, net_gbps) -> WorkerReport:
    """Worker rows and network for a finished host ``report`` planned with one ``cpu`` entry per worker."""
    entries = ctx.request.devices.entries
    n_local = len(entries) - len(workers)
    # planned as the loader plans (two blocks of activation room); the sequence peaks decide whether it fits
    planned = plan_as_loaded(ctx)
    plan = planned.plan
    ranges = _rank_ranges(plan, entries, ctx.block_bytes)
    keep_all, why, needs = compute_worker_needs(mode, workers, ranges[n_local:], ctx.block_bytes)
    work = Workload(ctx.shape, *ctx.size, cfg=cfg, weight_bytes=1.0 if ctx.dtype == "fp8" else 2.0)
    host = [e.device for e in entries[:n_local]]
    names = [gpu or _table_name(ctx.inventory, d) for d in host] + [gpu or DEFAULT_GPU] * len(workers)
    flops = [gpu_flops(name) for name in names]
    network = compute_network_step(work, flops, [b - a for a, b in ranges], keep_all,
                                   DEFAULT_NET_GBPS if net_gbps is None else net_gbps)
    notes = [f"compute: {', '.join(dict.fromkeys(names))} throughput per rank"
             + ("" if gpu else f" ({DEFAULT_GPU} assumed where the name is unknown; pass --gpu NAME)")]
    exchange = cfg <= 1 or len(entries) > 2  # cfg > 1: cond / uncond split first; a group of one rank exchanges nothing
    if any(n.free_bytes is None for n in needs):
        notes.append("free memory unknown for some worker devices: give it as NAME/DEVICE=24GiB or --workers HOST:PORT")
    peaks, usable = _host_peaks(ctx, report, planned, work.batch)
    if len(workers) > 1:
        notes.append("the host's sequence peaks are simulated with every worker's rank on one cpu stand-in "
                     "(fewer ranks: a larger share of tokens per rank, so an upper bound)")
    return WorkerReport(mode, keep_all, why, needs, network, host, exchange, notes, peaks, usable, plan is not None)


def _host_peaks(ctx, report, planned, batch: int):
    """(``RankMemory`` per GPU rank of this machine, usable bytes per device) from one `sequence`
    forward on fake devices over the plan (the workers' shares on cpu run there as stand-ins)."""
    from .fake_sequence import run_fake_sequence_forward

    peaks = run_fake_sequence_forward(ctx, batch, planned.block_devices, planned.home)
    usable = {d.device: d.usable for d in report.devices}
    return [p for p in peaks if p.device != "cpu"], usable


def _rank_ranges(plan, entries, block_bytes) -> list[tuple[int, int]]:
    """(start, stop) per device entry: the plan's, else the equal shares the planner aims at."""
    if plan is not None and len(plan.block_ranges) == len(entries):
        return [(r.start, r.stop) for r in plan.block_ranges]
    shares = [e.weight if e.weight is not None else 1.0 for e in entries]
    return list(compute_block_ranges(block_bytes, shares))


def _table_name(inventory, device: str) -> str:
    info = inventory.get(device) if device in inventory.names else None
    return (table_gpu_name(info.name) if info else None) or DEFAULT_GPU
