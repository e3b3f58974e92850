"""`sequence` mode with core's LTXV STG and core's attention containers, in real ComfyUI (in-process,
CPU, tiny random-weight LTXV).

Core's ``LTXVSpatioTemporalGuidance`` (0.33 ``comfy_extras/nodes_lt.py``) runs one more pass per step
with ``stg_self_attn_blocks`` in ``transformer_options``; the model turns it into
``stg_skip_self_attn`` for the listed blocks, whose ``attn1`` then passes its values through without
calling attention, so the block's only attention call is its cross-attention. In 0.33 only LTX-2's
``av_model`` does that turning (LTX-2 with STG in `sequence`: test_ltx2_sequence_comfy.py); 0.38.1's ``LTXVModel`` does it too.
``_per_block_marker`` is a stand-in for 0.38.1's loop, written here as a ``patches_replace["dit"]``
patch on the same core block: block ``i``'s ``transformer_options`` get ``stg_skip_self_attn`` when
``i`` is in ``stg_self_attn_blocks``. Compared with core's KSampler on the same MODEL, within
``COMFY_SPLIT_BOUND`` (tests/harness/numerics.py).
"""
import functools

import pytest
import torch
from harness.numerics import COMFY_SPLIT_BOUND, assert_split_close
from harness.sampling import load, ours, stock

pytestmark = pytest.mark.comfy

LATENT = (1, 128, 3, 5, 5)  # 75 tokens: 38/37 rows per rank on cpu,cpu; 128 text tokens
EXTRAS = {"tokens": 128, "attention_mask": torch.ones(1, 128, dtype=torch.long)}


def _stg_node(env):
    node = env.nodes.NODE_CLASS_MAPPINGS.get("LTXVSpatioTemporalGuidance")
    if node is None:
        pytest.skip("core's LTXVSpatioTemporalGuidance node (added after ComfyUI 0.3.64)")
    return node


def _marked(i, args, extra):
    options = args["transformer_options"]
    blocks = options.get("stg_self_attn_blocks")
    if blocks is not None:
        args = {**args, "transformer_options": {**options, "stg_skip_self_attn": i in blocks}}
    return extra["original_block"](args)


def _per_block_marker(model):
    marked = model.clone()
    for i in range(len(model.model.diffusion_model.transformer_blocks)):
        marked.set_model_patch_replace(functools.partial(_marked, i), "dit", "double_block", i)
    return marked


def _engine(model):
    states = list(model.model.__dict__.get("_sharddit_states", {}).values())
    assert len(states) == 1, states
    return states[0].router.engine


def test_ltxv_with_cores_stg_in_sequence_matches_core(env, tiny):
    stg = _stg_node(env)
    model = _per_block_marker(load(env, tiny.ltxv_state_dict()))
    guided = stg.execute(model, 2.0, "1", 0.0, 1.0).result[0]  # perturb block 1 of 2
    latent = torch.zeros(LATENT)
    ref = stock(env, guided, latent, EXTRAS, cfg=1.0)
    unguided = stock(env, model, latent, EXTRAS, cfg=1.0)
    assert (ref - unguided).abs().max() > 1e-3, "the STG pass must change the result (else this test proves nothing)"
    got = ours(env, guided, latent, EXTRAS, "cpu,cpu", cfg=1.0, parallel="sequence")
    stats = _engine(guided).stats
    assert stats.fallbacks == 0 and len(stats.groups) == 1  # one group of two ranks: tokens split, Ulysses
    assert_split_close(got, ref, COMFY_SPLIT_BOUND, "LTXV + core's STG on block 1, cpu,cpu, cfg 1")


def test_cores_containers_reach_our_override_as_tensors(env):
    """Core's own ``wrap_attn`` and ``AttentionTensorContainer``: our override carries no
    ``container_function``, so core takes q/k/v out of their containers for it."""
    from comfy.ldm.modules import attention

    from sharddit.parallel.sequence.rank_block import ATTENTION_OVERRIDE, BlockAttention
    from sharddit.parallel.sequence.split import Group, RankSlice

    container = getattr(attention, "AttentionTensorContainer", None)
    if container is None:
        pytest.skip("core's AttentionTensorContainer (added after ComfyUI 0.3.64)")
    rs = RankSlice(rank=0, group=Group(index=0, batch=(0, 1), ranks=(0,)), position=0, tokens=(0, 6))
    override = BlockAttention(None, rs, 6, False)
    override.begin_block(None)
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 6, 16, generator=g) for _ in range(3))
    held = [container(t) for t in (q, k, v)]
    got = attention.attention_pytorch(*held, 2, transformer_options={ATTENTION_OVERRIDE: override})
    assert torch.equal(got, attention.attention_pytorch(q, k, v, 2)) and override.calls == 1
