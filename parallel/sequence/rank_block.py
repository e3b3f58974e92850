"""One rank runs one block: the attention rule and the block step, shared by the engine's threads
(``local.LocalRanks``) and by worker processes (``distributed.worker``), so both run the same
code (pure).

Inside a block, ComfyUI calls ``optimized_attention`` through
``transformer_options[ATTENTION_OVERRIDE]``. **The first attention call of a block is its
self-attention**: it runs as Ulysses attention over the batch group's ``Exchange``; every later
call of the block (cross-attention to the text) runs locally on the rank's rows. ``BlockAttention``
is that rule; ``run_rank_block`` restarts its count at every block, calls the block and returns its
output rows by stream name.
"""
from __future__ import annotations

import functools

import torch

from .ulysses import ulysses_attention

__all__ = ["ATTENTION_OVERRIDE", "BlockAttention", "run_rank_block", "with_attention"]

ATTENTION_OVERRIDE = "optimized_attention_override"
"""ComfyUI's ``transformer_options`` key for an attention function that wraps ``optimized_attention``."""


class BlockAttention:
    """The attention override of one rank: Ulysses for the block's first call, local after it.

    ``prev``: an override another pack installed before ours (called with ``func`` first, as
    ComfyUI calls an override); None: none."""

    def __init__(self, exchange, rs, main: int, text_first: bool, prev=None):
        self.exchange, self.rs, self.main, self.text_first, self.prev = exchange, rs, main, text_first, prev
        self.calls = 0

    def restart(self) -> None:
        """A new block: its next call is its self-attention again."""
        self.calls = 0

    def __call__(self, func, *args, **kwargs):
        first = self.calls == 0
        self.calls += 1
        attend = functools.partial(self.prev, func) if self.prev is not None else func
        if not first or len(self.rs.group.ranks) == 1:
            return attend(*args, **kwargs)
        return ulysses_attention(self.exchange, self.rs, self.main, attend, args, kwargs, self.text_first)


def with_attention(options: dict, attention: BlockAttention) -> dict:
    """A copy of ``transformer_options`` whose attention override is ``attention``."""
    return {**options, ATTENTION_OVERRIDE: attention}


def run_rank_block(module: torch.nn.Module, args, kwargs: dict, attentions, stream_names, index: int) -> dict:
    """Call ``module`` (block ``index``) on one rank's arguments; its outputs by stream name."""
    for attention in attentions:
        attention.restart()
    out = module(*args, **kwargs)
    outs = out if isinstance(out, (tuple, list)) else (out,)
    if len(outs) != len(stream_names):
        raise RuntimeError(f"[ShardDiT] block {index} returned {len(outs)} tensors for "
                           f"{len(stream_names)} stream arguments {tuple(stream_names)}")
    return dict(zip(stream_names, outs, strict=True))
