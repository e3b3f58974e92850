"""Sharded sampling inside real ComfyUI (in-process, CPU): stock KSampler vs ShardDiTKSampler.

Every comparison is bit-exact (`torch.equal`): on CPU a sharded forward runs the same ops in the
same order as the unsharded one.
"""
import pytest
import torch

pytestmark = pytest.mark.comfy

STEPS, CFG, SEED = 2, 3.0, 42


@pytest.fixture(scope="module")
def env():
    from harness.comfy_env import load_comfy

    return load_comfy()


@pytest.fixture(scope="module")
def tiny():
    from harness import tiny_models

    return tiny_models


def _cond(tokens=8, dim=4096, seed=1, **extra):
    g = torch.Generator().manual_seed(seed)
    return [[torch.randn(1, tokens, dim, generator=g), dict(extra)]]


def _family(tiny, name):
    """(state dict builder, latent shape, conditioning extras) per tiny architecture."""
    g = torch.Generator().manual_seed(7)
    pooled = {"pooled_output": torch.randn(1, 768, generator=g)}
    return {
        "wan21": (tiny.wan21_t2v_state_dict, (1, 16, 2, 8, 8), {}),
        "ltxv": (tiny.ltxv_state_dict, (1, 128, 2, 4, 4), {"attention_mask": torch.ones(1, 8, dtype=torch.long)}),
        "hunyuan_video": (tiny.hunyuan_video_state_dict, (1, 16, 2, 8, 8), pooled),
    }[name]


def _load(env, sd):
    import comfy.sd

    return comfy.sd.load_diffusion_model_state_dict(dict(sd))


def _stock(env, model, latent, extras, sampler="euler", scheduler="simple"):
    out = env.nodes.common_ksampler(model, SEED, STEPS, CFG, sampler, scheduler, _cond(**extras),
                                    _cond(seed=2, **extras), {"samples": latent.clone()})
    return out[0]["samples"]


def _ours(env, model, latent, extras, devices, sampler="euler", scheduler="simple"):
    node = env.nodes.NODE_CLASS_MAPPINGS["ShardDiTKSampler"]
    out = node.execute(model, SEED, STEPS, CFG, sampler, scheduler, _cond(**extras), _cond(seed=2, **extras),
                       {"samples": latent.clone()}, 1.0, devices)
    return out.result[0]["samples"]


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


def _lora_loader(env, tiny, tmp_path, sd):
    """Core's LoraLoaderModelOnly on a tiny random LoRA file registered in ComfyUI's `loras` folder."""
    import comfy.utils

    path = tmp_path / "tiny_wan_lora.safetensors"
    comfy.utils.save_torch_file(tiny.wan_lora_state_dict(sd), str(path))
    env.folder_paths.add_model_folder_path("loras", str(tmp_path))
    loader = env.nodes.LoraLoaderModelOnly()
    return lambda model: loader.load_lora_model_only(model, path.name, 1.0)[0]


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


def _sharded(env, tiny, devices="cpu,cpu"):
    model = _load(env, tiny.wan21_t2v_state_dict())
    shard = env.nodes.NODE_CLASS_MAPPINGS["ShardDiTShardModel"]
    return model, shard.execute(model, devices, 0.0).result[0]


def _default(node, input_id):
    return next(i for i in node.define_schema().inputs if i.id == input_id).default


def test_ksampler_and_shard_node_plan_auto_identically(env, tiny):
    """ShardDiTKSampler on an unsharded MODEL shards it exactly as ShardDiTShardModel does with its
    defaults: same request (devices, reserve), so the very same shard state and plan are used."""
    from harness.comfy_env import pack_module

    sm = pack_module(env, "loaders.comfy.sharded_model")
    shard_node = env.nodes.NODE_CLASS_MAPPINGS["ShardDiTShardModel"]
    ksampler = env.nodes.NODE_CLASS_MAPPINGS["ShardDiTKSampler"]
    devices = _default(shard_node, "devices")
    assert devices == _default(ksampler, "devices") == "auto"
    base = _load(env, tiny.wan21_t2v_state_dict())
    state = sm.get_shard_state(shard_node.execute(base, devices, _default(shard_node, "reserve_vram_gb")).result[0])
    _ours(env, base, torch.zeros(1, 16, 2, 8, 8), {}, devices)  # the KSampler shards `base` itself
    states = list(base.model.__dict__[sm._CACHE_ATTR].values())
    assert len(states) == 1 and states[0] is state, (
        f"KSampler planned {[s.request_key for s in states]}, ShardModel {state.request_key}")
    env.mm.unload_all_models()


def test_memory_accounting_matches_plan(env, tiny):
    from harness.comfy_env import pack_module

    sm = pack_module(env, "loaders.comfy.sharded_model")
    base, sharded = _sharded(env, tiny, "cpu,cpu,cpu")
    state = sm.get_shard_state(sharded)
    shards = sm.get_shard_patchers(sharded)
    dit = base.model.diffusion_model
    block_bytes = [env.mm.module_size(b) for b in dit.blocks]
    assert sharded.model_size() == base.model_size() - sum(block_bytes)
    assert [(str(s.load_device), s.model_size()) for s in shards] == [
        (r.device, sum(block_bytes[r.start:r.stop])) for r in state.plan.block_ranges
    ]


def test_identical_prompt_does_not_reload_and_free_releases_shards(env, tiny):
    from comfy.patcher_extension import CallbacksMP
    from harness.comfy_env import pack_module

    sm = pack_module(env, "loaders.comfy.sharded_model")
    _, sharded = _sharded(env, tiny)
    loads = []
    for shard in sm.get_shard_patchers(sharded):
        shard.add_callback(CallbacksMP.ON_LOAD, lambda p, *a: loads.append(p))
    latent = torch.zeros(1, 16, 2, 8, 8)
    first = _ours(env, sharded, latent, {}, "cpu,cpu")
    assert len(loads) == 2  # each shard loaded once, on its own device
    second = _ours(env, sharded, latent, {}, "cpu,cpu")
    assert len(loads) == 2, "an identical prompt must not reload the shards"
    assert torch.equal(first, second)
    assert all(s.loaded_size() > 0 for s in sm.get_shard_patchers(sharded))

    env.mm.unload_all_models()  # what POST /free runs
    assert all(s.loaded_size() == 0 for s in sm.get_shard_patchers(sharded))


def test_full_detach_of_main_releases_shards_on_other_devices(env, tiny):
    """unload_all_models only frees the default device; the ON_DETACH callback frees the rest. A
    clone ShardDiT did not load (e.g. a copy being garbage collected) detaching changes nothing."""
    from harness.comfy_env import pack_module

    sm = pack_module(env, "loaders.comfy.sharded_model")
    _, sharded = _sharded(env, tiny)
    _ours(env, sharded, torch.zeros(1, 16, 2, 8, 8), {}, "cpu,cpu")
    main = next(m for m in env.mm.loaded_models() if m.is_clone(sharded) and sm.is_sharded(m))
    main.clone().detach(unpatch_all=False)  # what ModelPatcher.__del__ does
    assert all(s.loaded_size() > 0 for s in sm.get_shard_patchers(main))
    main.detach(unpatch_all=True)
    assert all(s.loaded_size() == 0 for s in sm.get_shard_patchers(main))
    env.mm.unload_all_models()


def test_shards_released_when_a_different_clone_takes_over(env, tiny):
    """ComfyUI loads an unsharded clone of the same weights (core's sampler would): it detaches the
    sharded main with unpatch_all=False, and the shards must leave their devices and give the
    blocks their original weights back. Then a sharded run loads them again."""
    from harness.comfy_env import pack_module

    sm = pack_module(env, "loaders.comfy.sharded_model")
    base, sharded = _sharded(env, tiny)
    latent = torch.zeros(1, 16, 2, 8, 8)
    first = _ours(env, sharded, latent, {}, "cpu,cpu")
    shards = sm.get_shard_patchers(sharded)
    assert all(s.loaded_size() > 0 for s in shards)
    blocks = base.model.diffusion_model.blocks
    before = {k: v.clone() for k, v in blocks.state_dict().items()}

    other = base.clone()
    env.mm.load_models_gpu([other])  # a different clone takes over
    assert all(s.loaded_size() == 0 for s in shards), "shards stayed loaded after another clone took over"
    assert not any(sm.is_sharded(m) for m in env.mm.loaded_models())
    assert all(torch.equal(v, before[k]) for k, v in blocks.state_dict().items())
    assert torch.equal(_ours(env, sharded, latent, {}, "cpu,cpu"), first)
    assert all(s.loaded_size() > 0 for s in sm.get_shard_patchers(sharded))
    env.mm.unload_all_models()


def test_interrupt_mid_sampling_leaves_model_usable(env, tiny):
    import comfy.utils
    from comfy.patcher_extension import WrappersMP

    base, sharded = _sharded(env, tiny)
    latent = torch.zeros(1, 16, 2, 8, 8)
    ref = _stock(env, base, latent, {})

    calls = []

    def interrupt_on_second_forward(executor, *args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            env.mm.interrupt_current_processing(True)
        return executor(*args, **kwargs)

    interrupting = sharded.clone()
    interrupting.add_wrapper_with_key(WrappersMP.DIFFUSION_MODEL, "test", interrupt_on_second_forward)
    # ComfyUI's server checks interrupts from the progress-bar hook (main.py); do the same here.
    comfy.utils.set_progress_bar_global_hook(lambda *a, **k: env.mm.throw_exception_if_processing_interrupted())
    try:
        with pytest.raises(env.mm.InterruptProcessingException):
            _ours(env, interrupting, latent, {}, "cpu,cpu")
    finally:
        comfy.utils.set_progress_bar_global_hook(None)
        env.mm.interrupt_current_processing(False)
    assert len(calls) == 2, "the interrupt must stop sampling at the next step"
    assert torch.equal(_ours(env, sharded, latent, {}, "cpu,cpu"), ref)


def test_stock_sampler_after_sharded_lora_run(env, tiny, tmp_path):
    """Core KSampler on the unsharded MODEL after a sharded LoRA run on the same weights: the
    shards give the blocks back (original weights) when the unsharded clone takes over, and a
    sharded run after that is right again."""
    sd = tiny.wan21_t2v_state_dict()
    apply_lora = _lora_loader(env, tiny, tmp_path, sd)
    latent = torch.zeros(1, 16, 2, 8, 8)
    base = _load(env, sd)
    plain = _stock(env, base, latent, {})
    with_lora = apply_lora(base)
    ref = _stock(env, with_lora, latent, {})
    assert torch.equal(_ours(env, with_lora, latent, {}, "cpu,cpu"), ref)
    assert torch.equal(_stock(env, base, latent, {}), plain)
    assert torch.equal(_ours(env, with_lora, latent, {}, "cpu,cpu"), ref)


def _unknown_arch_model():
    import comfy.model_patcher

    root = torch.nn.Module()
    root.diffusion_model = torch.nn.Linear(4, 4)
    return comfy.model_patcher.ModelPatcher(root, torch.device("cpu"), torch.device("cpu"))


@pytest.mark.parametrize("case,devices,inventory,match", [
    ("missing device", "cpu,cuda:1", None,
     r"^device 'cuda:1' does not exist; this machine has cpu; no GPU is visible to torch here: use 'cpu' or 'auto'"),
    ("malformed", "cuda0,cpu", None,
     r"^devices 'cuda0,cpu': 'cuda0' is not a device; accepted: 'auto', or a list like 'cuda:0,cuda:1'"),
    ("does not fit", "cuda:0,cuda:1", "cuda:0=4MiB,cuda:1=4MiB",
     r"^the DiT does not fit: it needs 0\.0 GiB of weights .* To fit: fewer frames or a smaller resolution"),
    ("unknown architecture", "cpu,cpu", None,
     r"^\[ShardDiT\] cannot shard diffusion model class 'Linear': supported architectures are Wan 2\.1/2\.2"),
])
def test_errors_raised_before_anything_moves(env, tiny, case, devices, inventory, match):
    from harness.comfy_env import pack_module

    sm = pack_module(env, "loaders.comfy.sharded_model")
    inv_mod = pack_module(env, "parallel.inventory")
    model = _unknown_arch_model() if case == "unknown architecture" else _load(env, tiny.wan21_t2v_state_dict())
    weights = {k: (v.device, v.data_ptr()) for k, v in model.model.state_dict().items()}
    inv = inv_mod.inventory_from_spec(inventory) if inventory else None
    with pytest.raises(ValueError, match=match):
        sm.shard_model(model, devices, 0.0, inventory=inv)
    assert model.object_patches == {} and model.additional_models == {}
    assert {k: (v.device, v.data_ptr()) for k, v in model.model.state_dict().items()} == weights


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

    sm = pack_module(env, "loaders.comfy.sharded_model")
    latent = torch.zeros(1, 16, 2, 8, 8)
    base = _load(env, tiny.wan21_t2v_state_dict())
    skipped = base.clone()
    last = len(base.model.diffusion_model.blocks) - 1
    skipped.set_model_patch_replace(lambda args, extra: {"img": args["img"]}, "dit", "double_block", last)
    ref = _stock(env, skipped, latent, {})
    sharded = sm.shard_model(skipped, "cpu,cpu", 0.0)
    seen = []

    def spy(executor, *args, **kwargs):
        out = executor(*args, **kwargs)
        opts = kwargs.get("transformer_options", args[5] if len(args) > 5 else {})
        seen.append(opts["patches_replace"]["dit"][("double_block", last)])
        return out

    sharded.add_wrapper_with_key(WrappersMP.DIFFUSION_MODEL, "spy", spy)
    assert torch.equal(_ours(env, sharded, latent, {}, "cpu,cpu"), ref)
    hooks = pack_module(env, "loaders.comfy.shard_hooks")
    assert seen and all(getattr(p, "func", None) is hooks.patch_then_home for p in seen)
