"""Step 2 of a sharding call: decide the mode. The shards of these devices are planned here (or
read from the shard state already built for them), and ``parallel`` is decided against that plan,
so a mode that cannot run is refused before any shard is built or any weight moves."""
from __future__ import annotations

import logging

from ....parallel.blocks.sharding import get_block_list
from ....parallel.cost.mode import ModeDecision, decide_parallel
from ....parallel.placement.planner import plan_placement
from ....parallel.placement.plan_types import Footprint, PlacementRequest
from ....parallel.placement.sizing import compute_block_bytes, compute_non_block_bytes
from ..core.component_placement import current_inventory
from ..models.specs import find_arch_spec, get_arch_spec
from .hooks import known_state
from .memory_report import block_kinds, sequence_refusal
from .step_values import Devices, ModeChoice, ModeFacts, ShardPlan, ShardRequest
from ....parallel.errors import InputError

log = logging.getLogger("sharddit")

__all__ = ["choose_mode", "decide_for_state", "decide_mode", "footprint_of", "plan_shards"]


def decide_mode(request: ShardRequest, where: Devices) -> ModeChoice:
    """The mode for ``request`` on ``where``: decided against the shard state already built for
    these devices (the model's own, or the one cached on its weights), else against a fresh plan."""
    facts = known_state(request.model, where.request_key) or plan_shards(request, where)
    return ModeChoice(request.parallel, choose_mode(facts, request.parallel), facts)


def decide_for_state(state, parallel: str) -> ModeChoice:
    """The mode for a MODEL already sharded (its ``ShardState``) that changes only its mode."""
    return ModeChoice(parallel, choose_mode(state, parallel), state)


def choose_mode(facts: ModeFacts, parallel: str) -> ModeDecision:
    """What ``parallel`` (checked) means for these shards: workers run `sequence`; a model that
    sequence mode does not split runs `blocks`; ``auto`` takes the memory rule's answer."""
    if facts.remote and facts.sequence_ready and parallel in ("auto", "sequence"):
        return ModeDecision("sequence", f"sequence: ranks on workers {', '.join(n for n, _ in facts.remote)}")
    if not facts.sequence_ready and parallel != "blocks":
        return ModeDecision("blocks", f"blocks: {facts.blocks_only}")
    if parallel == "auto":
        return facts.auto_mode
    if parallel == "sequence" and facts.sequence_refusal:
        raise InputError(facts.sequence_refusal)  # at load: before any weight moves
    return decide_parallel(parallel, facts.plan, None, None)


def plan_shards(request: ShardRequest, where: Devices) -> ShardPlan:
    """Where each block goes and what each mode would need (nothing is built or moved)."""
    model = request.model
    dit = model.get_model_object("diffusion_model")
    layout = get_arch_spec(dit)
    block_bytes = tuple(compute_block_bytes(dit, layout))
    footprint = _footprint(block_bytes, compute_non_block_bytes(dit, layout))
    inventory = request.inventory if request.inventory is not None else current_inventory()
    # with workers, each worker rank gets an equal share, kept here in RAM (a `cpu` entry) to send
    placement = PlacementRequest(devices=where.plan.with_worker_shares(),
                                 reserve_vram_gb=where.reserve_vram_gb)
    plan = plan_placement(inventory, footprint, placement)
    blocks = tuple((path, i, b) for path in layout.block_lists for i, b in enumerate(real_blocks(model, dit, path)))
    kinds = block_kinds(zip(blocks, block_bytes, strict=True))
    auto = decide_parallel("auto", plan, footprint, inventory, placement.reserve_bytes, kinds)
    refusal = sequence_refusal(plan, footprint, inventory, placement.reserve_bytes, kinds)
    arch = find_arch_spec(type(dit).__name__)
    token_specs, blocks_only = arch.sequence_specs(dit)
    if token_specs is None and arch.token_specs is not None:  # sequence refused for this model: say why
        log.warning("[ShardDiT] %s", blocks_only)
    if where.remote and token_specs is None:
        raise InputError(f"{blocks_only}; worker devices in {where.devices!r} "
                         "need sequence mode: use this machine's devices only")
    return ShardPlan(layout=layout, plan=plan, footprint=footprint, inventory=inventory, blocks=blocks,
                     block_bytes=block_bytes, block_kinds=kinds, auto_mode=auto, sequence_refusal=refusal,
                     token_specs=token_specs, blocks_only=blocks_only, arch_name=arch.name, remote=where.remote)


def real_blocks(model, dit, path: str):
    """The real block list, even while a sharded clone has its proxies patched into the model
    (clones share ``object_patches_backup``)."""
    backup = model.object_patches_backup.get(f"diffusion_model.{path}")
    return backup if backup is not None else get_block_list(dit, path)


def footprint_of(dit, layout) -> Footprint:
    return _footprint(compute_block_bytes(dit, layout), compute_non_block_bytes(dit, layout))


def _footprint(block_bytes, non_block: int) -> Footprint:
    return Footprint(block_bytes=tuple(block_bytes), dit_home_bytes=non_block,
                     dit_activation_bytes=_activation_headroom(block_bytes))


def _activation_headroom(block_bytes) -> int:
    """Activation room planned per DiT device at load time, before any latent is known: a floor.

    Two blocks' worth of weights: for Wan 2.1 14B (0.67 GiB per bf16 block) that is 1.3 GiB, the
    order of one 480p x 81 frame forward (2.9 GiB per device at batch 1, measured on fake GPUs;
    see tests/README.md). The plan is keyed by devices and reserve, not by latent, so it cannot grow
    with the tokens here; where the latent is known (ComfyUI's prepare_sampling) a `sequence` MODEL
    is planned again from its tokens, heads and dtype (``memory_report.latent_plan``): an explicit
    ``sequence`` that does not fit is refused there, and each shard reports its ring to ComfyUI.
    Larger videos in `blocks` mode need ``reserve_vram_gb`` or the ``plan`` dry run.
    """
    return 2 * max(block_bytes, default=0)
