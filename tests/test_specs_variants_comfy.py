"""Architecture specs for ComfyUI's Wan variants (and Flux), on tiny configs over fake GPUs.

Each variant runs ONE forward with its own conditioning on fake ``cuda:0..2``, with the blocks
that are followed by inter-block code placed off the home device: the spec's
``return_home_after`` must bring the hidden state home in time, and the same run with it emptied
must fail with the device-mismatch error a real multi-GPU run would raise.
"""
import dataclasses

import pytest
import torch
from harness.comfy_ldm import attention_override, import_comfy_ldm

from sharddit.parallel.blocks.sharding import attach_block_sharding
from sharddit.parallel.simulate import fake_device_mode, materialize_planned
from sharddit.parallel.placement.sizing import get_blocks

pytestmark = pytest.mark.comfy
HOME = torch.device("cuda:0")
TINY = dict(patch_size=(1, 2, 2), dim=64, ffn_dim=128, freq_dim=256, text_dim=32, num_heads=2,
            num_layers=10, in_dim=16, out_dim=16, qk_norm=True, cross_attn_norm=True, eps=1e-6)
DEVICES = [torch.device(f"cuda:{i}") for i in (0, 0, 1, 1, 1, 1, 2, 2, 2, 2)]
B, T = 2, 3  # batch (cond+uncond), latent frames


@pytest.fixture(scope="module")
def comfy():
    return import_comfy_ldm()


def _empty(*shape):
    return torch.empty(shape, device=HOME)


def _vace(comfy):
    dit = comfy.ldm.wan.model.VaceWanModel(**TINY, vace_layers=5, vace_in_dim=16, **_meta(comfy))
    return dit, lambda: {"vace_context": _empty(B, 1, 16, T, 8, 8), "vace_strength": [1.0]}


def _s2v(comfy):
    dit = comfy.ldm.wan.model.WanModel_S2V(**TINY, audio_dim=32, audio_inject_layers=[0, 3, 7], **_meta(comfy))
    return dit, lambda: {"audio_embed": _empty(B, 25, 32, 4 * T)}


def _animate(comfy):
    dit = comfy.ldm.wan.model_animate.AnimateWanModel(**TINY, **_meta(comfy))

    def extra():  # the face motion encoder is skipped: its output goes straight to the blocks
        motion = _empty(B, T, 4, TINY["dim"])
        dit.after_patch_embedding = lambda x, pose, face: (x, motion)
        return {}
    return dit, extra


def _camera(comfy):
    dit = comfy.ldm.wan.model.CameraWanModel(**TINY, **_meta(comfy))
    return dit, lambda: {"clip_fea": _empty(B, 257, 1280)}


def _humo(comfy):
    return comfy.ldm.wan.model.HumoWanModel(**TINY, **_meta(comfy)), lambda: {}


def _t2v(comfy):
    return comfy.ldm.wan.model.WanModel(model_type="t2v", **TINY, **_meta(comfy)), lambda: {}


def _meta(comfy):
    return dict(device="meta", dtype=torch.float32, operations=comfy.ops.disable_weight_init)


# builder, expected return_home_after, hops: 3 (into cuda:1 at 2, into cuda:2 at 6, home after 9)
# + 2 per return home off-home followed by a block on the same device (out and back in)
# + 1 when the next block is on another device anyway (Animate: home after 5, then cuda:2 at 6)
VARIANTS = {
    "WanModel": (_t2v, set(), 3),
    "VaceWanModel": (_vace, {0, 2, 4, 6, 8}, 3 + 2 * 4),
    "WanModel_S2V": (_s2v, {0, 3, 7}, 3 + 2 * 2),
    "AnimateWanModel": (_animate, {0, 5}, 3 + 1),
    "CameraWanModel": (_camera, set(), 3),
    "HumoWanModel": (_humo, set(), 3),
}


def _run(dit, layout, extra):
    materialize_planned(dit, get_blocks(dit, layout), DEVICES, HOME)
    handle = attach_block_sharding(dit, layout, DEVICES, HOME)
    try:
        with handle.router.forward_scope():
            out = dit(_empty(B, 16, T, 8, 8), _empty(B), _empty(B, 7, TINY["text_dim"]),
                      transformer_options={"optimized_attention_override": attention_override}, **extra())
        return out, handle
    finally:
        handle.detach()


@pytest.mark.parametrize("name", list(VARIANTS))
def test_wan_variant_spec_routes_inter_block_code(comfy, name):
    from sharddit.loaders.comfy.models.specs import get_arch_spec

    build, home_after, hops = VARIANTS[name]
    dit, extra = build(comfy)
    assert type(dit).__name__ == name
    layout = get_arch_spec(dit)
    assert layout.block_lists == ("blocks",) and layout.return_home_after == home_after
    with fake_device_mode():
        out, handle = _run(dit, layout, extra)
        assert out.device == HOME and out.shape == (B, 16, T, 8, 8)
    assert handle.stats.blocks_run == 10
    assert handle.stats.hops == hops == handle.router.planned_hops()
    if home_after:
        broken = dataclasses.replace(layout, return_home_after=frozenset())
        with fake_device_mode(), pytest.raises(Exception, match="on the same device"):
            _run(dit, broken, extra)


def test_flux_spec_matches_block_signatures(comfy):
    from sharddit.loaders.comfy.models.specs import get_arch_spec

    from sharddit.loaders.comfy.models.model_params import fit_params

    cls = comfy.ldm.flux.model.Flux
    dit = cls(**fit_params(cls, dict(
        in_channels=16, out_channels=16, vec_in_dim=32, context_in_dim=32, hidden_size=64, mlp_ratio=4.0,
        num_heads=2, depth=2, depth_single_blocks=2, axes_dim=[8, 12, 12], theta=10000, patch_size=2,
        qkv_bias=True, guidance_embed=False)), **_meta(comfy))
    layout = get_arch_spec(dit)
    handle = attach_block_sharding(dit, layout, ["meta"] * 4, "meta")
    slots = [p._sharddit_slot for path in layout.block_lists for p in getattr(dit, path)]
    handle.detach()
    assert [(s.stream_pos, sorted(s.stream_names)) for s in slots] == [((0, 1), ["img", "txt"])] * 2 + [((0,), ["x"])] * 2
    assert layout.home_every_block_kwargs == ("control",)



@pytest.mark.parametrize("with_control", [False, True])
def test_hunyuan_controlnet_brings_every_block_home(comfy, with_control):
    from sharddit.loaders.comfy.models.specs import get_arch_spec
    from sharddit.parallel.blocks.sharding import needs_home_every_block

    from sharddit.loaders.comfy.models.model_params import fit_params

    cls = comfy.ldm.hunyuan_video.model.HunyuanVideo
    dit = cls(**fit_params(cls, dict(
        in_channels=16, out_channels=16, vec_in_dim=32, context_in_dim=32, hidden_size=64, mlp_ratio=4.0,
        num_heads=2, depth=2, depth_single_blocks=3, axes_dim=[8, 12, 12], theta=256, patch_size=[1, 2, 2],
        qkv_bias=True, guidance_embed=True, byt5=False, meanflow=False)), **_meta(comfy))
    layout = get_arch_spec(dit)
    devices = [torch.device(f"cuda:{i}") for i in (0, 1, 1, 2, 2)]
    img_tokens = T * 4 * 4
    with fake_device_mode():
        materialize_planned(dit, get_blocks(dit, layout), devices, HOME)
        control = {"input": [_empty(B, img_tokens, 64)] * 2,
                   "output": [_empty(B, img_tokens, 64)] * 3} if with_control else None
        args = (_empty(B, 16, T, 8, 8), _empty(B), _empty(B, 7, 32))
        kwargs = dict(y=_empty(B, 32), guidance=_empty(B), control=control,
                      transformer_options={"optimized_attention_override": attention_override})
        home_all = needs_home_every_block(layout, dit._forward, args, kwargs)
        assert home_all == with_control
        handle = attach_block_sharding(dit, layout, devices, HOME)
        try:
            if with_control:  # without bringing every block home, the ControlNet add fails
                with pytest.raises(Exception, match="on the same device"), handle.router.forward_scope():
                    dit(*args, **kwargs)
            with handle.router.forward_scope(return_home_all=home_all):
                out = dit(*args, **kwargs)
            assert out.device == HOME
        finally:
            handle.detach()
    assert handle.stats.hops == handle.router.planned_hops(return_home_all=home_all)
    # double [0, 1], single [1, 2, 2]: into 1 at block 1, home after it (end of the double list),
    # into 1 at block 2, into 2 at block 3, home after 4 = 5; with control every off-home block
    # goes in and comes home: 2 * 4 = 8
    assert handle.stats.hops == (8 if with_control else 5)
