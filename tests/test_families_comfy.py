"""The families ComfyUI added after 0.3.64, sharded in `blocks` mode by class through the registry.

Each case builds ComfyUI's own class (0.29.0) at a tiny size with seeded random weights on CPU and
runs one forward as ComfyUI's sampler calls it, unsharded, then with its blocks spread over two
ranks on ``cpu`` with the layout the registry gives (``get_arch_spec``): the same blocks in the same
order on the same GEMM shapes, so ``torch.equal``. The same layout on fake ``cuda:0``/``cuda:1``
(FakeTensorMode) must run without the device-mismatch error a real two-GPU run would raise, which
checks the stream arguments and the points where the model runs code at home between blocks
(WanDancer after its music layers; the router itself brings the stream home after the last block
of each list, so Kandinsky 5's text tokens reach its visual blocks from home). `sequence` on these
families falls back to `blocks` with the family's reason; end to end, Kandinsky 5 through core's
loader and ShardDiT's KSampler equals core's KSampler in both modes. HunyuanVideo 1.5 (the
``HunyuanVideo`` class, which runs `sequence`) is proven against core's sampler in `sequence`.
ComfyUI 0.3.64 has none of these: there the cases skip, saying so.
"""
import dataclasses
import os
from pathlib import Path

import pytest
import torch
from harness.comfy_ldm import attention_override, import_comfy_ldm

from sharddit.parallel.blocks.sharding import attach_block_sharding
from sharddit.parallel.placement.sizing import get_blocks
from sharddit.parallel.random_weights import random_state_dict
from sharddit.parallel.simulate import fake_device_mode, materialize_planned

pytestmark = pytest.mark.comfy
B, T, H, W = 2, 2, 8, 8  # cond+uncond, latent frames, latent height/width (WanDancer: 8k tokens a frame)


def _comfy_version() -> str:
    path = Path(os.environ.get("COMFYUI_PATH", "")) / "comfyui_version.py"
    text = path.read_text(encoding="utf-8") if path.is_file() else ""
    return text.rsplit("=", 1)[-1].strip().strip('"') if "__version__" in text else "unknown"


def _class(module: str, name: str):
    """ComfyUI's class, or a skip on a ComfyUI older than 0.29.0 (where these families are absent)."""
    import importlib

    try:
        return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError):
        version = _comfy_version()
        if version.startswith("0.3."):
            pytest.skip(f"ComfyUI {version} has no {module}.{name} (added after ComfyUI 0.3.64)")
        raise


def _ops(comfy, device):
    return dict(device=device, dtype=torch.float32, operations=comfy.ops.disable_weight_init)


def _ltxav(comfy, device, new):
    cls = _class("comfy.ldm.lightricks.av_model", "LTXAVModel")
    dit = cls(in_channels=16, audio_in_channels=128, cross_attention_dim=64, audio_cross_attention_dim=32,
              attention_head_dim=8, audio_attention_head_dim=8, num_attention_heads=8, audio_num_attention_heads=4,
              caption_channels=32, num_layers=4, connector_attention_head_dim=8, connector_num_attention_heads=4,
              **_ops(comfy, device))
    # (the text connectors default to 3840 wide, 709M parameters: 76 s to fill with random values; sized
    # to caption_channels here, 4 x 8 = 32)
    # x = [video latent, audio latent (8 channels x 16 bins)]; context = video + audio caption channels
    return dit, lambda: (([new(B, 16, T, H, W), new(B, 8, 5, 16)], new(B).abs(), new(B, 7, 64)), {"frame_rate": 25})


def _kandinsky5(comfy, device, new):
    cls = _class("comfy.ldm.kandinsky5.model", "Kandinsky5")
    dit = cls(in_visual_dim=16, out_visual_dim=16, in_text_dim=32, in_text_dim2=24, time_dim=32, model_dim=64,
              ff_dim=128, visual_embed_dim=64, patch_size=(1, 2, 2), num_text_blocks=2, num_visual_blocks=2,
              axes_dims=(8, 12, 12), **_ops(comfy, device))
    return dit, lambda: ((new(B, 16, T, H, W), new(B).abs(), new(B, 7, 32), new(B, 24)), {})


_WAN = dict(patch_size=(1, 2, 2), dim=64, ffn_dim=128, freq_dim=256, text_dim=32, num_heads=2, num_layers=4,
            in_dim=16, out_dim=16, qk_norm=True, cross_attn_norm=True, eps=1e-6)


def _scail(comfy, device, new):
    cls = _class("comfy.ldm.wan.model", "SCAILWanModel")
    dit = cls(**_WAN, **_ops(comfy, device))
    return dit, lambda: ((new(B, 16, T, H, W), new(B).abs(), new(B, 7, 32)), {"clip_fea": new(B, 257, 1280)})


def _wandancer(comfy, device, new):
    cls = _class("comfy.ldm.wan.model_wandancer", "WanDancerModel")
    dit = cls(**_WAN, audio_inject_layers=[0, 2], music_dim=32, music_heads=2, music_feature_dim=35,
              music_latent_dim=32, **_ops(comfy, device))
    return dit, lambda: ((new(B, 16, T, H, W), new(B).abs(), new(B, 7, 32)), {"audio_embed": new(B, 4 * T, 35)})


def _hunyuan15(comfy, device, new, latent_channels=16):
    from sharddit.loaders.comfy.models.model_params import fit_params

    cls = comfy.ldm.hunyuan_video.model.HunyuanVideo
    params = _class("comfy.ldm.hunyuan_video.model", "HunyuanVideoParams")
    if "vision_in_dim" not in params.__dataclass_fields__:
        pytest.skip(f"ComfyUI {_comfy_version()} has no HunyuanVideo 1.5 parameters (added after ComfyUI 0.3.64)")
    # HunyuanVideo 1.5's shape (comfy/supported_models.py HunyuanVideo15; model_detection.py): double
    # blocks only, no pooled vector, no guidance input, cond-type embedding and a vision projection
    # (as loaded from a file: latent 32 channels + 32 image + 1 mask in, ComfyUI's vision width 1152)
    c = latent_channels
    cfg = dict(in_channels=2 * c + 1 if c == 32 else c, out_channels=c, vec_in_dim=None, context_in_dim=32,
               hidden_size=256, mlp_ratio=4.0, num_heads=2, depth=3, depth_single_blocks=0, axes_dim=[16, 56, 56],
               theta=256, patch_size=[1, 2, 2], qkv_bias=True, guidance_embed=False, byt5=False, meanflow=False,
               use_cond_type_embedding=True, vision_in_dim=1152 if c == 32 else 32, meanflow_sum=True)
    dit = cls(**fit_params(cls, cfg), **_ops(comfy, device))
    return dit, lambda: ((new(B, 16, T, H, W), new(B).abs(), new(B, 7, 32)), {})


def _minimax_h3(comfy, device, new):
    from test_minimax_h3_comfy import TINY, h3_class

    dit = h3_class()(**TINY, **_ops(comfy, device)).requires_grad_(False)  # as loaded: kitchen's rope is in place
    # batch 1 (H3's only batch size): [video 24 x T x H x W, audio 32 x 2 x 8 steps], sigma x 1000, Qwen3-VL states
    return dit, lambda: (([new(1, 24, T, H, W), new(1, 32, 2, 8)], new(1).abs() * 500, new(1, 7, 40)), {})


CASES = {"MiniMaxH3Model": (_minimax_h3, 3), "LTXAVModel": (_ltxav, 4), "Kandinsky5": (_kandinsky5, 4), "SCAILWanModel": (_scail, 4),
         "WanDancerModel": (_wandancer, 4), "HunyuanVideo 1.5": (_hunyuan15, 3)}


@pytest.fixture(scope="module")
def comfy():
    return import_comfy_ldm()


def _forward(dit, inputs, fake=False):
    """One call as ComfyUI's sampler makes it; on fake devices attention is the output-only stand-in."""
    args, kwargs = inputs()
    options = {"optimized_attention_override": attention_override} if fake else {}
    return dit(*args, transformer_options=options, **kwargs)


def _seeded(*shape):
    return torch.randn(shape, generator=_GEN)


_GEN = torch.Generator()


def _real(comfy, build):
    """The model on CPU with the pack's deterministic random weights (``parallel/random_weights.py``)."""
    dit, inputs = build(comfy, "cpu", _seeded)
    dit.load_state_dict(random_state_dict(dit, seed=0, dtype=torch.float32))
    return dit, inputs


def _flat(out):
    return torch.cat([o.flatten() for o in out]) if isinstance(out, (list, tuple)) else out.flatten()


@pytest.mark.parametrize("name", list(CASES))
def test_family_blocks_on_two_ranks_equal_unsharded(comfy, name):
    from sharddit.loaders.comfy.models.specs import find_arch_spec, get_arch_spec

    build, n_blocks = CASES[name]
    dit, inputs = _real(comfy, build)
    layout = get_arch_spec(dit)
    _GEN.manual_seed(1)
    with torch.no_grad():
        ref = _flat(_forward(dit, inputs))
    devices = [torch.device("cpu")] * n_blocks
    assert len(get_blocks(dit, layout)) == n_blocks
    handle = attach_block_sharding(dit, layout, devices, torch.device("cpu"))
    try:
        _GEN.manual_seed(1)
        with torch.no_grad(), handle.router.forward_scope():
            got = _flat(_forward(dit, inputs))
    finally:
        handle.detach()
    assert handle.stats.blocks_run == n_blocks
    assert torch.isfinite(ref).all() and ref.abs().max() > 0
    assert torch.equal(got, ref)
    specs, why = find_arch_spec(type(dit).__name__).sequence_specs(dit)
    if name not in ("HunyuanVideo 1.5", "MiniMaxH3Model", "Kandinsky5", "LTXAVModel"):  # these run `sequence`
        # (test_sequence_comfy.py, test_minimax_h3_comfy.py, the Kandinsky 5 test below, test_ltx2_sequence_comfy.py)
        assert specs is None and why.startswith(find_arch_spec(type(dit).__name__).name + " runs in blocks mode only")


# HunyuanVideo 1.5's forward calls ``cond_type_embedding.to(device)``, which FakeTensorMode cannot swap;
# its class's layout on fake GPUs is test_specs_variants_comfy.py's and test_specs_fake_gpu.py's.
# LTX-2 passes its per-frame timesteps to the blocks as ComfyUI's ``CompressedTimestep`` (an object
# with tensor slots): the router's nested-tensor map carries it to each block's device
# (``parallel/tensor_map``: slotted data objects); without that this case raises the device mismatch.
# MiniMax H3's forward reads its timesteps as Python floats (``float(1 - sigma)``): its fake run reads
# them as the simulator's stand-ins (``fake_device_mode(scalars=True)``).
FAKE = [n for n in CASES if n != "HunyuanVideo 1.5"]
SCALARS = {"MiniMaxH3Model"}


@pytest.mark.parametrize("name", FAKE)
def test_family_layout_on_fake_gpus_brings_home_in_time(comfy, name):
    """Half the blocks on fake cuda:1, the model's home on cuda:0: a stream argument or a return-home
    point the registry got wrong raises the device mismatch a real two-GPU run would."""
    from sharddit.loaders.comfy.models.specs import get_arch_spec

    build, n_blocks = CASES[name]
    home = torch.device("cuda:0")
    dit, inputs = build(comfy, "meta", lambda *s: torch.empty(s, device=home))
    layout = get_arch_spec(dit)
    devices = [torch.device("cuda:0")] * (n_blocks // 2) + [torch.device("cuda:1")] * (n_blocks - n_blocks // 2)
    swap = torch.__future__.get_swap_module_params_on_conversion()
    torch.__future__.set_swap_module_params_on_conversion(False)  # forwards that call .to() (TESTING.md)
    try:
        out = _fake_forward(dit, layout, devices, home, inputs, name in SCALARS)
        if layout.return_home_after:  # without the model's own return-home points it fails
            broken = dataclasses.replace(layout, return_home_after=frozenset())
            with pytest.raises(Exception, match="same device"):
                _fake_forward(dit, broken, devices, home, inputs, name in SCALARS)
    finally:
        torch.__future__.set_swap_module_params_on_conversion(swap)
    assert all(o.device == home for o in (out if isinstance(out, (list, tuple)) else [out]))


def _fake_forward(dit, layout, devices, home, inputs, scalars=False):
    with fake_device_mode(scalars):
        materialize_planned(dit, get_blocks(dit, layout), devices, home)
        handle = attach_block_sharding(dit, layout, devices, home)
        try:
            with handle.router.forward_scope():
                out = _forward(dit, inputs, fake=True)
        finally:
            handle.detach()
    assert handle.stats.blocks_run == len(devices)
    return out


def test_causal_wan_is_refused_with_the_reason():
    from sharddit.loaders.comfy.models.specs import find_arch_spec

    with pytest.raises(ValueError, match="CausalWanModel.*key/value cache in place"):
        find_arch_spec("CausalWanModel")


@pytest.mark.parametrize("cfg", [1.0, 3.0])
def test_kandinsky5_through_sharddit_ksampler_equals_core(env, cfg):
    """End to end on ComfyUI's own loader and sampler: a tiny Kandinsky 5 file's state dict, core's
    KSampler against ShardDiT's on ``cpu,cpu`` and ``cpu,cpu,cpu``. `blocks` is the unsharded maths:
    ``torch.equal``. `sequence` runs the text blocks whole (``TokenSpec.whole``: the text alone, before
    the video exists) and splits the visual blocks' tokens (Ulysses self-attention, cross-attention
    to the whole text on each rank's rows): within the pack's bound for token splits, no fallback."""
    from harness.numerics import COMFY_SPLIT_BOUND, assert_split_close
    from harness.sampling import load, ours, stock

    import comfy.ops

    cls = _class("comfy.ldm.kandinsky5.model", "Kandinsky5")
    # ComfyUI's detection keeps the defaults in_text_dim 3584 (Qwen2.5-VL) and in_text_dim2 768 (CLIP-L),
    # and visual_embed_dim 132 = (16 latent + 16 image + 1 mask channels) x 1 x 2 x 2 (concat_cond)
    meta = cls(time_dim=32, model_dim=64, ff_dim=128, num_text_blocks=2, num_visual_blocks=2,
               device="meta", dtype=torch.float32, operations=comfy.ops.disable_weight_init)
    model = load(env, random_state_dict(meta, seed=0))
    assert type(model.model.diffusion_model).__name__ == "Kandinsky5"
    extras = {"tokens": 8, "dim": 3584, "pooled_output": torch.randn(1, 768, generator=torch.Generator().manual_seed(7))}
    latent = torch.zeros(1, 16, 2, 8, 8)
    ref = stock(env, model, latent, extras, cfg=cfg)
    for devices in ("cpu,cpu", "cpu,cpu,cpu"):
        assert torch.equal(ours(env, model, latent, extras, devices, cfg=cfg, parallel="blocks"), ref), devices
        (state,) = model.model.__dict__["_sharddit_states"].values()
        assert state.router.stats.blocks_run == 4, devices  # the shards ran
        got = ours(env, model, latent, extras, devices, cfg=cfg, parallel="sequence")
        stats = state.router.engine.stats
        n = devices.count(",") + 1
        assert stats.fallbacks == 0 and stats.blocks_run == [2] * n, stats  # each rank ran both visual blocks
        assert sum(stats.exchanges) > 0 or cfg > 1 and n == 2  # Ulysses ran (cfg > 1 on 2: one sample each)
        assert_split_close(got, ref, COMFY_SPLIT_BOUND, f"Kandinsky 5 {devices} cfg {cfg}")


class _AVLatent:
    """LTX-2's latent as ComfyUI's sampler takes it: one ``NestedTensor`` of (video, audio), made
    fresh for each run (the harness clones the latent it is given)."""

    def clone(self):
        from comfy.nested_tensor import NestedTensor

        return NestedTensor([torch.zeros(1, 128, 2, 4, 4), torch.zeros(1, 8, 5, 16)])


@pytest.mark.parametrize("cfg", [1.0, 3.0])
def test_ltx2_through_sharddit_ksampler_equals_core(env, cfg):
    """LTX-2.3 end to end on ComfyUI's own loader and sampler: a tiny ``LTXAVModel`` (LTX-2.3's gated
    attention and cross-attention AdaLN, 3 dual-stream blocks; ``harness.tiny_templates``'s
    configuration) on a (video, audio) latent; core's KSampler against ShardDiT's on ``cpu,cpu``
    and ``cpu,cpu,cpu`` in `blocks`: the unsharded maths, ``torch.equal`` on both latents (`sequence`:
    test_ltx2_sequence_comfy.py)."""
    import json

    _class("comfy.ldm.lightricks.av_model", "LTXAVModel")  # or the skip on 0.3.64
    import comfy.sd
    from harness import tiny_templates
    from harness.sampling import ours, stock

    config = dict(tiny_templates.ltx23_transformer_config(64, 32), num_layers=3)
    sd = random_state_dict(tiny_templates.ltxav_dit(config), seed=0)
    model = comfy.sd.load_diffusion_model_state_dict(sd, metadata={"config": json.dumps({"transformer": config})})
    assert type(model.model.diffusion_model).__name__ == "LTXAVModel"
    extras = {"tokens": 8, "dim": 64 + 32, "frame_rate": 25.0}  # the text projection's video + audio features
    ref = stock(env, model, _AVLatent(), extras, cfg=cfg)
    for devices in ("cpu,cpu", "cpu,cpu,cpu"):
        got = ours(env, model, _AVLatent(), extras, devices, cfg=cfg, parallel="blocks")
        assert len(got.tensors) == 2
        assert all(torch.equal(a, b) for a, b in zip(got.tensors, ref.tensors, strict=True)), devices
        (state,) = model.model.__dict__["_sharddit_states"].values()
        assert state.router.stats.blocks_run == 3, devices


@pytest.mark.parametrize("cfg", [1.0, 3.0])
@pytest.mark.parametrize("devices", ["cpu,cpu", "cpu,cpu,cpu"])
def test_hunyuan15_sequence_matches_core(env, cfg, devices):
    """HunyuanVideo 1.5 is ComfyUI's ``HunyuanVideo`` class with 1.5's configuration (detected as
    ``supported_models.HunyuanVideo15``): double blocks only, the Qwen2.5-VL text after a cond-type
    embedding, text before the image tokens. `sequence` splits its 128 image tokens as for
    HunyuanVideo (the text replicated on every rank); compared with core's KSampler under the
    pack's measured bound for token and cond/uncond splits (``COMFY_SPLIT_BOUND``); `blocks`
    bit-identical."""
    from harness.numerics import COMFY_SPLIT_BOUND, assert_split_close
    from harness.sampling import load, ours, stock

    dit, _ = _hunyuan15(import_comfy_ldm(), "meta", None, latent_channels=32)
    model = load(env, random_state_dict(dit, seed=0))
    assert type(model.model).__name__ == "HunyuanVideo15"
    pooled = torch.randn(1, 768, generator=torch.Generator().manual_seed(7))  # core's encode_adm reads it
    extras = {"tokens": 8, "dim": 32, "pooled_output": pooled}
    latent = torch.zeros(1, 32, 2, 8, 8)
    ref = stock(env, model, latent, extras, cfg=cfg)
    got = ours(env, model, latent, extras, devices, cfg=cfg, parallel="sequence")
    (state,) = model.model.__dict__["_sharddit_states"].values()
    stats = state.router.engine.stats  # the token split ran (no fallback to whole blocks)
    assert stats.fallbacks == 0 and sum(stats.blocks_run) == 3 * len(stats.blocks_run)
    assert_split_close(got, ref, COMFY_SPLIT_BOUND, f"HunyuanVideo 1.5 {devices} cfg {cfg}")
    # blocks mode: every GEMM keeps core's shapes, so bit-identical
    assert torch.equal(ours(env, model, latent, extras, devices, cfg=cfg, parallel="blocks"), ref)
