"""ComfyUI's own video DiTs at their real sizes, sharded by the pack's engine over fake GPUs.

Fake multi-GPU (FakeTensorMode): each model is built on ``meta`` from ComfyUI 0.3.64's classes (Wan 2.1 14B,
LTX-Video 13B, HunyuanVideo 13B), planned by the pack's planner over fake ``cuda:0..N-1``
(N = 2, 4, 8), sharded with ``attach_block_sharding`` and run for ONE forward at 480p x 81 frames,
cond+uncond batch 2, inside ``FakeTensorMode`` (shapes and devices only, no data). A block fed a
tensor from another device raises here exactly where a real multi-GPU run would. Attention runs
through the flash stand-in (ComfyUI's ``optimized_attention_override``): no L x L matrix.

Only ComfyUI's ``comfy`` package is imported (COMFYUI_PATH on sys.path, never the repo root).
"""
import pytest
import torch
from harness.comfy_ldm import attention_override, import_comfy_ldm

from sharddit.parallel.placement.devices import parse_device_plan
from sharddit.parallel.placement.inventory import inventory_from_spec
from sharddit.parallel.placement.planner import plan_placement
from sharddit.parallel.placement.plan_types import Footprint, PlacementRequest
from sharddit.parallel.blocks.routing import BlockRouter
from sharddit.parallel.blocks.sharding import attach_block_sharding
from sharddit.loaders.comfy.models.model_params import fit_params
from sharddit.parallel.simulate import fake_device_mode, materialize_planned
from sharddit.parallel.placement.sizing import compute_block_bytes, compute_non_block_bytes, get_blocks

pytestmark = pytest.mark.comfy
BF16 = torch.bfloat16
HOME = torch.device("cuda:0")

# Real configs, as ComfyUI's model_detection reads them from the released checkpoints.
WAN_14B = dict(model_type="t2v", patch_size=(1, 2, 2), dim=5120, ffn_dim=13824, freq_dim=256, text_dim=4096,
               num_heads=40, num_layers=40, in_dim=16, out_dim=16, qk_norm=True, cross_attn_norm=True, eps=1e-6)
LTXV_13B = dict(in_channels=128, cross_attention_dim=4096, attention_head_dim=128, num_attention_heads=32,
                caption_channels=4096, num_layers=48)
HUNYUAN_13B = dict(in_channels=16, out_channels=16, vec_in_dim=768, context_in_dim=4096, hidden_size=3072,
                   mlp_ratio=4.0, num_heads=24, depth=20, depth_single_blocks=40, axes_dim=[16, 56, 56],
                   theta=256, patch_size=[1, 2, 2], qkv_bias=True, guidance_embed=True, byt5=False, meanflow=False)


@pytest.fixture(scope="module")
def comfy():
    c = import_comfy_ldm()
    return dict(ops=c.ops.disable_weight_init, wan=c.ldm.wan.model, ltxv=c.ldm.lightricks.model,
                hunyuan=c.ldm.hunyuan_video.model)


def _build(comfy, family):
    kw = dict(dtype=BF16, device="meta", operations=comfy["ops"])
    if family == "wan":
        return comfy["wan"].WanModel(**WAN_14B, **kw)
    if family == "ltxv":
        return comfy["ltxv"].LTXVModel(**LTXV_13B, **kw)
    cls = comfy["hunyuan"].HunyuanVideo
    return cls(**fit_params(cls, HUNYUAN_13B), **kw)


# Per family: latent at 480p x 81 (batch 2), text context, extra forward kwargs, and the distinct
# tensor constants every block device needs (transformer_options["sigmas"] included):
#   wan: e0, freqs, context, sigmas | ltxv: timestep, context, sigmas + the tensors of pe (None
#   below: counted from the pe its first block gets: (cos, sin) in ComfyUI 0.3.64, one rotation
#   table in 0.29) | hunyuan: vec, pe, sigmas (txt is a stream of the double blocks)
CASES = {
    "wan": ((2, 16, 21, 60, 104), (2, 512, 4096), {}, 4),
    "ltxv": ((2, 128, 11, 15, 26), (2, 128, 4096), {"attention_mask": None, "frame_rate": 25}, None),
    "hunyuan": ((2, 16, 21, 60, 104), (2, 256, 4096), {"y": (2, 768), "guidance": (2,)}, 3),
}


@pytest.fixture(scope="module")
def models(comfy):
    return {}


def _model(models, comfy, family):
    if family not in models:
        dit = _build(comfy, family)
        from sharddit.loaders.comfy.models.specs import get_arch_spec

        models[family] = (dit, get_arch_spec(dit))
    return models[family]


def _plan(dit, layout, n_dev):
    blocks = compute_block_bytes(dit, layout)
    footprint = Footprint(dit_home_bytes=compute_non_block_bytes(dit, layout), block_bytes=blocks)
    inventory = inventory_from_spec(",".join(f"cuda:{i}=80GiB" for i in range(n_dev)))
    plan = plan_placement(inventory, footprint, PlacementRequest(devices=parse_device_plan(",".join(f"cuda:{i}" for i in range(n_dev)))))
    devices = [None] * len(blocks)
    for r in plan.block_ranges:
        devices[r.start:r.stop] = [torch.device(r.device)] * (r.stop - r.start)
    assert torch.device(plan.home_device) == HOME and None not in devices
    return devices, blocks


def _expected_hops(layout, dit, devices):
    """Per list: into the first block, each device boundary, and back home after the last."""
    hops, g = 0, 0
    for path in layout.block_lists:
        n = len(getattr(dit, path))
        devs = devices[g:g + n]
        hops += (devs[0] != HOME) + sum(a != b for a, b in zip(devs, devs[1:])) + (devs[-1] != HOME)
        g += n
    return hops


def _forward(dit, family):
    latent, context, extra, _ = CASES[family]
    x = torch.empty(latent, dtype=BF16, device=HOME)
    t = torch.empty(latent[0], dtype=torch.float32, device=HOME)
    ctx = torch.empty(context, dtype=BF16, device=HOME)
    kwargs = {k: torch.empty(v, dtype=BF16, device=HOME) if isinstance(v, tuple) else v for k, v in extra.items()}
    opts = {"sigmas": t, "optimized_attention_override": attention_override}
    return dit(x, t, ctx, transformer_options=opts, **kwargs)


def _bytes_by_device(modules):
    seen, out = set(), {}
    for m in modules:
        for t in list(m.parameters()) + list(m.buffers()):
            if id(t) not in seen:
                seen.add(id(t))
                out[t.device] = out.get(t.device, 0) + t.numel() * t.element_size()
    return out


def _run(dit, layout, devices, family):
    """Weights appear on their planned fake devices (as a loader puts them), then the engine attaches."""
    materialize_planned(dit, get_blocks(dit, layout), devices, HOME)
    handle = attach_block_sharding(dit, layout, devices, HOME)
    try:
        with handle.router.forward_scope():
            out = _forward(dit, family)
        return out, handle, _bytes_by_device([dit] + get_blocks(dit, layout))
    finally:
        handle.detach()


@pytest.mark.parametrize("n_dev", [2, 4, 8])
@pytest.mark.parametrize("family", ["wan", "ltxv", "hunyuan"])
def test_real_config_sharded_forward(comfy, models, family, n_dev):
    dit, layout = _model(models, comfy, family)
    devices, block_bytes = _plan(dit, layout, n_dev)
    with fake_device_mode():
        out, handle, per_device = _run(dit, layout, devices, family)
        assert out.device == HOME and out.shape == CASES[family][0]
    stats = handle.stats
    assert stats.blocks_run == len(devices)
    assert stats.hops == _expected_hops(layout, dit, devices) == handle.router.planned_hops()
    if len(layout.block_lists) == 1:
        assert stats.hops == sum(a != b for a, b in zip(devices, devices[1:])) + 1
    used = sorted(set(devices) - {HOME}, key=str)
    constants = CASES[family][3] or 3 + _pe_tensors(dit, layout, devices, family)
    assert stats.copies_by_device == {str(d): constants for d in used}
    expected = {d: sum(b for b, bd in zip(block_bytes, devices) if bd == d) for d in set(devices)}
    expected[HOME] = expected.get(HOME, 0) + compute_non_block_bytes(dit, layout)
    assert per_device == expected


def _pe_tensors(dit, layout, devices, family) -> int:
    """Tensors in the ``pe`` the first block gets (read from a second forward)."""
    seen = []
    hook = get_blocks(dit, layout)[0].register_forward_pre_hook(
        lambda m, args, kwargs: seen.append(kwargs["pe"]), with_kwargs=True)
    try:
        with fake_device_mode():
            _run(dit, layout, devices, family)
    finally:
        hook.remove()
    pe = seen[0]
    return sum(isinstance(t, torch.Tensor) for t in pe) if isinstance(pe, (tuple, list)) else 1


class _ForgetfulRouter(BlockRouter):
    """Broken on purpose: blocks get the home device's constants."""

    def _copy_constant(self, t, dev):
        return t


@pytest.mark.parametrize("family", ["wan", "ltxv", "hunyuan"])
def test_broken_routing_is_caught(comfy, models, family, monkeypatch):
    import sharddit.parallel.blocks.sharding as sharding

    dit, layout = _model(models, comfy, family)
    devices, _ = _plan(dit, layout, 2)
    monkeypatch.setattr(sharding, "BlockRouter", _ForgetfulRouter)
    with fake_device_mode():
        with pytest.raises(Exception, match="on the same device") as err:
            _run(dit, layout, devices, family)
    assert "cuda:1" in str(err.value)
