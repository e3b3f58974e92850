"""Lean `sequence` (issue 24 item 5): cond and uncond run one after the other over all ranks.

A lean pass on N ranks gives each rank one sample and 1/N of its tokens, with a Ulysses exchange
over N ranks: in the blocks, what a rank of the batched run on 2N ranks computes (two batch groups
of N). Not bit-identical even to that run: the DiT's code outside the blocks (embedding, head)
runs on one sample per pass instead of two, other GEMM row counts. So every comparison is
``assert_split_close`` (TOY_SPLIT_BOUND 2e-6). Measured max diff here (AMD EPYC, AVX2 host):
lean on 4 vs batched on 8: 3.6e-7 default and AVX2 (torch 2.13.0 and 2.14.1), 0 COMPATIBLE; lean
vs batched on 4 ranks and vs unsharded: 0 on every path.
"""
from __future__ import annotations

import re

import pytest
import torch
from harness.numerics import assert_split_close
from harness.toy_seq import SeqToyDiT
from sharddit.parallel.blocks.sharding import attach_block_sharding
from sharddit.parallel.blocks.routing import BlockLayout
from sharddit.parallel.sequence.engine import attach_sequence_engine
from sharddit.parallel.sequence.lean import chunk_range, lean_passes, run_in_passes
from sharddit.parallel.sequence.split import TokenSpec

WAN = BlockLayout(("blocks",), (("x",),))
WAN_SPEC = (TokenSpec({"x": 1, "e": 1, "freqs": 1}),)


def _sharded(model, n):
    ranks = ["cpu"] * n
    blocks = len(model.blocks)
    handle = attach_block_sharding(model, WAN, [ranks[g * n // blocks] for g in range(blocks)], "cpu")
    proxies = [p for pl in handle.proxies.values() for p in pl]
    return handle, attach_sequence_engine(handle.router, proxies, WAN_SPEC, ranks, timeout_s=30)


def _forward(handle, model):
    def run(*args, **kwargs):
        with torch.no_grad(), handle.router.forward_scope(sequence=True):
            return model(*args, **kwargs)
    return run


def test_lean_passes_cut_the_batch():
    assert lean_passes(2, 2) == [(0, 1), (1, 2)]
    assert lean_passes(4, 2) == [(0, 2), (2, 4)]
    assert lean_passes(1, 2) == [(0, 1)]
    with pytest.raises(ValueError, match="passes >= 1"):
        lean_passes(2, 0)


def test_pass_chunks_follow_the_samples():
    """ComfyUI's ``cond_or_uncond`` has one entry per conditioning chunk: a batch of 4 samples as
    [cond, uncond] is two chunks of 2; the pass over samples 2..4 is the uncond chunk only."""
    assert chunk_range(2, 2, 0, 1) == (0, 1) and chunk_range(2, 2, 1, 2) == (1, 2)
    assert chunk_range(4, 2, 2, 4) == (1, 2) and chunk_range(4, 2, 1, 3) == (0, 2)
    with pytest.raises(ValueError, match="a batch of 3 is not 2 equal chunks"):
        chunk_range(3, 2, 0, 1)


def test_per_pass_hook_sees_each_pass():
    """``per_pass`` gets each pass's sample range and its sliced arguments, and what it returns is
    what the forward gets (ComfyUI's side uses it to cut ``cond_or_uncond`` per pass)."""
    seen = []

    def per_pass(b0, b1, args, kwargs):
        return args, dict(kwargs, labels=kwargs["labels"][b0:b1])

    def forward(x, labels):
        seen.append((tuple(x.shape), labels))
        return x * 2

    x = torch.arange(8.0).reshape(4, 2)
    out = run_in_passes(forward, 4, 2, (x,), {"labels": ["c0", "c1", "u0", "u1"]}, per_pass=per_pass)
    assert seen == [((2, 2), ["c0", "c1"]), ((2, 2), ["u0", "u1"])]
    assert torch.equal(out, x * 2)


def test_lean_matches_batched_and_unsharded():
    torch.manual_seed(0)
    model = SeqToyDiT(dim=32, heads=4).eval()
    x, t, ctx = torch.randn(2, 16, 8), torch.rand(2), torch.randn(2, 5, 32)
    with torch.no_grad():
        ref = model(x, t, ctx)
    outs, stats = {}, {}
    for name, n, passes in (("lean4", 4, 2), ("batched4", 4, 1), ("batched8", 8, 1)):
        handle, engine = _sharded(model, n)
        per_pass = []
        forward = _forward(handle, model)

        def counted(*a, forward=forward, engine=engine, per_pass=per_pass, **k):
            out = forward(*a, **k)
            per_pass.append(engine.stats)
            return out
        outs[name] = run_in_passes(counted, 2, passes, (x, t, ctx), {})
        stats[name] = per_pass
        engine.close()
        handle.detach()
    # lean: two forwards, each one sample over all four ranks (one group, tokens split four ways)
    assert [s.groups for s in stats["lean4"]] == [[((0, 1), (0, 1, 2, 3))]] * 2
    assert stats["batched4"][0].groups == [((0, 1), (0, 1)), ((1, 2), (2, 3))]
    # every rank runs every block once per pass (on GPUs: each pass streams the blocks it does not own
    # again, which the cost model prices; "cpu" ranks share one device, so nothing streams here)
    assert [s.blocks_run for s in stats["lean4"]] == [[4] * 4] * 2 and stats["batched4"][0].blocks_run == [4] * 4
    assert_split_close(outs["lean4"], outs["batched8"], what="lean on 4 ranks vs batched on 8 (same block shapes)")
    assert_split_close(outs["lean4"], outs["batched4"], what="lean vs batched on 4 ranks")
    assert_split_close(outs["lean4"], ref, what="lean on 4 ranks vs unsharded")


def test_lean_cost_streams_the_weights_once_per_pass():
    """Wan 2.1 14B 720p x 81 at cfg 6 on four RTX 4090s: lean is two cfg-1 forwards over all four,
    so twice the weight bytes of one pass and never faster than the batched split (which streams
    once per step); still faster than one GPU (the cond/uncond passes keep four GPUs busy)."""
    from sharddit.loaders.plan.presets import PRESETS
    from sharddit.parallel.cost.model import (
        Workload,
        estimate_sequence,
        estimate_sequence_lean,
        hardware_from_options,
    )
    from sharddit.parallel.families import shape_from_spec

    shape = shape_from_spec(PRESETS["wan2.1-t2v-14b"])
    hw = hardware_from_options(["RTX 4090"] * 4)
    work = Workload(shape, 1280, 720, 81, cfg=6.0)
    lean, batched = estimate_sequence_lean(work, hw), estimate_sequence(work, hw)
    one_pass = estimate_sequence(Workload(shape, 1280, 720, 81, cfg=1.0), hw)
    assert lean.seconds_per_step == pytest.approx(2 * one_pass.seconds_per_step)
    assert lean.bytes_per_device == 2 * one_pass.bytes_per_device
    assert lean.seconds_per_step >= batched.seconds_per_step and lean.speedup > 1.0
    assert lean.note.startswith("lean: 2 passes per step")


def test_lean_only_where_the_batched_split_does_not_fit():
    from sharddit.parallel.cost.memory import RankMemory, lean_pass_batch

    gib = 1 << 30
    usable = {"cuda:0": 11 * gib, "cuda:1": 11 * gib}
    batched = [RankMemory("cuda:0", 7 * gib, gib, 5 * gib), RankMemory("cuda:1", 6 * gib, gib, 3 * gib)]
    one = [RankMemory("cuda:0", 7 * gib, gib, 2 * gib), RankMemory("cuda:1", 6 * gib, gib, 2 * gib)]
    assert lean_pass_batch(batched, one, usable, 2, 1) == 1  # 13 of 11 GiB together, 10 alone
    assert lean_pass_batch(one, one, usable, 2, 1) is None  # the batched split fits: it stays
    assert lean_pass_batch(batched, batched, usable, 2, 1) is None  # lean does not fit either
    assert lean_pass_batch(batched, one, usable, 1, 1) is None  # cfg 1: nothing to run in turn


def test_auto_prices_sequence_lean_where_it_runs_lean():
    """``auto`` at sampling time (``cost/mode.decide_auto_for_latent``): with ``lean`` the sequence row
    is the lean estimate, and lean on four 4090s (about 3.5x) still beats blocks (1x)."""
    from sharddit.loaders.plan.presets import PRESETS
    from sharddit.parallel.cost.mode import ModeDecision, decide_auto_for_latent
    from sharddit.parallel.families import shape_from_spec

    shape = shape_from_spec(PRESETS["wan2.1-t2v-14b"])
    memory = ModeDecision("sequence", "sequence: memory rule")
    ranks, names = [f"cuda:{i}" for i in range(4)], {f"cuda:{i}": "NVIDIA GeForce RTX 4090" for i in range(4)}
    latent = (2, 16, 21, 90, 160)
    lean = decide_auto_for_latent(memory, shape, latent, ranks, [10] * 4, names, lean=True)
    batched = decide_auto_for_latent(memory, shape, latent, ranks, [10] * 4, names)
    assert lean.mode == batched.mode == "sequence"
    assert "sequence lean: cond and uncond together do not fit" in lean.reason
    assert "lean" not in batched.reason
    def speed(reason):
        return float(re.search(r"predicted ([\d.]+)×", reason).group(1))

    assert 1 < speed(lean.reason) < speed(batched.reason)
