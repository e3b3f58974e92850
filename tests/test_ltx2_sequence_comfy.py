"""LTX-2.3 (ComfyUI 0.33's ``comfy/ldm/lightricks/av_model.py``, ``LTXAVModel``) in `sequence`.

A tiny random-weight LTX-2.3 (gated attention, cross-attention AdaLN: ``harness.tiny_templates``'s
configuration, loaded by core's detection) samples a (video, audio) latent with core's KSampler and
with ShardDiT's in `sequence` on ``cpu,cpu`` and ``cpu,cpu,cpu``. The video tokens (2 latent frames
of 4 x 4) are split over the ranks: on 2 ranks on frame boundaries (the per-frame timesteps stay
one row per frame), on 3 ranks mid-frame (11, 11, 10 tokens: one row per token). The audio tokens
stay whole on every rank; video->audio attention splits its heads over the ranks (2 audio heads over
3 ranks: one rank attends none and only relays), each receiving every video token's keys/values of
its heads. Both latents within the pack's bound for token splits (also run on 0.29). ComfyUI 0.3.64
has no LTX-2: the cases skip there, saying so.
"""
import importlib
import json
import os
from pathlib import Path

import pytest
import torch
from sharddit.parallel.random_weights import random_state_dict

pytestmark = pytest.mark.comfy


def _version() -> str:
    path = Path(os.environ.get("COMFYUI_PATH", "")) / "comfyui_version.py"
    text = path.read_text(encoding="utf-8") if path.is_file() else ""
    return text.rsplit("=", 1)[-1].strip().strip('"') if "__version__" in text else "unknown"


def _require_ltxav() -> None:
    try:
        importlib.import_module("comfy.ldm.lightricks.av_model")
    except ImportError:
        if _version().startswith("0.3."):
            pytest.skip(f"ComfyUI {_version()} has no LTX-2 (added after ComfyUI 0.3.64)")
        raise


class _AVLatent:
    """LTX-2's latent as core's sampler takes it: a ``NestedTensor`` of the video (128 channels, 2
    latent frames of 4 x 4: 32 tokens) and the audio (8 channels x 16, 5 steps), fresh per run."""

    def clone(self):
        from comfy.nested_tensor import NestedTensor

        return NestedTensor([torch.zeros(1, 128, 2, 4, 4), torch.zeros(1, 8, 5, 16)])


@pytest.fixture(scope="module")
def ltx_model(env):
    _require_ltxav()
    import comfy.sd
    from harness import tiny_templates

    config = dict(tiny_templates.ltx23_transformer_config(64, 32), num_layers=3)
    sd = random_state_dict(tiny_templates.ltxav_dit(config), seed=0)
    model = comfy.sd.load_diffusion_model_state_dict(sd, metadata={"config": json.dumps({"transformer": config})})
    assert type(model.model.diffusion_model).__name__ == "LTXAVModel"
    return model


@pytest.mark.parametrize("ranks", [2, 3])
def test_per_frame_timesteps_cut_like_the_whole(env, ranks):
    """Core's ``CompressedTimestep`` (one row per frame of 16 tokens, 3 frames, each its own values)
    cut per rank: on 3 ranks on frame boundaries, on 2 mid-frame (the narrowed subclass, one row per
    frame kept); each rank's expansions equal its tokens of the whole one's, and ``isinstance`` holds."""
    _require_ltxav()
    from comfy.ldm.lightricks.av_model import CompressedTimestep

    from sharddit.parallel.sequence.frames import cut_frame_rows
    from sharddit.parallel.sequence.split import plan_groups, rank_slices

    g = torch.Generator().manual_seed(0)
    per, frames, params, dim = 16, 3, 9, 8
    whole = CompressedTimestep(torch.randn(1, frames, params * dim, generator=g), per, per_frame=True)
    table = torch.randn(params, dim, generator=g)
    for rs in rank_slices(plan_groups(1, ranks), frames * per):
        a, b = rs.tokens
        cut = cut_frame_rows(whole, rs, 1, frames * per, "v_timestep")
        assert isinstance(cut, CompressedTimestep) and cut.data.shape[1] <= 2, (ranks, rs.tokens)
        for got, ref in zip(cut.expand_for_computation(table, 1, slice(6, 9)),
                            whole.expand_for_computation(table, 1, slice(6, 9)), strict=True):
            assert torch.equal(got, ref[:, a:b]), (ranks, rs.tokens)
        assert torch.equal(cut.expand(), whole.expand()[:, a:b])


EXTRAS = {"tokens": 8, "dim": 64 + 32, "frame_rate": 25.0}  # the text projection's video + audio features


@pytest.mark.parametrize("cfg", [1.0, 3.0])
@pytest.mark.parametrize("devices", ["cpu,cpu", "cpu,cpu,cpu"])
def test_ltx2_sequence_matches_core(env, ltx_model, cfg, devices):
    """Every block split (no fallback), the video and the audio latents against core's KSampler under
    the pack's bound for token splits. At cfg 3 on 2 ranks cond and uncond run one per rank (no
    exchange); on 3 ranks one group of 3 splits both samples' tokens."""
    from harness.numerics import COMFY_SPLIT_BOUND, assert_split_close
    from harness.sampling import ours, stock

    ref = stock(env, ltx_model, _AVLatent(), EXTRAS, cfg=cfg)
    assert all(torch.isfinite(t).all() and t.abs().max() > 0 for t in ref.tensors)
    got = ours(env, ltx_model, _AVLatent(), EXTRAS, devices, cfg=cfg, parallel="sequence")
    (state,) = ltx_model.model.__dict__["_sharddit_states"].values()
    stats = state.router.engine.stats
    n = devices.count(",") + 1
    assert stats.fallbacks == 0 and stats.blocks_run == [3] * n, stats
    split = not (cfg > 1 and n == 2)
    assert (sum(stats.exchanges) > 0) == split, stats  # Ulysses and the video->audio heads ran
    if split:
        assert [b - a for a, b in stats.tokens] == ([16, 16] if n == 2 else [11, 11, 10])
    assert len(got.tensors) == 2
    for a, b, what in zip(got.tensors, ref.tensors, ("video", "audio"), strict=True):
        assert_split_close(a, b, COMFY_SPLIT_BOUND, f"LTX-2.3 {what} {devices} cfg {cfg}")


def test_ltx2_with_cores_stg_in_sequence_matches_core(env, ltx_model):
    """Core's ``LTXVSpatioTemporalGuidance`` on LTX-2.3 (its own block loop turns the node's
    ``stg_self_attn_blocks`` into ``stg_skip_self_attn``): the perturbed pass's block 1 passes its
    video self-attention's values through without calling attention, so that block's attention calls
    are the audio and cross-modal ones only; told apart by module, they still split as above."""
    from harness.numerics import COMFY_SPLIT_BOUND, assert_split_close
    from harness.sampling import ours, stock

    stg = env.nodes.NODE_CLASS_MAPPINGS.get("LTXVSpatioTemporalGuidance")
    if stg is None:  # 0.29 has LTX-2 but not this node
        pytest.skip("core's LTXVSpatioTemporalGuidance node, in 0.33 (added after ComfyUI 0.3.64)")
    guided = stg.execute(ltx_model, 2.0, "1", 0.0, 1.0).result[0]  # perturb block 1 of 3
    ref = stock(env, guided, _AVLatent(), EXTRAS, cfg=1.0)
    unguided = stock(env, ltx_model, _AVLatent(), EXTRAS, cfg=1.0)
    assert (ref.tensors[0] - unguided.tensors[0]).abs().max() > 1e-3, "the STG pass must change the result"
    got = ours(env, guided, _AVLatent(), EXTRAS, "cpu,cpu", cfg=1.0, parallel="sequence")
    (state,) = guided.model.__dict__["_sharddit_states"].values()
    stats = state.router.engine.stats
    assert stats.fallbacks == 0 and len(stats.groups) == 1, stats
    for a, b, what in zip(got.tensors, ref.tensors, ("video", "audio"), strict=True):
        assert_split_close(a, b, COMFY_SPLIT_BOUND, f"LTX-2.3 + core's STG on block 1 {what}, cpu,cpu, cfg 1")
