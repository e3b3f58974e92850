"""The simulator's shared planning: one plan per activation headroom, and where each block goes
(with a forced split when nothing fits, so the report still shows how short each device is).
``blocks_run`` (blocks), ``strategies`` (sequence) and ``worker_shares`` all plan here."""
from __future__ import annotations

from typing import NamedTuple

from ...parallel.cost.mode import prefetch_bytes
from ...parallel.placement.plan_ranges import compute_block_ranges
from ...parallel.placement.plan_text import PlacementError
from ...parallel.placement.plan_types import BlockRange, Footprint, block_devices_of
from ...parallel.placement.planner import plan_placement
from ...parallel.units import GiB
from .context import SimContext

__all__ = ["PlannedBlocks", "fallback_block_ranges", "plan_as_loaded", "plan_blocks"]


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


def plan_as_loaded(ctx: SimContext) -> PlannedBlocks:
    """The blocks planned as the loader plans them for `sequence`: with room for two streamed blocks
    of each shape (``cost/mode.prefetch_bytes``), before any latent is known."""
    return plan_blocks(ctx, prefetch_bytes(ctx.block_bytes))


def fallback_block_ranges(inventory, request, block_bytes) -> list:
    """Where to put the blocks when the planner finds no placement, so the shortfall per device
    can still be measured: the requested devices (``auto``: every GPU) split by usable memory."""
    entries = request.devices.entries
    devices = [e.device for e in entries] or [g.device for g in inventory.gpus] or ["cpu"]
    caps = []
    for dev in devices:
        info = inventory.get(dev) if dev in inventory.names else None
        caps.append(max(1, (info.available_bytes if info else GiB) - request.reserve_bytes))
    ranges = compute_block_ranges(block_bytes, caps) or [(0, len(block_bytes))]
    return [BlockRange(dev, a, b) for dev, (a, b) in zip(devices, ranges) if b > a]
