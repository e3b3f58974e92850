"""Lean `sequence`: the batch (cond, uncond) run as successive passes over all ranks (pure).

Why: at cfg > 1 the batched split (``split.plan_groups``) holds the activations of cond and uncond
at once (two batch groups of N/2 ranks, or one group of N ranks with both samples). When they do
not fit, running the DiT forward once per pass, each pass one slice of the batch with its tokens
split over all N ranks, holds one pass's activations; the price is the block weights streamed once
per pass (twice per step at cfg > 1) and a Ulysses exchange over N ranks instead of N/2.

A pass is one whole DiT forward (one ``forward_scope``) on its slice of the batch: every tensor
argument whose first dimension is the batch is sliced, everything else is passed as is, and the
passes' outputs are concatenated on the batch dimension. The maths of each sample is unchanged
(the DiT treats samples independently); only GEMM row counts differ from the batched run (tokens
split N ways instead of N/2), so the result is within ``tests/harness/numerics`` bounds of it.
"""
from __future__ import annotations

import torch

from ..tensor_map import map_tensors
from .split import even_ranges
from ..errors import InputError, InputTypeError

__all__ = ["chunk_range", "lean_passes", "run_in_passes"]


def lean_passes(batch: int, passes: int) -> list[tuple[int, int]]:
    """Batch ranges of the passes: ``passes`` (at most ``batch``) contiguous, near-equal slices."""
    if batch < 1 or passes < 1:
        raise InputError(f"lean sequence needs batch >= 1 and passes >= 1, got {batch}, {passes}")
    return even_ranges(batch, min(batch, passes))


def _slice(obj, batch: int, b0: int, b1: int, depth: int):
    def cut(t: torch.Tensor) -> torch.Tensor:
        return t[b0:b1] if t.dim() > 0 and t.shape[0] == batch else t
    return map_tensors(cut, obj, depth)


def chunk_range(batch: int, chunks: int, b0: int, b1: int) -> tuple[int, int]:
    """The chunks that samples ``[b0, b1)`` fall in, where ``batch`` samples are ``chunks`` equal
    chunks one after the other (ComfyUI's ``cond_or_uncond``: one entry per conditioning chunk)."""
    if chunks < 1 or batch % chunks:
        raise InputError(f"lean sequence: a batch of {batch} is not {chunks} equal chunks")
    size = batch // chunks
    return b0 // size, -(-b1 // size)


def run_in_passes(forward, batch: int, passes: int, args: tuple, kwargs: dict, depth: int = 2,
                  per_pass=None):
    """``forward(*args, **kwargs)`` run once per pass of ``lean_passes(batch, passes)`` on that
    pass's slice of every batch-first tensor (``depth`` container levels deep), outputs
    concatenated on dim 0 (a tensor, or each tensor of a tuple/list output). ``per_pass(b0, b1,
    args, kwargs) -> (args, kwargs)``, when given, adjusts what a tensor slice cannot (per-chunk
    lists such as ComfyUI's ``cond_or_uncond``)."""
    outs = []
    for b0, b1 in lean_passes(batch, passes):
        a, k = _slice(args, batch, b0, b1, depth), _slice(kwargs, batch, b0, b1, depth)
        if per_pass is not None:
            a, k = per_pass(b0, b1, a, k)
        outs.append(forward(*a, **k))
    if len(outs) == 1:
        return outs[0]
    first = outs[0]
    if isinstance(first, torch.Tensor):
        return torch.cat(outs, dim=0)
    if isinstance(first, (tuple, list)):
        return type(first)(torch.cat(parts, dim=0) if isinstance(parts[0], torch.Tensor) else parts[0]
                           for parts in zip(*outs, strict=True))
    raise InputTypeError(f"lean sequence: cannot join pass outputs of type {type(first).__name__}")
