"""Sharded sampling inside real ComfyUI (in-process, CPU): stock KSampler vs ShardDiTKSampler.

Every comparison is bit-exact (`torch.equal`): on CPU a sharded forward runs the same ops in the
same order as the unsharded one.
"""
import pytest
import torch
from harness.sampling import CFG, SEED
from harness.sampling import cond as _cond, family as _family, load as _load, lora_loader as _lora_loader
from harness.sampling import ours as _ours, sharded as _sharded, stock as _stock

pytestmark = pytest.mark.comfy


@pytest.mark.parametrize("family", ["wan21", "ltxv", "hunyuan_video"])
def test_sharded_ksampler_bit_identical_to_stock(env, tiny, family):
    build, shape, extras = _family(tiny, family)
    model = _load(env, build())
    latent = torch.zeros(shape)
    ref = _stock(env, model, latent, extras)
    for devices in ("cpu,cpu", "cpu,cpu,cpu"):
        got = _ours(env, model, latent, extras, devices)
        assert torch.equal(got, ref), f"{family} on {devices}: max diff {(got - ref).abs().max()}"


def test_wan22_two_experts_ksampler_advanced(env, tiny):
    """Two experts, each sharded, as the KSamplerAdvanced pair Wan 2.2 workflows use."""
    high_sd, low_sd = tiny.wan22_t2v_pair_state_dicts()
    shard = env.nodes.NODE_CLASS_MAPPINGS["ShardDiTShardModel"]
    adv = env.nodes.KSamplerAdvanced()
    latent = {"samples": torch.zeros(1, 16, 2, 8, 8)}

    def run(high, low):
        x = adv.sample(high, "enable", SEED, 4, CFG, "euler", "simple", _cond(), _cond(seed=2), latent, 0, 2,
                       "enable")[0]
        return adv.sample(low, "disable", SEED, 4, CFG, "euler", "simple", _cond(), _cond(seed=2), x, 2, 4,
                          "disable")[0]["samples"]

    high, low = _load(env, high_sd), _load(env, low_sd)
    ref = run(high, low)
    got = run(shard.execute(high, "cpu,cpu", 0.0).result[0], shard.execute(low, "cpu,cpu", 0.0).result[0])
    assert torch.equal(got, ref)


def test_lora_before_and_after_sharding(env, tiny, tmp_path):
    sd = tiny.wan21_t2v_state_dict()
    apply_lora = _lora_loader(env, tiny, tmp_path, sd)
    build, shape, extras = _family(tiny, "wan21")
    latent = torch.zeros(shape)
    base = _load(env, sd)
    plain = _stock(env, base, latent, extras)
    with_lora = apply_lora(base)
    ref = _stock(env, with_lora, latent, extras)
    assert not torch.equal(ref, plain), "the LoRA must change the output, or this test proves nothing"

    got_before = _ours(env, with_lora, latent, extras, "cpu,cpu")
    assert torch.equal(got_before, ref)

    shard = env.nodes.NODE_CLASS_MAPPINGS["ShardDiTShardModel"]
    sharded = shard.execute(base, "cpu,cpu", 0.0).result[0]
    lora_after = apply_lora(sharded)
    assert torch.equal(_ours(env, lora_after, latent, extras, "cpu,cpu"), ref)
    # and the sharded model without the LoRA is back to the plain output (patches follow changes)
    assert torch.equal(_ours(env, sharded, latent, extras, "cpu,cpu"), plain)


def test_memory_accounting_matches_plan(env, tiny):
    from harness.comfy_env import pack_module

    sm = pack_module(env, "loaders.comfy.shard.hooks")
    base, sharded = _sharded(env, tiny, "cpu,cpu,cpu")
    state = sm.get_shard_state(sharded)
    shards = sm.get_shard_patchers(sharded)
    dit = base.model.diffusion_model
    block_bytes = [env.mm.module_size(b) for b in dit.blocks]
    assert sharded.model_size() == base.model_size() - sum(block_bytes)
    assert [(str(s.load_device), s.model_size()) for s in shards] == [
        (r.device, sum(block_bytes[r.start:r.stop])) for r in state.plan.block_ranges
    ]


def _unknown_arch_model():
    import comfy.model_patcher

    root = torch.nn.Module()
    root.diffusion_model = torch.nn.Linear(4, 4)
    return comfy.model_patcher.ModelPatcher(root, torch.device("cpu"), torch.device("cpu"))


@pytest.mark.parametrize("case,devices,inventory,match", [
    ("missing device", "cpu,cuda:1", None,
     r"^\[ShardDiT\] device 'cuda:1' does not exist; this machine has cpu; no GPU is visible to torch here: use 'cpu' or 'auto'"),
    ("malformed", "cuda0,cpu", None,
     r"^\[ShardDiT\] devices 'cuda0,cpu': 'cuda0' is not a device; accepted: 'auto', or a list like 'cuda:0,cuda:1'"),
    ("does not fit", "cuda:0,cuda:1", "cuda:0=4MiB,cuda:1=4MiB",
     r"^\[ShardDiT\] the DiT does not fit: it needs 0\.0 GiB of weights .* To fit: fewer frames or a smaller resolution"),
    ("unknown architecture", "cpu,cpu", None,
     r"^\[ShardDiT\] cannot shard diffusion model class 'Linear': supported architectures are Wan 2\.1/2\.2"),
])
def test_errors_raised_before_anything_moves(env, tiny, case, devices, inventory, match):
    from harness.comfy_env import pack_module

    sp = pack_module(env, "loaders.comfy.shard.pipeline")
    inv_mod = pack_module(env, "parallel.placement.inventory")
    model = _unknown_arch_model() if case == "unknown architecture" else _load(env, tiny.wan21_t2v_state_dict())
    weights = {k: (v.device, v.data_ptr()) for k, v in model.model.state_dict().items()}
    inv = inv_mod.inventory_from_spec(inventory) if inventory else None
    with pytest.raises(ValueError, match=match) as err:
        sp.shard_model(model, devices, 0.0, inventory=inv)
    assert str(err.value).count("[ShardDiT]") == 1, str(err.value)
    assert model.object_patches == {} and model.additional_models == {}
    assert {k: (v.device, v.data_ptr()) for k, v in model.model.state_dict().items()} == weights


def test_auto_passes_an_unshardable_model_through(env, caplog):
    """The shard transform puts a Shard node (devices auto) after every loader, a segmentation or
    image model's too: there the MODEL must come out as it went in, said once in the log."""
    import logging

    from harness.comfy_env import pack_module

    sp = pack_module(env, "loaders.comfy.shard.pipeline")
    model = _unknown_arch_model()
    with caplog.at_level(logging.INFO, logger="sharddit"):
        assert sp.shard_model(model, "auto", 0.0) is model
    assert "cannot shard diffusion model class 'Linear'" in caplog.text and "passes through unsharded" in caplog.text
    assert model.object_patches == {} and model.additional_models == {}


def test_block_patches_of_other_packs_keep_working(env, tiny):
    """Core's SkipLayerGuidanceDiT and a plain `patches_replace` block patch on a sharded model."""
    latent = torch.zeros(1, 16, 2, 8, 8)
    base = _load(env, tiny.wan21_t2v_state_dict())
    plain = _stock(env, base, latent, {})

    def halve_block_1(args, extra):
        out = extra["original_block"](args)
        return {**out, "img": out["img"] * 0.5}

    patched = base.clone()
    patched.set_model_patch_replace(halve_block_1, "dit", "double_block", 1)
    slg = env.nodes.NODE_CLASS_MAPPINGS["SkipLayerGuidanceDiT"]
    patched = slg.execute(patched, 3.0, 0.0, 1.0, "2", "", 0.0).result[0]
    ref = _stock(env, patched, latent, {})
    assert not torch.equal(ref, plain), "the patches must change the output, or this test proves nothing"
    assert torch.equal(_ours(env, patched, latent, {}, "cpu,cpu,cpu"), ref)


def test_skip_patch_on_last_block_comes_home(env, tiny):
    """SLG-style patch that skips the LAST block: its output must still come home (the router
    sees it through the chained patch) and the result stays bit-identical."""
    from comfy.patcher_extension import WrappersMP
    from harness.comfy_env import pack_module

    sp = pack_module(env, "loaders.comfy.shard.pipeline")
    latent = torch.zeros(1, 16, 2, 8, 8)
    base = _load(env, tiny.wan21_t2v_state_dict())
    skipped = base.clone()
    last = len(base.model.diffusion_model.blocks) - 1
    skipped.set_model_patch_replace(lambda args, extra: {"img": args["img"]}, "dit", "double_block", last)
    ref = _stock(env, skipped, latent, {})
    sharded = sp.shard_model(skipped, "cpu,cpu", 0.0)
    seen = []

    def spy(executor, *args, **kwargs):
        out = executor(*args, **kwargs)
        opts = kwargs.get("transformer_options", args[5] if len(args) > 5 else {})
        seen.append(opts["patches_replace"]["dit"][("double_block", last)])
        return out

    sharded.add_wrapper_with_key(WrappersMP.DIFFUSION_MODEL, "spy", spy)
    assert torch.equal(_ours(env, sharded, latent, {}, "cpu,cpu"), ref)
    hooks = pack_module(env, "loaders.comfy.shard.hooks")
    assert seen and all(getattr(p, "func", None) is hooks.patch_then_home for p in seen)
