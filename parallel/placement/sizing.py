"""Bytes per block and non-block bytes (pure PyTorch, works on ``meta``).

Plain torch rather than accelerate's ``compute_module_sizes``: ours needs per-block sizes in the
layout's global block order over several block lists, must see through ``BlockProxy`` (whose
block is not a submodule) and counts each tensor once across blocks and the rest; that is a few
lines here and would not save code (and accelerate is not a dependency of the pack).
"""
from __future__ import annotations

from operator import attrgetter

import torch

from ..blocks.sharding import BlockProxy
from ..blocks.routing import BlockLayout

__all__ = [
    "compute_block_bytes",
    "compute_non_block_bytes",
    "get_blocks",
]


def get_blocks(module: torch.nn.Module, layout: BlockLayout) -> list[torch.nn.Module]:
    """The real blocks in global order (a ``BlockProxy`` yields the block behind it)."""
    out = []
    for path in layout.block_lists:
        for b in attrgetter(path)(module):  # a dotted path: the list under its parents
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
