"""The values that pass between the four steps of one sharding call (``pipeline``).

resolve devices (``which_devices``) -> decide the mode (``mode_decision``) -> get or build the shards
(``sharded_model``) -> attach the mode (``attach_mode``). Each step takes the values of the steps
before it and returns one of these; none calls back into the pipeline or into a later step.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from ....parallel.cost.mode import ModeDecision
from ....parallel.placement.devices import DevicePlan
from ....parallel.placement.inventory import Inventory
from ....parallel.placement.plan_types import Plan

__all__ = ["Devices", "ModeChoice", "ModeFacts", "ShardPlan", "ShardRequest", "Shards"]


@dataclass(frozen=True)
class ShardRequest:
    """What the caller asked for: shard ``model`` (a ComfyUI ModelPatcher, never mutated) over
    ``devices`` keeping ``reserve_vram_gb`` free per GPU, and run it in ``parallel`` (checked)."""

    model: object
    devices: DevicePlan  # the node's input, parsed once (parse_device_plan)
    reserve_vram_gb: float
    parallel: str  # auto | blocks | sequence
    inventory: Inventory | None = None  # None: this machine's, read when planning


@dataclass(frozen=True)
class Devices:
    """Step 1: ``devices`` with ``auto`` resolved, split into this machine's and the workers'."""

    plan: DevicePlan  # as resolved: this machine's devices and the workers' members, checked
    reserve_vram_gb: float

    @property
    def devices(self) -> str:
        """The resolved devices as text (messages quote it)."""
        return self.plan.text

    @property
    def local(self) -> str:
        """This machine's part, as text (the log quotes it)."""
        return self.plan.local

    @property
    def remote(self) -> tuple:
        """((worker name, device), ...), checked: each joined and listed once."""
        return self.plan.members

    @property
    def request_key(self) -> tuple[str, float]:
        """What a shard set is cached by: the same devices and reserve get the same shards."""
        return (self.devices.strip(), self.reserve_vram_gb)


class ModeFacts(Protocol):
    """What deciding a mode reads: a fresh ``ShardPlan`` and a built ``ShardState`` both have it."""

    plan: Plan
    remote: tuple
    blocks_only: str  # why this model runs in blocks mode only ('' when sequence mode splits it)
    auto_mode: ModeDecision | None  # the memory rule's answer for parallel=auto
    sequence_refusal: str  # why an explicit parallel=sequence does not fit ('' when it does)

    @property
    def sequence_ready(self) -> bool: ...


@dataclass(frozen=True)
class ShardPlan:
    """Step 2's plan, made before any shard exists: where each block goes and what each mode means."""

    layout: object  # blocks.routing.BlockLayout
    plan: Plan
    footprint: object  # placement.plan_types.Footprint
    inventory: Inventory
    blocks: tuple  # ((block list path, index, real block), ...) in global order
    block_bytes: tuple
    block_kinds: tuple
    auto_mode: ModeDecision
    sequence_refusal: str
    token_specs: tuple | None  # None: sequence mode does not split this model
    blocks_only: str
    arch_name: str
    remote: tuple

    @property
    def sequence_ready(self) -> bool:
        return self.token_specs is not None


@dataclass(frozen=True)
class ModeChoice:
    """Step 2's answer: the mode for ``requested`` and what it was decided from (a fresh plan to
    build, or the shard state already built for these devices)."""

    requested: str
    decision: ModeDecision
    facts: ModeFacts


@dataclass(frozen=True)
class Shards:
    """Step 3's answer: the sharded clone and the state its shards share."""

    model: object  # ComfyUI ModelPatcher
    state: object  # shard_hooks.ShardState
