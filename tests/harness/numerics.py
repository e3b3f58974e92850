"""A split run against the unsplit reference on CPU: equal where the shapes are, bounded where not.

Why not always ``torch.equal``: a split (tokens over ranks, or cond and uncond over batch groups)
runs the same maths on smaller matrices. MKL picks its GEMM kernel by CPU kind and by matrix shape
(a matrix-vector kernel for one row, another blocking for a few rows), so a row's dot products can
be summed in another order when its matrix has fewer rows: the same inputs give results a few ulp
apart, and which shapes differ changes from host to host. ``torch.equal`` is asserted only where
every GEMM sees the same shapes as in the reference (blocks mode; a distributed rank against the
same rank run as a thread); everything else goes through ``assert_split_close``.

Measured max |split - unsplit| (``SHARDDIT_RECORD_DIFFS=FILE`` records every comparison), on an
AMD EPYC host (AVX2, no AVX-512; ``MKL_CBWR=AVX512`` falls back to the AVX2 branch there and gave
the AVX2 figures). ``COMPATIBLE`` and ``AVX2`` are MKL's reproducible branches: they give the same
bits on any x86 CPU, so they stand for other hosts' kernels too.

Toy DiTs (tests/test_sequence.py, test_dist_sequence.py, test_dist_members.py; outputs |x| <= 1.4,
one forward, fp32), 38 split comparisons per run:

    MKL_CBWR     torch 2.13.0   torch 2.14.1
    default      4.8e-7         4.8e-7
    COMPATIBLE   4.8e-7         4.8e-7
    AVX2         3.6e-7         3.6e-7
    AVX512       3.6e-7         3.6e-7
    (Intel AVX-512 host, default: 0 — the tests were written there as torch.equal)

Tiny real models through ComfyUI 0.3.64 (tests/test_sequence_comfy.py,
test_distributed_server_comfy.py: 2 sampling steps, torch 2.14.1, ComfyUI's environment):

    MKL_CBWR     max        where
    default      1.1e-5     HunyuanVideo cond/uncond split (Wan and LTXV: 0)
    COMPATIBLE   1.2e-5     Wan cfg 3 (cond/uncond and token splits), distributed cpu,w1/cpu 1.1e-5
    AVX2         9.1e-6     HunyuanVideo cond/uncond split (the rest: 0)
    Intel AVX-512 host, default (issue 19): 4.8e-5 for a cond/uncond split after 4 steps of tiny
    Wan at cfg 4.5, a Linear on 1 row vs 2 differing by 4e-6 to 6e-5 per call; 1.7e-5 for
    HunyuanVideo's cond/uncond split after 2 steps.

Pipelined Ulysses by head chunks (tests/test_sequence_pipeline.py), chunked against unchunked on
the same ranks: 0 in every case but one, 2.7e-7 where each chunk's attention call holds 1 head of
13 tokens against 2 heads unchunked (CPU SDPA blocks a call that small by its head count: the
per-head maths is the same, the summation order is not); within ``TOY_SPLIT_BOUND``.

Each bound is about twice the largest figure seen on any host (4× for the toys, whose figures
are a few ulp): room for a kernel path not measured, small enough that a real fault fails (on
the toy, a block whose weights are 0.01 stale moves the output by 2.3e-2, the two token halves
attending in swapped positions by 2.4e-2).
"""
from __future__ import annotations

import os

import torch

TOY_SPLIT_BOUND = 2e-6
"""Toy DiTs, one forward: largest measured 4.8e-7 (a few ulp of outputs ~1)."""
COMFY_SPLIT_BOUND = 1e-4
"""Tiny real models, 2 sampling steps through ComfyUI: largest measured 4.8e-5 (Intel, 4 steps)."""


def max_diff(out: torch.Tensor, ref: torch.Tensor) -> float:
    return (out.float() - ref.float()).abs().max().item() if out.numel() else 0.0


def _record(kind: str, what: str, diff: float) -> None:
    """SHARDDIT_RECORD_DIFFS=FILE appends ``test, kind, what, diff`` per comparison (how the
    figures in this docstring were gathered); it never changes what is asserted."""
    path = os.environ.get("SHARDDIT_RECORD_DIFFS")
    if path:
        test = os.environ.get("PYTEST_CURRENT_TEST", "?").split(" ")[0]
        with open(path, "a", encoding="utf-8") as f:
            f.write(f"{test}\t{kind}\t{what}\t{diff:.3g}\n")


def assert_split_close(out: torch.Tensor, ref: torch.Tensor, bound: float = TOY_SPLIT_BOUND, what: str = "") -> float:
    """``out`` (a split run) equals ``ref`` or is within ``bound`` of it; returns the max diff."""
    assert out.shape == ref.shape and out.dtype == ref.dtype, (what, out.shape, ref.shape, out.dtype, ref.dtype)
    diff = max_diff(out, ref)
    _record("split", what, diff)
    assert diff <= bound, (f"{what}: max diff {diff:.3g} > {bound:g}, the bound of a split that changes GEMM "
                           "shapes (tests/harness/numerics.py)")
    return diff


def assert_same_shapes_equal(out: torch.Tensor, ref: torch.Tensor, what: str = "") -> None:
    """Bit-identical: the caller states that every GEMM of ``out`` saw the shapes ``ref``'s did."""
    _record("equal", what, max_diff(out, ref) if out.shape == ref.shape else float("inf"))
    assert torch.equal(out, ref), f"{what}: max diff {max_diff(out, ref):.3g}, expected bit-identical (same shapes)"
