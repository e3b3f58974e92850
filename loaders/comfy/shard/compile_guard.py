"""Refuse per-block compiles that would bypass the shards, instead of running unsharded silently.

KJNodes' ``TorchCompileModelWanVideo`` (v1: object patches ``diffusion_model.blocks.N``) and
``TorchCompileModelWanVideoV2`` (core's ``set_torch_compile_wrapper`` with per-block keys, applied
at run time) put compiled *real* blocks where the router expects its proxies; before sharding,
v1's compiled blocks would be dropped. Compiling the whole diffusion model (core's
``TorchCompileModel``, or KJNodes with ``compile_transformer_blocks_only`` off in V2) keeps the
proxies inside the compiled model and composes, before or after sharding.

The Comfy Compiler (core 0.35+; ``features.malloc_graph_module``) records the allocations of a
model's block loop in a malloc graph of the thread that runs it. ShardDiT's block calls move
tensors between GPUs and allocate on devices and threads the graph does not plan, so every block
call runs inside core's ``pause_malloc_graph()``, the way core keeps its own such work out of it
(``router.block_scope``). `sequence`'s rank threads allocate while the main thread runs ahead,
beyond any pause: while a graph records, each block runs whole (``blocks``) and ShardDiT says once
to start ComfyUI with ``--disable-comfy-compiler``. A block captured into a CUDA graph cannot move
tensors between GPUs: refused, naming ``--disable-cuda-graphs``.
"""
from __future__ import annotations

import contextlib
import functools
import logging
import re

import torch

from ....parallel.blocks.sharding import BlockProxy, get_block_list
from ..core.features import COMPILER_FLAG, CUDA_GRAPHS_FLAG, malloc_graph_active, malloc_graph_module
from .hooks import routing_scope_wrapper
from ....parallel.errors import InputError, RunError

__all__ = ["CAPTURED", "SEQUENCE_UNDER_COMPILER", "check_no_block_object_patches", "cuda_graph_capturing",
           "guarded_routing_scope"]

log = logging.getLogger("sharddit")

SEQUENCE_UNDER_COMPILER = (f"ComfyUI's compiler records this forward's allocations (a comfy-aimdo malloc graph) and "
                           f"the rank threads' allocations cannot be kept out of it; start ComfyUI with "
                           f"{COMPILER_FLAG} to run sequence mode split")
CAPTURED = (f"[ShardDiT] ComfyUI is capturing a sharded block into a CUDA graph, which cannot replay ShardDiT's "
            f"moves between GPUs: start ComfyUI with {CUDA_GRAPHS_FLAG}")
_noted: set[str] = set()

FIX = ("use core's TorchCompileModel (it compiles the whole diffusion model and works before or after "
       "sharding), or turn compile_transformer_blocks_only off in KJNodes' TorchCompileModelWanVideoV2")


def check_no_block_object_patches(model, block_lists) -> None:
    """Before sharding: a MODEL whose single blocks are object-patched (per-block compile v1)."""
    pattern = re.compile(r"diffusion_model\.(%s)\.(\d+)$" % "|".join(map(re.escape, block_lists)))
    for key, value in model.object_patches.items():
        if pattern.match(key):
            raise InputError(f"the MODEL's block {key.split('.', 1)[1]} is replaced by a "
                             f"{type(value).__name__} (a per-block torch.compile such as KJNodes' "
                             f"TorchCompileModelWanVideo): sharding would drop it. {FIX}.")


def guarded_routing_scope(state, mode, executor, *args, **kwargs):
    """ShardDiT's routing scope, after checking that every block position still holds a proxy (the
    proxy lists are live objects: a wrapper that sets ``diffusion_model.blocks.N`` mutates them)."""
    dit = executor.class_obj
    for path in state.proxies:
        for i, have in enumerate(get_block_list(dit, path)):
            if not isinstance(have, BlockProxy):
                raise InputError(f"block {path}.{i} of {type(dit).__name__} was replaced at run time "
                                 f"by a {type(have).__name__} (a per-block torch.compile such as KJNodes' "
                                 f"TorchCompileModelWanVideo/V2): the shards would be bypassed. {FIX}.")
    if callable(mode):  # parallel=auto: decided per latent shape (auto_mode.AutoMode)
        mode = mode(args, kwargs)
    _guard_compiler(state.router)
    return routing_scope_wrapper(state, mode, executor, *args, **kwargs)


def cuda_graph_capturing() -> bool:
    return torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()


def _guard_compiler(router) -> None:
    """Set this forward's block scope and `sequence` check from what this ComfyUI has (see above)."""
    prefetch = malloc_graph_module()
    router.block_scope = functools.partial(_block_scope, prefetch)
    if router.engine is not None:
        router.engine.set_split_check(None if prefetch is None else functools.partial(_sequence_reason, prefetch))


@contextlib.contextmanager
def _block_scope(prefetch):
    if cuda_graph_capturing():
        raise RunError(CAPTURED)
    if prefetch is None:
        yield
        return
    if "paused" not in _noted and malloc_graph_active(prefetch):
        _noted.add("paused")
        log.info("[ShardDiT] ComfyUI's compiler records this forward (a comfy-aimdo malloc graph): ShardDiT's "
                 "block calls, which move tensors between GPUs, run with it paused, as core keeps such work out")
    with prefetch.pause_malloc_graph():
        yield


def _sequence_reason(prefetch) -> str | None:
    return SEQUENCE_UNDER_COMPILER if malloc_graph_active(prefetch) else None
