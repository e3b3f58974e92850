"""ComfyUI hooks of a sharded MODEL: the wrappers and callbacks ``sharded_model`` attaches, and
the shared state they read. Every function here runs inside ComfyUI's sampling and memory code.
"""
from __future__ import annotations

import functools
import inspect
import logging
import weakref
from dataclasses import dataclass, field
from typing import NamedTuple

import torch

from ....parallel.cost.mode import ModeDecision
from ....parallel.placement.plan_types import Plan
from ....parallel.blocks.routing import BlockLayout, BlockRouter
from ....parallel.blocks.sharding import needs_home_every_block
from ....parallel.sequence.lean import chunk_range, run_in_passes
from ..core.multigpu import check_home_device, check_no_core_copies
from ..core.component_placement import read_loaded

log = logging.getLogger("sharddit")

SHARD_KEY = "sharddit_shards"
ATTACHMENT_KEY = "sharddit"


class ShardRootEntry(NamedTuple):
    """One planned block range: its device, the module holding its blocks, and the template
    patcher every shard patcher of this range is cloned from (they share its weight backup)."""

    device: torch.device
    root: torch.nn.Module  # a sharded_model.ShardRoot
    template: object  # comfy.model_patcher.ModelPatcher


@dataclass
class ShardRuntime:
    """What ShardDiT itself knows about its loads; the only mutable part of a ``ShardState``.

    ``loading``: True while ShardDiT's ``PREPARE_SAMPLING`` wrapper runs ComfyUI's load for a
    patcher of this state. ``loaded_main``: the main patcher that load was for (weak)."""

    loading: bool = False
    loaded_main: weakref.ref | None = None
    lean_pass_batch: int | None = None
    """`sequence` at cfg > 1 whose cond and uncond together do not fit (``memory_report``): a DiT call
    of a larger batch runs as passes of this many samples, each over every rank (``sequence/lean``)."""

    def is_loaded_main(self, patcher) -> bool:
        return self.loaded_main is not None and self.loaded_main() is patcher


@dataclass(frozen=True)
class ShardState:
    """Everything clones of one sharded model share: the plan, the router, proxies and shard roots."""

    plan: Plan
    layout: BlockLayout
    router: BlockRouter
    proxies: dict  # block list path -> nn.ModuleList of proxies
    roots: tuple[ShardRootEntry, ...]
    request_key: tuple[str, float]  # (devices, reserve_vram_gb) as given
    runtime: ShardRuntime = field(default_factory=ShardRuntime, compare=False)
    auto_mode: ModeDecision | None = None  # what parallel=auto means for this plan (decided with it)
    arch_name: str = ""  # architecture family, for messages
    remote: tuple = ()  # ((worker name, device), ...): ranks in worker processes (distributed sequence mode)
    blocks_only: str = ""  # why this model runs in blocks mode only ('' when sequence mode splits it)
    footprint: object = None  # the planner's Footprint (memory_report plans sequence per latent from it)
    block_kinds: tuple = ()  # one ring shape key per block, global order (memory_report.block_kinds)
    sequence_refusal: str = ""  # why an explicit parallel=sequence is refused at load ('' when it has room)

    @property
    def sequence_ready(self) -> bool:
        """Whether sequence mode can run these shards (a sequence engine is attached)."""
        return self.router.engine is not None


def is_sharded(model) -> bool:
    return model.get_attachment(ATTACHMENT_KEY) is not None


def get_shard_state(model) -> ShardState | None:
    return model.get_attachment(ATTACHMENT_KEY)


def get_shard_patchers(model) -> list:
    return model.get_additional_models_with_key(SHARD_KEY)


STATES_ATTR = "_sharddit_states"
"""On a BaseModel: its live shard state by request key (at most one: ``keep_state``)."""


def known_state(model, request_key) -> ShardState | None:
    """The shard state already built for ``request_key`` on ``model``'s weights: the model's own
    (it is sharded so), or the one kept on its BaseModel (None: plan afresh)."""
    own = get_shard_state(model)
    if own is not None and own.request_key == request_key:
        return own
    return model.model.__dict__.get(STATES_ATTR, {}).get(request_key)


def keep_state(base, state: ShardState) -> ShardState:
    """States are kept on the BaseModel so re-sharding the same weights reuses the same shard
    modules: ComfyUI then sees clones (``is_clone``) and never holds two copies of a block. One
    live shard set per weights: the new one regroups the blocks, so the older ones are released."""
    states = base.model.__dict__.setdefault(STATES_ATTR, {})
    for old in states.values():
        release_roots(old)
    states.clear()
    states[state.request_key] = state
    return state


def is_current_state(model) -> bool:
    """Whether ``model``'s shard state is still the live one for its weights (not replaced by a
    re-shard with other devices, whose blocks were then regrouped)."""
    state = get_shard_state(model)
    return state is not None and model.model.__dict__.get(STATES_ATTR, {}).get(state.request_key) is state



def release_roots(state: ShardState) -> None:
    """Restore an older shard set's blocks to their original weights on the offload device."""
    if state.router.engine is not None:  # the engine's rank threads and streamed-weight buffers go too
        state.router.engine.close()
    for entry in state.roots:
        if entry.root.model_loaded_weight_memory > 0 or entry.template.backup:
            entry.template.detach(unpatch_all=True)



def sync_shard_patches(main) -> None:
    """Copy the main patcher's weight patches for block keys onto the shard holding each block."""
    for shard in get_shard_patchers(main):
        keys = shard.model.sharddit_keys
        shard.patches = {k: v[:] for k, v in main.patches.items() if k in keys}
        shard.weight_wrapper_patches = {k: v[:] for k, v in main.weight_wrapper_patches.items() if k in keys}
        shard.patches_uuid = main.patches_uuid
        shard.force_cast_weights = main.force_cast_weights


def prepare_sampling_wrapper(executor, model, *args, **kwargs):
    """Around ComfyUI's load of a sharded model: the unsharded clones give the blocks back, the
    shards get the main's weight patches, and the state knows that ShardDiT itself is loading
    ``model`` (so the detach of its previous main in this load keeps the shards: see
    ``release_shards_on_detach``). Core's multi-GPU nodes that changed the MODEL after ShardDiT
    are refused first, before anything loads (``multigpu``)."""
    check_home_device(model, get_shard_state(model).plan.home_device)
    check_no_core_copies(model)
    _unload_unsharded_clones(model)
    sync_shard_patches(model)
    runtime = get_shard_state(model).runtime
    runtime.loading, runtime.loaded_main = True, weakref.ref(model)
    try:
        return executor(model, *args, **kwargs)
    finally:
        runtime.loading = False


def _unload_unsharded_clones(main) -> None:
    """Fully unload a loaded *unsharded* clone of the same weights (e.g. core KSampler ran on the
    MODEL before it was sharded): its in-place weight patches and "already patched" marks on the
    blocks must be undone before the shards patch those blocks themselves. ``detach`` is what
    ComfyUI's own unload calls; ComfyUI's ``load_models_gpu`` then drops the clone's entry (it
    always drops the loaded clones of a model it loads)."""
    for loaded in read_loaded():
        patcher = loaded.patcher
        if patcher is not main and patcher.is_clone(main) and not is_sharded(patcher):
            log.info("[ShardDiT] unloading the unsharded copy of %s before loading its shards",
                     type(patcher.model).__name__)
            patcher.detach(unpatch_all=True)


def routing_scope_wrapper(state: ShardState, mode: str, executor, *args, **kwargs):
    """One routing scope per DiT forward in ``mode`` (``blocks`` / ``sequence``); a ControlNet-style
    input brings every block output home, and block patches of other packs are chained so that a
    skipped block still comes home."""
    home_all = needs_home_every_block(state.layout, executor.original, args, kwargs)
    args, kwargs = _chain_block_patches(state, executor.original, args, kwargs)
    lean = state.runtime.lean_pass_batch if mode == "sequence" else None
    batch = args[0].shape[0] if args and isinstance(args[0], torch.Tensor) and args[0].dim() else 0
    if lean and batch > lean:
        def one_pass(*a, **k):
            with state.router.forward_scope(return_home_all=home_all, sequence=True):
                return executor(*a, **k)
        return run_in_passes(one_pass, batch, -(-batch // lean), args, kwargs,
                             per_pass=functools.partial(_pass_options, executor.original, batch))
    with state.router.forward_scope(return_home_all=home_all, sequence=mode == "sequence"):
        return executor(*args, **kwargs)


# Per-chunk lists in ComfyUI's ``transformer_options`` (one entry per conditioning chunk of the batch).
_CHUNK_LISTS = ("cond_or_uncond", "uuids")


def _pass_options(forward_fn, batch: int, b0: int, b1: int, args, kwargs):
    """A lean pass's own ``transformer_options``: a copy whose per-chunk lists name only the chunks
    of samples ``[b0, b1)``, so that a patch reading ``cond_or_uncond`` (e.g. a per-cond attention
    tweak) sees this pass's cond or uncond, not both."""
    try:
        bound = inspect.signature(forward_fn).bind_partial(*args, **kwargs)
    except TypeError:
        return args, kwargs
    options = bound.arguments.get("transformer_options")
    if not isinstance(options, dict) or not isinstance(options.get("cond_or_uncond"), list):
        return args, kwargs
    chunks = len(options["cond_or_uncond"])
    c0, c1 = chunk_range(batch, chunks, b0, b1)
    bound.arguments["transformer_options"] = {
        key: value[c0:c1] if key in _CHUNK_LISTS and isinstance(value, list) and len(value) == chunks else value
        for key, value in options.items()}
    return bound.args, bound.kwargs


# ComfyUI's names for the block lists in ``patches_replace["dit"]``, in layout order.
_PATCH_KINDS = ("double_block", "single_block")


def _chain_block_patches(state: ShardState, forward_fn, args, kwargs):
    """Wrap each ``patches_replace["dit"]`` patch (e.g. skip-layer guidance) so its output comes
    home when the block it replaces would have returned home; the patch itself is kept and runs
    first. The per-call ``transformer_options`` is copied, never mutated."""
    try:
        bound = inspect.signature(forward_fn).bind_partial(*args, **kwargs)
    except TypeError:
        return args, kwargs
    options = bound.arguments.get("transformer_options")
    replace = (options or {}).get("patches_replace", {}).get("dit")
    if not replace:
        return args, kwargs
    offsets = _list_offsets(state)
    chained = {}
    for key, patch in replace.items():
        kind, i = key if isinstance(key, tuple) and len(key) == 2 else (None, None)
        if kind in offsets:
            patch = functools.partial(patch_then_home, state.router, offsets[kind] + i, patch)
        chained[key] = patch
    bound.arguments["transformer_options"] = {
        **options, "patches_replace": {**options["patches_replace"], "dit": chained}}
    return bound.args, bound.kwargs


def _list_offsets(state: ShardState) -> dict[str, int]:
    """Global index of block 0 of each block list, keyed by ComfyUI's patch kind."""
    offsets, start = {}, 0
    for kind, path in zip(_PATCH_KINDS, state.layout.block_lists):
        offsets[kind] = start
        start += len(state.proxies[path])
    return offsets


def patch_then_home(router: BlockRouter, global_index: int, patch, args, extra):
    # sequence mode: the patch sees whole tensors (placeholders gathered), as in an unsharded run
    return router.return_home_if_due(global_index, patch(router.materialize(args), extra))


def release_shards_on_detach(main, unpatch_all: bool) -> None:
    """ComfyUI detaches a main patcher: release the shards unless ShardDiT keeps using them.

    ``unpatch_all=True`` is a full unload (``free_memory``, ``unload_all_models``/``POST /free``,
    which only free the default device themselves): every shard's weights leave its GPU too.
    ``unpatch_all=False`` comes from ComfyUI switching between clones of the same weights (or from
    a clone being garbage collected). Decided from ShardDiT's own state, never from ComfyUI's:
    - during ShardDiT's own load of a patcher of this state (an identical prompt "switches" the
      model to itself): the shards stay loaded, nothing reloads;
    - the main ShardDiT loaded last, detached outside that load: a different clone took over (core's
      sampler on the unsharded MODEL, a re-sharded one): the blocks get their original weights back
      and leave the GPUs, and the main is unpatched as a full unload would (``_unpatch_main``), so
      that clone loads and patches them itself;
    - any other clone (e.g. a copy of the MODEL being garbage collected): nothing was loaded by it.
    """
    state = get_shard_state(main)
    if state is None:
        return
    runtime = state.runtime
    if unpatch_all:
        release_roots(state)
    elif not runtime.loading and runtime.is_loaded_main(main):
        release_roots(state)
        _unpatch_main(main)


def _unpatch_main(main) -> None:
    """Undo the main patcher's load on the shared BaseModel, as ``detach(unpatch_all=True)`` does.

    ComfyUI's switch to another clone detaches the main with ``unpatch_all=False`` and the new clone
    then trusts the BaseModel's marks: with the same ``patches_uuid`` (core's sampler on the very
    MODEL ShardDiT sharded: its sharded clone copied the uuid) and weight memory still counted, it
    takes the model as loaded and patched and skips patching, although the shards just gave the
    blocks their original weights back (the LoRA would be lost). Unpatching the main restores its
    own weight backups and the real block lists, and clears those marks, so the new clone loads and
    patches everything itself."""
    main.unpatch_model(main.offload_device, unpatch_weights=True)
