"""ComfyUI hooks of a sharded MODEL: the wrappers and callbacks ``sharded_model`` attaches, and
the shared state they read. Every function here runs inside ComfyUI's sampling and memory code.
"""
from __future__ import annotations

import functools
import inspect
import logging
import sys
from dataclasses import dataclass

import comfy.model_management as mm

from ...parallel.routing import BlockRouter
from ...parallel.sharding import needs_home_every_block

log = logging.getLogger("sharddit")

SHARD_KEY = "sharddit_shards"
ATTACHMENT_KEY = "sharddit"


@dataclass(frozen=True)
class ShardState:
    """Everything clones of one sharded model share: the plan, the router, proxies and shard roots."""

    plan: object
    layout: object
    router: BlockRouter
    proxies: dict  # block list path -> nn.ModuleList of proxies
    roots: tuple  # (torch.device, ShardRoot, template ModelPatcher) per planned block range
    request_key: tuple
    auto_mode: object = None  # parallel_mode.ModeDecision for parallel=auto, decided with the plan
    arch_name: str = ""


def is_sharded(model) -> bool:
    return model.get_attachment(ATTACHMENT_KEY) is not None


def get_shard_state(model) -> ShardState | None:
    return model.get_attachment(ATTACHMENT_KEY)


def get_shard_patchers(model) -> list:
    return model.get_additional_models_with_key(SHARD_KEY)



def release_roots(state: ShardState) -> None:
    """Restore an older shard set's blocks to their original weights on the offload device."""
    if state.router.engine is not None:  # sequence workers and streamed-weight buffers go too
        state.router.engine.close()
    for _, root, template in state.roots:
        if root.model_loaded_weight_memory > 0 or template.backup:
            template.detach(unpatch_all=True)



def sync_shard_patches(main) -> None:
    """Copy the main patcher's weight patches for block keys onto the shard holding each block."""
    for shard in get_shard_patchers(main):
        keys = shard.model.sharddit_keys
        shard.patches = {k: v[:] for k, v in main.patches.items() if k in keys}
        shard.weight_wrapper_patches = {k: v[:] for k, v in main.weight_wrapper_patches.items() if k in keys}
        shard.patches_uuid = main.patches_uuid
        shard.force_cast_weights = main.force_cast_weights


def prepare_sampling_wrapper(executor, model, *args, **kwargs):
    _unload_unsharded_clones(model)
    sync_shard_patches(model)
    return executor(model, *args, **kwargs)


def _unload_unsharded_clones(main) -> None:
    """Fully unload a loaded *unsharded* clone of the same weights (e.g. core KSampler ran on the
    MODEL before it was sharded): its in-place weight patches and "already patched" marks on the
    blocks must be undone before the shards patch those blocks themselves."""
    models = mm.current_loaded_models
    for i in reversed(range(len(models))):
        patcher = models[i].model
        if patcher is not None and patcher is not main and patcher.is_clone(main) and not is_sharded(patcher):
            log.info("[ShardDiT] unloading the unsharded copy of %s before loading its shards",
                     type(patcher.model).__name__)
            if models[i].model_unload():
                models.pop(i)


def routing_scope_wrapper(state: ShardState, mode: str, executor, *args, **kwargs):
    """One routing scope per DiT forward in ``mode`` (``blocks`` / ``sequence``); a ControlNet-style
    input brings every block output home, and block patches of other packs are chained so that a
    skipped block still comes home."""
    home_all = needs_home_every_block(state.layout, executor.original, args, kwargs)
    args, kwargs = _chain_block_patches(state, executor.original, args, kwargs)
    with state.router.forward_scope(return_home_all=home_all, sequence=mode == "sequence"):
        return executor(*args, **kwargs)


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
    """ComfyUI detaches the main patcher: release the shards unless the main comes right back.

    ``unpatch_all=True`` is a full unload (``free_memory``, ``unload_all_models``/``POST /free``,
    which only free the default device themselves): every shard's weights leave its GPU too.
    ``unpatch_all=False`` is ComfyUI switching between clones of the same weights. Before every
    prompt it "switches" a model to itself: the shards stay loaded then (nothing reloads). When a
    different clone takes over (core's sampler on the unsharded MODEL, or a re-sharded one), the
    blocks get their original weights back and leave the GPUs, so that clone loads them itself.
    """
    state = get_shard_state(main)
    if state is None:
        return
    if not unpatch_all and _main_is_reloading(state) is not False:
        return
    release_roots(state)


def _main_is_reloading(state: ShardState) -> bool | None:
    """Whether the ``load_models_gpu`` call that is detaching the main patcher now will load a
    patcher carrying ``state`` again. Read from that call's ``models_to_load`` (ComfyUI 0.3.64);
    None when it cannot be told (another caller, or ComfyUI's code changed): then the shards are
    left loaded, as for an identical prompt."""
    frame = sys._getframe(1)
    while frame is not None:
        if frame.f_code.co_name == "load_models_gpu" and frame.f_globals.get("__name__") == mm.__name__:
            break
        frame = frame.f_back
    to_load = frame.f_locals.get("models_to_load") if frame is not None else None
    if not isinstance(to_load, list):
        return None
    patchers = [getattr(loaded, "model", None) for loaded in to_load]
    return any(p is not None and get_shard_state(p) is state for p in patchers)
