"""Refuse per-block compiles that would bypass the shards, instead of running unsharded silently.

KJNodes' ``TorchCompileModelWanVideo`` (v1: object patches ``diffusion_model.blocks.N``) and
``TorchCompileModelWanVideoV2`` (core's ``set_torch_compile_wrapper`` with per-block keys, applied
at run time) put compiled *real* blocks where the router expects its proxies; before sharding,
v1's compiled blocks would be dropped. Compiling the whole diffusion model (core's
``TorchCompileModel``, or KJNodes with ``compile_transformer_blocks_only`` off in V2) keeps the
proxies inside the compiled model and composes, before or after sharding.
"""
from __future__ import annotations

import re

from ...parallel.blocks.sharding import BlockProxy, get_block_list
from .shard_hooks import routing_scope_wrapper

__all__ = ["check_no_block_object_patches", "guarded_routing_scope"]

FIX = ("use core's TorchCompileModel (it compiles the whole diffusion model and works before or after "
       "sharding), or turn compile_transformer_blocks_only off in KJNodes' TorchCompileModelWanVideoV2")


def check_no_block_object_patches(model, block_lists) -> None:
    """Before sharding: a MODEL whose single blocks are object-patched (per-block compile v1)."""
    pattern = re.compile(r"diffusion_model\.(%s)\.(\d+)$" % "|".join(map(re.escape, block_lists)))
    for key, value in model.object_patches.items():
        if pattern.match(key):
            raise ValueError(f"[ShardDiT] the MODEL's block {key.split('.', 1)[1]} is replaced by a "
                             f"{type(value).__name__} (a per-block torch.compile such as KJNodes' "
                             f"TorchCompileModelWanVideo): sharding would drop it. {FIX}.")


def guarded_routing_scope(state, mode, executor, *args, **kwargs):
    """ShardDiT's routing scope, after checking that every block position still holds a proxy (the
    proxy lists are live objects: a wrapper that sets ``diffusion_model.blocks.N`` mutates them)."""
    dit = executor.class_obj
    for path in state.proxies:
        for i, have in enumerate(get_block_list(dit, path)):
            if not isinstance(have, BlockProxy):
                raise ValueError(f"[ShardDiT] block {path}.{i} of {type(dit).__name__} was replaced at run time "
                                 f"by a {type(have).__name__} (a per-block torch.compile such as KJNodes' "
                                 f"TorchCompileModelWanVideo/V2): the shards would be bypassed. {FIX}.")
    if callable(mode):  # parallel=auto: decided per latent shape (auto_mode.AutoMode)
        mode = mode(args, kwargs)
    return routing_scope_wrapper(state, mode, executor, *args, **kwargs)
