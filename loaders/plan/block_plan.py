"""The simulator's shared planning: one plan per activation headroom, and where each block goes
(with a forced split when nothing fits, so the report still shows how short each device is).
``blocks_run`` (blocks), ``strategies`` (sequence) and ``worker_shares`` all plan here."""
from __future__ import annotations

from typing import NamedTuple

from ...parallel.placement.plan_types import block_devices_of
from ...parallel.placement.planner import plan_placement
from ...parallel.placement.plan_types import Footprint
from ...parallel.placement.plan_text import PlacementError
from .context import SimContext
from .findings import fallback_block_ranges

__all__ = ["PlannedBlocks", "plan_blocks"]


class PlannedBlocks(NamedTuple):
    plan: object
    """The placement plan; None when the blocks do not fit."""
    error: str | None
    """Why they do not fit (None when they do)."""
    block_devices: list
    """Device of each block (global order): the plan's, or a forced split when there is no plan."""
    home: str


def plan_blocks(ctx: SimContext, activation: int) -> PlannedBlocks:
    """The blocks planned with ``activation`` bytes of headroom per device, and where each goes (a
    forced split by usable memory when nothing fits, so the report still shows how short each is)."""
    footprint = Footprint(block_bytes=ctx.block_bytes, dit_home_bytes=ctx.home_bytes,
                          dit_activation_bytes=activation)
    try:
        plan = plan_placement(ctx.inventory, footprint, ctx.request)
    except PlacementError as err:
        ranges = fallback_block_ranges(ctx.inventory, ctx.request, ctx.block_bytes)
        return PlannedBlocks(None, str(err), list(block_devices_of(ranges)), ranges[0].device)
    return PlannedBlocks(plan, None, list(plan.block_devices()), plan.home_device)
