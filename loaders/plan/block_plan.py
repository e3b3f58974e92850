"""The simulator's shared planning: one plan per activation headroom, and where each block goes
(with a forced split when nothing fits, so the report still shows how short each device is).
``dry_run`` (blocks), ``strategies`` (sequence) and ``worker_shares`` all plan here."""
from __future__ import annotations

from ...parallel.placement.plan_types import block_devices_of
from ...parallel.placement.planner import Footprint, PlacementError, plan_placement
from .fake_forward import SimContext
from .findings import fallback_block_ranges

__all__ = ["plan_blocks", "planned_devices"]


def plan_blocks(ctx: SimContext, activation: int):
    """(plan, None), or (None, why) when the blocks do not fit with ``activation`` bytes of
    headroom per device."""
    footprint = Footprint(block_bytes=ctx.block_bytes, dit_home_bytes=ctx.home_bytes,
                          dit_activation_bytes=activation)
    try:
        return plan_placement(ctx.inventory, footprint, ctx.request), None
    except PlacementError as err:
        return None, str(err)


def planned_devices(ctx: SimContext, plan) -> tuple[list[str], str]:
    """Device of each block (global order) and the home device; a forced split when no plan."""
    if plan is not None:
        return list(plan.block_devices()), plan.home_device
    ranges = fallback_block_ranges(ctx.inventory, ctx.request, ctx.block_bytes)
    return list(block_devices_of(ranges)), ranges[0].device
