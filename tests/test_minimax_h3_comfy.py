"""MiniMax H3 (ComfyUI 0.33's ``comfy/ldm/minimax/model.py``, ``MiniMaxH3Model``) through ShardDiT.

A tiny random-weight H3 (its own class, loaded by core's detection from a state dict) samples a
(video, audio) latent with core's KSampler and with ShardDiT's on ``cpu,cpu`` and ``cpu,cpu,cpu``.
`blocks` runs the same blocks in the same order on the same GEMM shapes: ``torch.equal`` on both
latents. ComfyUI 0.3.64 has no H3: the cases skip there, saying so.
"""
import importlib
import os
from pathlib import Path

import pytest
import torch

from sharddit.parallel.random_weights import random_state_dict

pytestmark = pytest.mark.comfy

# A tiny H3 (0.33's class at 64 wide, 4 heads of 16 (uneven over 3 ranks), 3 blocks, a 1-block text refiner)
TINY = dict(hidden_size=64, num_layers=3, token_refiner_num_layers=1, num_attention_heads=4, attention_head_dim=16,
            ffn_hidden_size=96, latents_dim=24, audio_latents_dim=32, text_dim=40, timestep_input_dim=32,
            time_embed_hidden_size=64, time_embed_dim=32, rope_inv_freq_len=2)  # rotates 12 of 16 dims (3 axes x 2 x 2)


def _version() -> str:
    path = Path(os.environ.get("COMFYUI_PATH", "")) / "comfyui_version.py"
    text = path.read_text(encoding="utf-8") if path.is_file() else ""
    return text.rsplit("=", 1)[-1].strip().strip('"') if "__version__" in text else "unknown"


def h3_class():
    """0.33's ``MiniMaxH3Model``, or a skip on ComfyUI 0.3.x (which has none)."""
    try:
        return importlib.import_module("comfy.ldm.minimax.model").MiniMaxH3Model
    except ImportError:
        if _version().startswith("0.3."):
            pytest.skip(f"ComfyUI {_version()} has no MiniMax H3 (added after ComfyUI 0.3.64)")
        raise


def tiny_h3_state_dict(seed: int = 0) -> dict:
    import comfy.ops

    meta = h3_class()(**TINY, device="meta", dtype=torch.float32, operations=comfy.ops.disable_weight_init)
    return random_state_dict(meta, seed=seed)


class _AVLatent:
    """H3's latent as core's ``EmptyMiniMaxH3LatentAV`` makes it: a ``NestedTensor`` of the video
    (24 channels, 2 latent frames of 4x4) and the audio (32 x 2 channels, 8 steps = 5 frames x 5/3)."""

    def clone(self):
        from comfy.nested_tensor import NestedTensor

        return NestedTensor([torch.zeros(1, 24, 2, 4, 4), torch.zeros(1, 32, 2, 8)])


@pytest.fixture(scope="module")
def h3_model(env):
    from harness.sampling import load

    model = load(env, tiny_h3_state_dict())
    assert type(model.model.diffusion_model).__name__ == "MiniMaxH3Model"
    return model


@pytest.mark.parametrize("cfg", [1.0, 3.0])
def test_h3_blocks_through_sharddit_ksampler_equals_core(env, h3_model, cfg):
    from harness.sampling import ours, stock

    extras = {"tokens": 8, "dim": TINY["text_dim"]}
    ref = stock(env, h3_model, _AVLatent(), extras, cfg=cfg)
    assert all(torch.isfinite(t).all() and t.abs().max() > 0 for t in ref.tensors)
    for devices in ("cpu,cpu", "cpu,cpu,cpu"):
        got = ours(env, h3_model, _AVLatent(), extras, devices, cfg=cfg, parallel="blocks")
        assert len(got.tensors) == 2
        assert all(torch.equal(a, b) for a, b in zip(got.tensors, ref.tensors, strict=True)), devices
        (state,) = h3_model.model.__dict__["_sharddit_states"].values()
        assert state.router.stats.blocks_run == TINY["num_layers"], devices


def test_plan_h3_fp8_on_four_24gib_gpus(env, capsys):
    """The issue's `plan`: MiniMax H3 fp8 at 1280x704, 121 frames on 4 x 24 GiB: a per-GPU table (the DiT's
    33B in 1-byte weights fits no single card) and the Qwen3-VL 32B text encoder's line beside it."""
    import re

    from sharddit.loaders.cli.main import main

    h3_class()
    four = ",".join(f"cuda:{i}=24GiB" for i in range(4))
    rc = main(["plan", "--model", "minimax-h3-fp8", "--devices", four, "--size", "1280x704", "--frames", "121"])
    out = capsys.readouterr().out
    assert rc in (0, 3), out
    rows = re.findall(r"^(cuda:\d) \| (home \+ )?blocks (\d+)-(\d+) +\| +([\d.]+) \|", out, re.MULTILINE)
    assert len(rows) >= 2, out  # 31 GiB of fp8 weights: two GPUs at least
    assert rows[0][2] == "0" and rows[-1][3] == "49"  # every one of the 50 blocks placed, in order
    assert abs(sum(float(r[4]) for r in rows) - 33.12e9 / 2**30) < 0.3  # ~1 byte per parameter
    assert re.search(r"^text encoder: Qwen3-VL 32B \(H3's 50 layers\) 48\.0 GiB bf16 \(24\.0 fp8, 25\.8B", out,
                     re.MULTILINE), out
    assert "Strategies (cfg 1: cond only, batch 1)" in out  # core samples H3 on the prompt alone


@pytest.mark.parametrize("cfg", [1.0, 3.0])
@pytest.mark.parametrize("devices", ["cpu,cpu", "cpu,cpu,cpu"])
def test_h3_sequence_matches_core(env, h3_model, cfg, devices):
    """`sequence` cuts H3's packed rows (text, audio and video tokens of one sample) into contiguous
    ranges, one per rank, with the modulation ranges (``mod_segments``) renumbered per rank; Ulysses
    attention gives each rank every row for its heads (4 heads over 3 ranks: 2, 1, 1). ComfyUI runs
    cond and uncond as separate batch-1 calls, so at cfg > 1 every call is a token split too. Both
    latents against core's KSampler under the pack's bound for token splits."""
    from harness.numerics import COMFY_SPLIT_BOUND, assert_split_close
    from harness.sampling import ours, stock

    extras = {"tokens": 8, "dim": TINY["text_dim"]}
    ref = stock(env, h3_model, _AVLatent(), extras, cfg=cfg)
    got = ours(env, h3_model, _AVLatent(), extras, devices, cfg=cfg, parallel="sequence")
    (state,) = h3_model.model.__dict__["_sharddit_states"].values()
    stats = state.router.engine.stats  # the token split ran (no fallback to whole blocks)
    n = devices.count(",") + 1
    assert stats.fallbacks == 0 and stats.blocks_run == [TINY["num_layers"]] * n, stats
    assert [len(r) for _, r in stats.groups] == [n]  # one group: every rank splits the one sample
    for a, b, what in zip(got.tensors, ref.tensors, ("video", "audio"), strict=True):
        assert_split_close(a, b, COMFY_SPLIT_BOUND, f"MiniMax H3 {what} {devices} cfg {cfg}")
