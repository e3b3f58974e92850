"""ShardDiT on the MODEL core builds under dynamic VRAM (core 0.16+), the CPU layer of the proof.

On an NVIDIA GPU ``main.py`` initialises comfy-aimdo and sets ``comfy.model_patcher.CoreModelPatcher
= ModelPatcherDynamic``; core's loaders then return a ``ModelPatcherDynamic`` (weights assigned, not
copied, pin/vbar bookkeeping per load device on the BaseModel). Here the same is done in-process
(``core_dynamic_vram``) and the MODEL is built by core's own loader with a ``cuda:0`` load device, as
on a GPU machine (``ModelPatcherDynamic`` turns itself into a plain patcher for a cpu load device).
Its vbars and pinned buffers need CUDA, so sampling it unsharded cannot run here; ShardDiT's
sharded MODEL is all non-dynamic patchers (loaders/comfy/core/dynamic_vram.py) and runs on ``cpu,cpu``.
The CUDA layer: tests/test_dynamic_vram_gpu.py and ``selftest`` (dynamic VRAM check).

Where the core has no dynamic VRAM (0.3.64) the ``plain`` variant runs alone: the same checks on
the patcher core's loader builds there.
"""
import contextlib
import importlib
import os
from pathlib import Path

import pytest
import torch
from harness.comfy_env import pack_module
from harness.sampling import load, lora_loader, ours, stock

pytestmark = pytest.mark.comfy


def _core_has_dynamic_vram() -> bool:
    """Feature, not version: whether this core defines ModelPatcherDynamic (read at collection,
    before ComfyUI is imported), so 0.3.64 collects only the ``plain`` variant and skips nothing."""
    source = Path(os.environ.get("COMFYUI_PATH", "/nonexistent")) / "comfy" / "model_patcher.py"
    return source.is_file() and "class ModelPatcherDynamic" in source.read_text(encoding="utf-8")


KINDS = ["plain"] + (["dynamic"] if _core_has_dynamic_vram() else [])
LATENT = (1, 16, 3, 10, 10)  # 75 tokens; Wan's text pads to 512 tokens: every split is exact (test_sequence_comfy)
EXTRAS = {"tokens": 512}


@contextlib.contextmanager
def core_dynamic_vram():
    """What ``main.py`` does on NVIDIA: comfy-aimdo's native library initialised, then
    ``CoreModelPatcher = ModelPatcherDynamic``. main.py initialises before ComfyUI imports aimdo's
    modules, which bind the library at import; ComfyUI is imported already here, so they re-bind."""
    import comfy.model_patcher as mp
    import comfy_aimdo.control
    import comfy_aimdo.host_buffer
    import comfy_aimdo.model_vbar

    assert comfy_aimdo.control.init(), "comfy-aimdo's native library did not load"
    for module in (comfy_aimdo.host_buffer, comfy_aimdo.model_vbar):
        if module.lib is None:
            importlib.reload(module)
    old = mp.CoreModelPatcher
    mp.CoreModelPatcher = mp.ModelPatcherDynamic
    try:
        yield
    finally:
        mp.CoreModelPatcher = old


def _core_model(sd, kind):
    """The MODEL core's ``load_diffusion_model_state_dict`` (UNETLoader's loader) builds."""
    import comfy.sd

    if kind == "plain":
        return comfy.sd.load_diffusion_model_state_dict(dict(sd))
    with core_dynamic_vram():
        model = comfy.sd.load_diffusion_model_state_dict(dict(sd), model_options={"load_device": torch.device("cuda:0")})
    assert type(model).__name__ == "ModelPatcherDynamic" and model.is_dynamic()
    return model


def _shard(env, model, parallel="auto"):
    node = env.nodes.NODE_CLASS_MAPPINGS["ShardDiTShardModel"]
    return node.execute(model, "cpu,cpu", 0.0, parallel).result[0]


def _is_dynamic(patcher) -> bool:
    return bool(getattr(patcher, "is_dynamic", lambda: False)())


def _assert_whole(patcher):
    """Built by its class's constructor: every attribute a fresh patcher of that class has."""
    fresh = type(patcher)(torch.nn.Linear(1, 1), load_device=torch.device("cpu"), offload_device=torch.device("cpu"))
    missing = set(vars(fresh)) - set(vars(patcher))
    assert not missing, f"{type(patcher).__name__} lacks {sorted(missing)}: half-built"


@pytest.mark.parametrize("kind", KINDS)
def test_sharded_model_is_whole_non_dynamic_patchers_over_the_same_weights(env, tiny, kind):
    import comfy.model_patcher as mp

    sm = pack_module(env, "loaders.comfy.shard.hooks")
    incoming = _core_model(tiny.wan21_t2v_state_dict(), kind)
    block_ptrs = {k: v.data_ptr() for k, v in incoming.model.diffusion_model.blocks.state_dict().items()}
    sharded = _shard(env, incoming)
    shards = sm.get_shard_patchers(sharded)
    assert len(shards) == 2 and [str(s.load_device) for s in shards] == ["cpu", "cpu"]
    for patcher in [sharded, *shards]:
        assert type(patcher) is mp.ModelPatcher and not _is_dynamic(patcher), type(patcher)
        _assert_whole(patcher)
        assert patcher.loaded_size() == 0
        if hasattr(mp.ModelPatcher, "partially_unload_ram"):  # core's RAM-pressure calls (0.16+)
            assert patcher.loaded_ram_size() == 0 and patcher.partially_unload_ram(1) == 0
    assert sharded.model is incoming.model, "the sharded main must share the incoming weights (no reload)"
    now = {k: v.data_ptr() for e in sm.get_shard_state(sharded).roots for k, v in e.root.state_dict().items()}
    assert {k.replace("diffusion_model.blocks.", ""): p for k, p in now.items()} == block_ptrs, "blocks were copied"
    if kind == "dynamic":
        # ShardDiT registered nothing on the dynamic bookkeeping: core's own clone keeps using it
        assert list(incoming.model.dynamic_pins) == [torch.device("cuda:0")]
        assert incoming.model.dynamic_vbars == {}
        tracker = mp.PromptModelTracker()  # what the executor runs on every node output
        tracker.add(sharded)
        tracker.add(incoming)
        tracker.end()


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("parallel", ["blocks", "sequence"])
def test_sharded_dynamic_model_samples_as_unsharded(env, tiny, tmp_path, kind, parallel):
    """Sharded from core's MODEL, with a LoRA applied after the loader (kept), a second prompt
    (nothing reloads) and /free (shards released, next prompt right again): equal to core's
    KSampler on the unsharded plain MODEL."""
    from comfy.patcher_extension import CallbacksMP

    sm = pack_module(env, "loaders.comfy.shard.hooks")
    sd = tiny.wan21_t2v_state_dict()
    apply_lora = lora_loader(env, tiny, tmp_path, sd, name=f"tiny_wan_lora_dyn_{kind}.safetensors")
    latent = torch.zeros(LATENT)
    ref = stock(env, apply_lora(load(env, sd)), latent, EXTRAS)
    env.mm.unload_all_models()
    with_lora = apply_lora(_core_model(sd, kind))
    assert _is_dynamic(with_lora) == (kind == "dynamic")
    sharded = _shard(env, with_lora, parallel)
    loads = []
    for shard in sm.get_shard_patchers(sharded):
        shard.add_callback(CallbacksMP.ON_LOAD, lambda p, *a: loads.append(p))
    first = ours(env, sharded, latent, EXTRAS, "cpu,cpu")
    second = ours(env, sharded, latent, EXTRAS, "cpu,cpu")
    assert len(loads) == 2, "a repeated prompt must not reload the shards"
    env.mm.unload_all_models()  # POST /free
    assert all(s.loaded_size() == 0 for s in sm.get_shard_patchers(sharded))
    third = ours(env, sharded, latent, EXTRAS, "cpu,cpu")
    env.mm.unload_all_models()
    for got in (first, second, third):
        assert torch.equal(got, ref), f"{kind} {parallel}: max diff {(got - ref).abs().max().item()}"
