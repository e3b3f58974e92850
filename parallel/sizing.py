"""Bytes per block, non-block bytes and an activation estimate (pure PyTorch, works on ``meta``).

Plain torch rather than accelerate's ``compute_module_sizes``: ours needs per-block sizes in the
layout's global block order over several block lists, must see through ``BlockProxy`` (whose
block is not a submodule) and counts each tensor once across blocks and the rest; that is a few
lines here and would not save code (and accelerate is not a dependency of the pack).
"""
from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from .sharding import BlockLayout, BlockProxy, get_block_list

__all__ = [
    "compute_block_bytes",
    "compute_non_block_bytes",
    "compute_tokens",
    "estimate_activation_bytes",
    "get_blocks",
]


def get_blocks(module: torch.nn.Module, layout: BlockLayout) -> list[torch.nn.Module]:
    """The real blocks in global order (a ``BlockProxy`` yields the block behind it)."""
    out = []
    for path in layout.block_lists:
        for b in get_block_list(module, path):
            out.append(b.real_block if isinstance(b, BlockProxy) else b)
    return out


def _tensors(module: torch.nn.Module):
    yield from module.parameters()
    yield from module.buffers()


def _bytes(tensors, seen: set) -> int:
    total = 0
    for t in tensors:
        if id(t) not in seen:
            seen.add(id(t))
            total += t.numel() * t.element_size()
    return total


def compute_block_bytes(module: torch.nn.Module, layout: BlockLayout) -> tuple[int, ...]:
    """Parameter + buffer bytes of each block, in global block order (shared tensors once)."""
    seen: set = set()
    return tuple(_bytes(_tensors(b), seen) for b in get_blocks(module, layout))


def compute_non_block_bytes(module: torch.nn.Module, layout: BlockLayout) -> int:
    """Parameter + buffer bytes of everything that is not a block (embeddings, head, ...)."""
    seen: set = set()
    for b in get_blocks(module, layout):
        _bytes(_tensors(b), seen)
    return _bytes(_tensors(module), seen)


def compute_tokens(latent_shape: Sequence[int], patch_size: Sequence[int]) -> int:
    """Tokens per sample for a latent ``(..., T, H, W)`` and a patch ``(pt, ph, pw)``.

    Trailing latent dims are padded up to a multiple of the patch (ComfyUI's
    ``pad_to_patch_size``). Wan 480p x 81 frames: latent ``(2, 16, 21, 60, 104)``, patch
    ``(1, 2, 2)`` -> 21 * 30 * 52 = 32,760 tokens.
    """
    dims = list(latent_shape)[-len(patch_size):]
    if len(dims) != len(patch_size):
        raise ValueError(f"[ShardDiT] latent shape {tuple(latent_shape)} has fewer dims than patch {tuple(patch_size)}")
    return math.prod(-(-d // p) for d, p in zip(dims, patch_size))


def estimate_activation_bytes(tokens: int, dim: int, batch: int, dtype_bytes: int,
                              ffn_dim: int | None = None, context_tokens: int = 0) -> int:
    """Peak activation bytes of ONE block on its device, with flash attention (no L x L matrix).

    Per sample and token, in units of ``dtype_bytes``:

    - the hidden state that enters the block (kept for the residual): ``dim``;
    - attention phase: normed input, q, k, v and attention output: ``5 * dim``;
    - FFN phase: normed input and output ``2 * dim``, intermediate before and after the
      activation ``2 * ffn_dim`` (``ffn_dim`` defaults to ``4 * dim``).

    peak = batch * dtype_bytes * (tokens * (dim + max(5 * dim, 2 * dim + 2 * ffn_dim))
    + context_tokens * 2 * dim) - the last term is cross-attention k/v of the text context.
    Wan 2.1 14B, 480p x 81 (32,760 tokens, dim 5120, ffn 13824, bf16, batch 1): 2.62 GiB; a fake-GPU
    run of ComfyUI's WanModel measured 2.9 GiB (rotary and modulation temporaries in fp32).
    Not included: CUDA context, allocator fragmentation, cuBLAS workspaces.
    """
    if min(tokens, dim, batch, dtype_bytes) <= 0:
        raise ValueError(f"[ShardDiT] activation estimate needs positive sizes, got tokens={tokens} "
                         f"dim={dim} batch={batch} dtype_bytes={dtype_bytes}")
    ffn = 4 * dim if ffn_dim is None else ffn_dim
    per_token = dim + max(5 * dim, 2 * dim + 2 * ffn)
    return batch * dtype_bytes * (tokens * per_token + context_tokens * 2 * dim)
