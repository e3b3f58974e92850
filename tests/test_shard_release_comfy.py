"""When the shards are loaded and released, inside real ComfyUI (in-process, CPU): an identical
prompt reloads nothing, another clone taking over releases them, POST /free and a full detach
release them, an interrupt leaves the model usable; and the KSampler path plans as the Shard node.
"""
import pytest
import torch

from harness.sampling import default as _default, load as _load, lora_loader as _lora_loader
from harness.sampling import ours as _ours, sharded as _sharded, stock as _stock

pytestmark = pytest.mark.comfy


def test_identical_prompt_does_not_reload_and_free_releases_shards(env, tiny):
    from comfy.patcher_extension import CallbacksMP
    from harness.comfy_env import pack_module

    sm = pack_module(env, "loaders.comfy.shard.hooks")
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

    sm = pack_module(env, "loaders.comfy.shard.hooks")
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

    sm = pack_module(env, "loaders.comfy.shard.hooks")
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


def test_ksampler_and_shard_node_plan_auto_identically(env, tiny):
    """ShardDiTKSampler on an unsharded MODEL shards it exactly as ShardDiTShardModel does with its
    defaults: same request (devices, reserve), so the very same shard state and plan are used."""
    from harness.comfy_env import pack_module

    sm = pack_module(env, "loaders.comfy.shard.hooks")
    shard_node = env.nodes.NODE_CLASS_MAPPINGS["ShardDiTShardModel"]
    ksampler = env.nodes.NODE_CLASS_MAPPINGS["ShardDiTKSampler"]
    devices = _default(shard_node, "devices")
    assert devices == _default(ksampler, "devices") == "auto"
    base = _load(env, tiny.wan21_t2v_state_dict())
    state = sm.get_shard_state(shard_node.execute(base, devices, _default(shard_node, "reserve_vram_gb")).result[0])
    _ours(env, base, torch.zeros(1, 16, 2, 8, 8), {}, devices)  # the KSampler shards `base` itself
    states = list(base.model.__dict__[pack_module(env, "loaders.comfy.shard.hooks").STATES_ATTR].values())
    assert len(states) == 1 and states[0] is state, (
        f"KSampler planned {[s.request_key for s in states]}, ShardModel {state.request_key}")
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


def test_ksampler_on_unsharded_model_twice_does_not_reload(env, tiny):
    """Core loader -> ShardDiTKSampler, queued twice: the second run reuses the loaded shards even
    though the KSampler's sharded clone of the first run is gone."""
    import gc

    from comfy.patcher_extension import CallbacksMP
    from harness.comfy_env import pack_module

    hooks = pack_module(env, "loaders.comfy.shard.hooks")
    base = _load(env, tiny.wan21_t2v_state_dict())
    latent = torch.zeros(1, 16, 2, 8, 8)
    first = _ours(env, base, latent, {}, "cpu,cpu")
    gc.collect()
    (state,) = base.model.__dict__[hooks.STATES_ATTR].values()
    assert all(e.root.model_loaded_weight_memory > 0 for e in state.roots)
    loads = []
    for entry in state.roots:
        entry.template.add_callback(CallbacksMP.ON_LOAD, lambda p, *a: loads.append(p))
    assert torch.equal(_ours(env, base, latent, {}, "cpu,cpu"), first)
    assert loads == [], "the second prompt must not reload the shards"
    env.mm.unload_all_models()


@pytest.mark.parametrize("cfg", [1.0, 3.0])
@pytest.mark.parametrize("parallel", ["blocks", "sequence"])
def test_stock_sampler_after_sharded_lora_run_per_mode(env, tiny, tmp_path, parallel, cfg):
    """Core KSampler on the LoRA'd MODEL after a ShardDiT run on it in either mode: bit-identical to
    the core-only reference (nothing of the sharded run stays attached to the shared weights), and
    the next sharded run is right again."""
    sd = tiny.wan21_t2v_state_dict()
    apply_lora = _lora_loader(env, tiny, tmp_path, sd)
    latent = torch.zeros(1, 16, 2, 8, 8)
    with_lora = apply_lora(_load(env, sd))
    ref = _stock(env, with_lora, latent, {}, cfg=cfg)
    first = _ours(env, with_lora, latent, {}, "cpu,cpu", cfg=cfg, parallel=parallel)
    after = _stock(env, with_lora, latent, {}, cfg=cfg)
    assert (after - ref).abs().max().item() == 0.0, f"core after ShardDiT {parallel} differs"
    assert torch.equal(_ours(env, with_lora, latent, {}, "cpu,cpu", cfg=cfg, parallel=parallel), first)
    env.mm.unload_all_models()
