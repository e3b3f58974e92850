"""Lean `sequence` inside real ComfyUI (issue 24 item 5): at cfg > 1 the DiT call of cond + uncond
runs as two forwards, each one sample with its tokens over both ranks (``sequence/lean``), where
the batched split puts cond on one rank and uncond on the other. On CPU ranks memory is not
checked, so ``SHARDDIT_SEQUENCE_LEAN=1`` asks for lean; on GPUs ``memory_report`` picks it where
cond and uncond together do not fit (``cost/memory.lean_pass_batch``, tested in test_sequence_lean).

Tiny Wan 2.1 (75 tokens: 38/37 per rank in a lean pass, all 75 per rank in the batched split):
other GEMM row counts than the batched run and core's, so ``COMFY_SPLIT_BOUND`` (1e-4). Measured
max diff after 2 steps (AMD EPYC, AVX2 host): lean vs batched 1.48e-5 default, 1.34e-5 AVX2,
1.31e-5 COMPATIBLE (ComfyUI 0.3.64, torch 2.14.1); 1.48e-5 default on ComfyUI 0.29.0; lean vs
core 1.34e-5 to 1.62e-5.
"""
import functools
import inspect

import pytest
import torch
from harness.numerics import COMFY_SPLIT_BOUND, assert_split_close
from harness.sampling import cond, load, ours, stock

pytestmark = pytest.mark.comfy


def _engine(model):
    states = list(model.model.__dict__.get("_sharddit_states", {}).values())
    assert len(states) == 1, states
    return states[0].router.engine


def _record_cond_or_uncond(model, pairs=None) -> list:
    """Each DiT forward's ``cond_or_uncond`` as the model's own forward gets it (inside ShardDiT's
    ``DIFFUSION_MODEL`` wrapper, where a lean pass has cut it), recorded from ``_forward``; and in
    ``pairs`` that list with the text context the forward got (which says whether it is cond)."""
    seen, dit = [], model.model.diffusion_model
    original = dit._forward
    signature = inspect.signature(original)

    @functools.wraps(original)  # keeps the signature ShardDiT binds transformer_options with
    def recording(*args, **kwargs):
        arguments = signature.bind(*args, **kwargs).arguments
        options = arguments.get("transformer_options") or {}
        seen.append(list(options.get("cond_or_uncond", [])))
        if pairs is not None:
            pairs.append((seen[-1], arguments["context"].clone()))
        return original(*args, **kwargs)
    dit._forward = recording
    return seen


def test_lean_sequence_matches_batched_and_core(env, tiny, monkeypatch):
    model = load(None, tiny.wan21_t2v_state_dict())
    latent, extras = torch.zeros(1, 16, 3, 10, 10), {"tokens": 512}
    ref = stock(env, model, latent, extras, cfg=3.0)
    batched = ours(env, model, latent, extras, "cpu,cpu", cfg=3.0, parallel="sequence")
    assert _engine(model).stats.groups == [((0, 1), (0,)), ((1, 2), (1,))]
    monkeypatch.setenv("SHARDDIT_SEQUENCE_LEAN", "1")
    pairs = []
    seen = _record_cond_or_uncond(model, pairs)
    lean = ours(env, model, latent, extras, "cpu,cpu", cfg=3.0, parallel="sequence")
    # each lean pass names only its own chunk (ComfyUI batches cond then uncond: [0, 1] or [1, 0])
    assert seen and all(len(c) == 1 for c in seen) and {c[0] for c in seen} == {0, 1}, seen
    # ... and the chunk it names is the one it computes: 0 (cond) with the positive text
    texts = {0: cond(**extras)[0][0], 1: cond(seed=2, **extras)[0][0]}
    assert not torch.equal(texts[0], texts[1])
    for chunks, context in pairs:
        match = [k for k, text in texts.items() if context.shape == text.shape and torch.equal(context, text)]
        assert match == chunks, f"a lean pass named {chunks} but computes {match or 'other'} text"
    stats = _engine(model).stats  # the last forward: one sample, tokens over both ranks
    assert stats.groups == [((0, 1), (0, 1))] and stats.fallbacks == 0 and stats.exchanges[0] > 0
    assert_split_close(lean, batched, COMFY_SPLIT_BOUND, "wan21 cpu,cpu cfg 3 lean vs batched")
    assert_split_close(lean, ref, COMFY_SPLIT_BOUND, "wan21 cpu,cpu cfg 3 lean vs core")
