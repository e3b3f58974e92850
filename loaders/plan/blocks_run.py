"""The `blocks` run of the dry run at one batch: probe the activation peak on one device, plan the
blocks with it (``block_plan``), simulate that plan (``fake_forward``), and plan once more with the
sharded run's own peak where it needs more than the probe (hops copy the hidden state)."""
from __future__ import annotations

import logging

from .block_plan import plan_blocks
from .context import SimContext
from .fake_forward import run_fake_forward
from .findings import SimulationReport, device_report

log = logging.getLogger("sharddit")

__all__ = ["simulate_blocks"]


def simulate_blocks(ctx: SimContext, batch: int, batch_given: bool) -> SimulationReport:
    """One batch's report: the plan, every device's weights and peak, the verdict."""
    spec, inventory = ctx.spec, ctx.inventory
    first = inventory.gpus[0].device if inventory.gpus else "cpu"
    headroom, plan, error, block_devices, home = None, None, None, None, first
    for _ in range(3):  # the probe; the plan with its headroom; where needed, with the sharded run's own peak
        if headroom is not None:
            plan, error, block_devices, home = plan_blocks(ctx, headroom)
        measured, _ = run_fake_forward(ctx, batch, block_devices, home, first_only=headroom is None)
        if headroom is None:
            headroom = measured[first].peak_activations
            continue
        devices = [device_report(inventory, d, ctx.usable.get(d), *_memory(measured, d),
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


def _memory(measured: dict, device: str) -> tuple[int, int]:
    m = measured.get(device)
    return (m.weights, m.peak_activations) if m else (0, 0)
