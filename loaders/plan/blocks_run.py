"""The `blocks` run of the dry run at one batch: probe the activation peak on one device, plan the
blocks with it (``block_plan``), simulate that plan (``fake_forward``), and plan once more with the
sharded run's own peak where it needs more than the probe (hops copy the hidden state)."""
from __future__ import annotations

import logging

from ...parallel.units import GiB
from .block_plan import plan_blocks
from .context import SimContext
from .fake_forward import first_blocks_only, run_fake_forward
from .findings import SimulationReport, device_report, usable_bytes

log = logging.getLogger("sharddit")

__all__ = ["simulate_blocks"]


def simulate_blocks(ctx: SimContext, batch: int, batch_given: bool) -> SimulationReport:
    """One batch's report: the plan, every device's weights and peak, the verdict."""
    spec, inventory = ctx.spec, ctx.inventory
    reserve = int(ctx.request.reserve_vram_gb * GiB)
    first = inventory.gpus[0].device if inventory.gpus else "cpu"
    with first_blocks_only(ctx.dit, ctx.layout) as n_blocks:
        headroom = run_fake_forward(ctx, batch, [first] * n_blocks, first)[first][1]
    for _ in range(2):  # the probe's headroom; then, where needed, the sharded run's own peak
        plan, error, block_devices, home = plan_blocks(ctx, headroom)
        measured = run_fake_forward(ctx, batch, block_devices, home)
        devices = [device_report(inventory, d, usable_bytes(inventory, d, reserve), *measured.get(d, (0, 0)),
                                 block_devices, home) for d in dict.fromkeys([home, *block_devices])]
        peak = max(d.peak_activations for d in devices)
        if plan is None or not any(d.shortfall for d in devices) or peak <= headroom:
            break
        headroom = peak
    report = SimulationReport(
        model=spec.name, family=spec.family, dtype=ctx.dtype, size=ctx.size,
        latent_shape=spec.geometry.latent_shape(*ctx.size, batch), batch=batch,
        batch_given=batch_given, experts=spec.experts, inventory=inventory, plan=plan,
        plan_error=error, devices=devices, reserve_vram_gb=ctx.request.reserve_vram_gb,
        home_bytes=ctx.home_bytes)
    log.info("[ShardDiT] simulated %s batch %d: %s", spec.name, batch, "fits" if report.fits else "does not fit")
    return report
