"""Where HunyuanVideo puts its text tokens, read off the installed ComfyUI's code (token_order.py).

The reader parses the model's code; the oracle here is independent of it: the rotary table core
hands its first double block. HunyuanVideo's text position ids are all zero, so the text rows of
that table are identity rotations, and so is the first image token's (position 0, 0, 0) but not
the next ones: the identity rows sit at the start (text first, ComfyUI >= 0.14) or at the end
(text after the image tokens, 0.3.64). A model whose order cannot be read runs in blocks mode.
"""
import logging

import pytest
import torch
from harness.sampling import load, ours, stock

from sharddit.loaders.comfy.models.model_params import fit_params
from sharddit.loaders.comfy.models.specs import find_arch_spec
from sharddit.loaders.comfy.models.token_order import IMAGE_FIRST, TEXT_FIRST, read_text_order

pytestmark = pytest.mark.comfy

TEXT_TOKENS = 5
CONFIG = dict(in_channels=16, out_channels=16, vec_in_dim=32, context_in_dim=32, hidden_size=64, mlp_ratio=4.0,
              num_heads=2, depth=1, depth_single_blocks=1, axes_dim=[8, 12, 12], theta=256, patch_size=[1, 2, 2],
              qkv_bias=True, guidance_embed=True, byt5=False, meanflow=False)


class _Probed(Exception):
    pass


@pytest.fixture(scope="module")
def hunyuan(comfy_env):
    import comfy.ldm.hunyuan_video.model as hv
    import comfy.ops

    cls = hv.HunyuanVideo
    return cls(**fit_params(cls, CONFIG), operations=comfy.ops.manual_cast).eval()


def _rotary_order(dit) -> str:
    """The order core's own forward builds: from the rotary table its first double block gets."""
    seen = {}

    def probe(args, extra):
        seen.update(pe=args["pe"], txt=args["txt"].shape[1], img=args["img"].shape[1])
        raise _Probed

    opts = {"patches_replace": {"dit": {("double_block", 0): probe}}}
    x = torch.zeros(1, 16, 2, 8, 8)
    with torch.no_grad(), pytest.raises(_Probed):
        dit(x, torch.tensor([0.5]), torch.zeros(1, TEXT_TOKENS, 32), y=torch.zeros(1, 32),
            guidance=torch.tensor([3.0]), transformer_options=opts)
    pe, t, n = seen["pe"], seen["txt"], seen["img"]
    assert t == TEXT_TOKENS and pe.shape[2] == t + n
    identity = (pe[0, 0] == torch.eye(2)).flatten(1).all(dim=1)  # per token
    if identity[:t].all() and not identity[t:].all():
        return TEXT_FIRST
    assert identity[n:].all() and not identity[:n].all(), "rotary table: text rows found at neither end"
    return IMAGE_FIRST


def test_order_read_from_the_code_is_the_order_of_the_rotary_table(hunyuan):
    assert read_text_order(hunyuan) == _rotary_order(hunyuan)
    specs, why = find_arch_spec("HunyuanVideo").sequence_specs(hunyuan)
    assert why == "" and {s.text_first for s in specs} == {read_text_order(hunyuan) == TEXT_FIRST}


def _unreadable(dit):
    """``dit`` as a HunyuanVideo whose forward ShardDiT cannot read (a pack wrapping it, say)."""
    base = type(dit)

    def forward_orig(self, *args, **kwargs):
        return base.forward_orig(self, *args, **kwargs)

    cls = type("HunyuanVideo", (base,), {"forward_orig": forward_orig})
    dit.__class__ = cls
    return base


def test_unreadable_order_refuses_sequence(hunyuan):
    base = _unreadable(hunyuan)
    try:
        assert read_text_order(hunyuan) is None
        specs, why = find_arch_spec("HunyuanVideo").sequence_specs(hunyuan)
        assert specs is None and "blocks mode only" in why and "text tokens" in why
    finally:
        hunyuan.__class__ = base


def test_unreadable_order_samples_in_blocks_mode_like_core(comfy_env, tiny_models, caplog):
    """``parallel=sequence`` on such a model: blocks mode, logged, the same latents as core."""
    from harness.tiny_models import hunyuan_video_state_dict

    g = torch.Generator().manual_seed(7)
    extras = {"pooled_output": torch.randn(1, 768, generator=g)}
    model = load(comfy_env, hunyuan_video_state_dict())
    latent = torch.zeros(1, 16, 2, 8, 8)
    ref = stock(comfy_env, model, latent, extras, cfg=1.0)
    dit = model.get_model_object("diffusion_model")
    base = _unreadable(dit)
    try:
        with caplog.at_level(logging.INFO, logger="sharddit"):
            got = ours(comfy_env, model, latent, extras, "cpu,cpu", cfg=1.0, parallel="sequence")
    finally:
        dit.__class__ = base
    assert torch.equal(got, ref)
    text = caplog.text
    assert "cannot read where this ComfyUI's HunyuanVideo puts its text tokens" in text
    assert "parallel sequence -> blocks: HunyuanVideo runs in blocks mode only" in text
