"""Dry-run simulator: will this model fit these GPUs at this size? Answered on a CPU, no weights.

``simulate`` builds ComfyUI's own model class on ``meta`` (``context.build_meta_model``), sizes it
with ``parallel/placement/sizing``, plans with ``parallel/placement/planner``, puts every block on its planned fake
device with the pack's own engine (``parallel/blocks/sharding.attach_block_sharding``), and runs ONE
forward under ``FakeTensorMode`` + ``no_grad`` (reference figure: tests/README.md). Attention runs as an
output-only stand-in (flash / memory-efficient semantics) while simulating (``fake_forward``).

The stages, each in its own module, in order: ``setup.check_simulation`` (what was asked, checked
and settled), ``context.build_context`` (the meta DiT and its sizes), ``blocks_run.simulate_blocks``
(per batch), ``strategies.compute_strategies`` or ``worker_shares.compute_worker_report``, then
``text_encoders.place_text_encoder``.

Without ``batch``: cond+uncond in one batch of 2 when that fits, else one after the other (batch
1), which is what ComfyUI's ``calc_cond_batch`` does when memory is short.
"""
from __future__ import annotations

import time

from ...parallel.placement.inventory import Inventory
from ...parallel.placement.plan_types import DEFAULT_DEVICES, DEFAULT_RESERVE_VRAM_GB
from ...parallel.errors import InputError
from .blocks_run import simulate_blocks
from .context import SimContext, build_context
from .findings import SimulationReport
from .setup import SimulationSetup, check_simulation
from .strategies import compute_strategies
from .text_encoders import place_text_encoder
from .worker_shares import compute_worker_report

__all__ = ["context_of", "run_simulation", "simulate"]


def simulate(model, devices: str = DEFAULT_DEVICES, width: int = 832, height: int = 480, frames: int = 81,
             batch: int | None = None, dtype: str | None = "bf16", reserve_vram_gb: float = DEFAULT_RESERVE_VRAM_GB,
             inventory: Inventory | None = None, parallel: str | None = None, cfg: float | None = None,
             gpu: str | None = None, link_gbps=None, workers=(), dist_weights: str = "auto",
             net_gbps=None) -> SimulationReport:
    """Simulate one DiT forward on the planned devices; per-device weights, peak and verdict.

    ``model``: a preset name, a ``.safetensors`` path or a ``presets.ModelSpec``.
    ``devices``: an inventory spec (``"cuda:0=24GiB,cuda:1=24GiB"``, planned ``auto`` over it),
    ``"auto"`` (this machine's GPUs, read now) or a device list (``"cuda:0,cuda:1"``).
    ``batch``: 1, 2 (cond+uncond) or None (2 if it fits, else 1). ``dtype``: bf16, fp16 or fp8
    (1-byte weights, bf16 compute); None for a file's own dtype.
    ``parallel`` (``auto``, ``blocks``, ``sequence``): also simulate `sequence` and predict the speed
    of each strategy (``strategies``) at guidance ``cfg`` (1: batch 1; > 1: cond+uncond;
    default ``DEFAULT_CFG``) on ``gpu`` (throughput table name; default the inventory's names) over
    a ``link_gbps`` link (default PCIe 4.0 without P2P); ``report.fits`` is then the chosen one's.
    ``workers``: (name, device, free bytes or None) of worker devices (distributed `sequence`): the
    host's ``devices`` are planned with the workers' equal shares kept in RAM, and ``report.workers``
    (``worker_shares``) says what each worker must hold under ``dist_weights`` and what crosses
    the network per step at ``net_gbps`` Gbit/s; ``report.fits`` then also needs every worker to fit.
    """
    setup = check_simulation(model, devices, width, height, frames, batch, dtype, reserve_vram_gb, inventory,
                             parallel, cfg, gpu, link_gbps, len(workers))
    return run_simulation(setup, gpu, link_gbps, workers, dist_weights, net_gbps)


def run_simulation(setup: SimulationSetup, gpu: str | None = None, link_gbps=None, workers=(),
                   dist_weights: str = "auto", net_gbps=None) -> SimulationReport:
    """The simulation ``check_simulation`` checked (``workers``: as many as it was told)."""
    if len(workers) != setup.n_workers:
        raise InputError(f"{len(workers)} worker devices given, {setup.n_workers} checked")
    started = time.monotonic()
    ctx = context_of(setup)
    report = rejected = None
    for b in ([setup.batch] if setup.batch else [2, 1]):
        rejected, report = report, simulate_blocks(ctx, b, batch_given=bool(setup.batch))
        if report.fits:
            break
    if rejected is not None:
        report.rejected = rejected.summarize_needs()
    if setup.parallel is not None:
        report.strategies = compute_strategies(ctx, report, setup.parallel, setup.cfg, link_gbps)
    if workers:
        report.workers = compute_worker_report(ctx, report, workers, dist_weights, setup.cfg, gpu, net_gbps)
    report.text_encoder = _text_encoder(ctx, report)
    report.size_note = setup.size_note
    report.seconds = time.monotonic() - started
    return report


def context_of(setup: SimulationSetup) -> SimContext:
    """The meta DiT and everything its fake forwards share, as ``setup`` settled it."""
    return build_context(setup.spec, setup.size, setup.dtype, setup.dtypes, setup.family, setup.shape,
                         setup.inventory, setup.request, setup.gpus, setup.usable, setup.every_gpu)


def _text_encoder(ctx: SimContext, report: SimulationReport):
    """The model's text encoder, placed beside the DiT of the chosen strategy (``sequence``: every GPU
    it runs on; else the blocks plan's devices, home first) as ShardDiT's text encoder loader would."""
    st = report.strategies
    if st is not None and st.chosen == "sequence":
        devices = list(st.devices.get("sequence", []))
    elif report.plan is not None:
        devices = list(dict.fromkeys([report.plan.home_device, *report.plan.dit_devices]))
    else:
        devices = []
    activation = max((d.peak_activations for d in report.devices), default=0)
    return place_text_encoder(ctx.spec, ctx.family, ctx.inventory, ctx.request, ctx.block_bytes, ctx.home_bytes,
                              activation, devices, ctx.gpus.flops)
