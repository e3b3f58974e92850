"""ShardDiT next to core's own multi-GPU nodes (core 0.23+), through the real node classes in-process.

Core's ``MultiGPU CFG Split`` and ``Select Model Device`` act on GPUs ``get_all_torch_devices()``
lists; on this CPU machine that is ``[cpu]`` and both nodes do nothing. ``two_devices`` makes that
one core function list a second device (``cuda:1``) for the duration of a core node's execute, so
core's own code takes its multi-GPU path (deep clones from the loader's ``cached_patcher_init``);
nothing ever runs on it. Collected only where the core has these nodes (0.3.64 has none).
"""
import os
from pathlib import Path

import pytest
import torch
from harness.comfy_env import pack_module
from harness.sampling import ours, stock

pytestmark = pytest.mark.comfy


def _core_has_multigpu_nodes() -> bool:
    return (Path(os.environ.get("COMFYUI_PATH", "/nonexistent")) / "comfy_extras" / "nodes_multigpu.py").is_file()


LATENT = (1, 16, 2, 8, 8)


@pytest.fixture
def two_devices(env, monkeypatch):
    """Core's device list with a second (never used) device while a core node runs."""
    real = env.mm.get_all_torch_devices

    def both(exclude_current=False):
        return [d for d in real(exclude_current) + [torch.device("cuda", 1)]]

    return lambda: monkeypatch.setattr(env.mm, "get_all_torch_devices", both)


@pytest.fixture(scope="module")
def wan_file(env, tiny, tmp_path_factory):
    """The tiny Wan 2.1 DiT as a file in ComfyUI's diffusion_models list (only that model)."""
    import comfy.utils

    folder = tmp_path_factory.mktemp("multigpu_models")
    comfy.utils.save_torch_file(tiny.wan21_t2v_state_dict(), str(folder / "tiny_wan_multigpu.safetensors"))
    env.folder_paths.add_model_folder_path("diffusion_models", str(folder))
    return "tiny_wan_multigpu.safetensors"


def _unet(env, name):
    """Core's UNETLoader on the tiny Wan file: its MODEL has core's reload factory."""
    return env.nodes.UNETLoader().load_unet(name, "default")[0]


def _node(env, node_id):
    return env.nodes.NODE_CLASS_MAPPINGS[node_id]


def _shard(env, model):
    return _node(env, "ShardDiTShardModel").execute(model, "cpu,cpu", 0.0).result[0]


def _loads_from_disk(monkeypatch):
    import comfy.sd

    calls = []
    real = comfy.sd.load_diffusion_model
    monkeypatch.setattr(comfy.sd, "load_diffusion_model", lambda *a, **k: calls.append(a) or real(*a, **k))
    return calls


if _core_has_multigpu_nodes():

    def test_cfg_split_after_shardDiT_is_refused_at_once(env, wan_file, two_devices, monkeypatch):
        sm = pack_module(env, "loaders.comfy.shard.hooks")
        base = _unet(env, wan_file)
        latent = torch.zeros(LATENT)
        ref = stock(env, base, latent, {})
        sharded = _shard(env, base)
        shards = sm.get_shard_patchers(sharded)
        reads = _loads_from_disk(monkeypatch)
        two_devices()
        with pytest.raises(ValueError, match=r"MultiGPU CFG Split node \(MultiGPU_WorkUnits\).*parallel=sequence"):
            _node(env, "MultiGPU_WorkUnits").execute(sharded, 2)
        monkeypatch.undo()
        assert reads == [], "the refusal must come before core reloads the file"
        assert sm.get_shard_patchers(sharded) == shards and sm.is_current_state(sharded), "a shard was lost"
        assert torch.equal(ours(env, sharded, latent, {}, "cpu,cpu"), ref)
        env.mm.unload_all_models()

    def test_select_model_device_other_gpu_after_shardDiT_is_refused(env, wan_file, two_devices, monkeypatch):
        sharded = _shard(env, _unet(env, wan_file))
        reads = _loads_from_disk(monkeypatch)
        two_devices()
        with pytest.raises(ValueError, match=r"Select Model Device node \(SelectModelDevice\)"):
            _node(env, "SelectModelDevice").execute(sharded, "gpu:1")
        assert reads == []

    def test_select_model_device_same_device_after_shardDiT_composes(env, wan_file):
        base = _unet(env, wan_file)
        latent = torch.zeros(LATENT)
        ref = stock(env, base, latent, {})
        for device in ("cpu", "default"):  # the sharded main's own device: core only sets offload
            selected = _node(env, "SelectModelDevice").execute(_shard(env, base), device).result[0]
            assert torch.equal(ours(env, selected, latent, {}, "cpu,cpu"), ref), device
        env.mm.unload_all_models()

    def test_load_device_moved_after_shardDiT_is_refused_before_loading(env, wan_file):
        """What Select Model Device's cpu branch does to a MODEL whose home is a GPU (its
        ``load_device`` set in place): here the home is cpu, so the move goes the other way. ShardDiT's
        KSampler refuses it at once; core's KSampler puts its sigmas on the load device first (so
        ``meta`` here, a device this machine can address) and ShardDiT refuses before anything loads."""
        sharded = _shard(env, _unet(env, wan_file)).clone()
        sharded.load_device = torch.device("cuda", 1)
        with pytest.raises(ValueError, match=r"load device was changed to cuda:1.*home on cpu"):
            ours(env, sharded, torch.zeros(LATENT), {}, "cpu,cpu")
        sharded.load_device = torch.device("meta")
        with pytest.raises(ValueError, match=r"load device was changed to meta.*home on cpu"):
            stock(env, sharded, torch.zeros(LATENT), {})
        assert not any(m.is_clone(sharded) for m in env.mm.loaded_models()), "nothing may load"

    def test_cfg_split_before_shardDiT_is_refused(env, wan_file, two_devices, monkeypatch):
        base = _unet(env, wan_file)
        two_devices()
        split = _node(env, "MultiGPU_WorkUnits").execute(base, 2).result[0]
        monkeypatch.undo()
        assert [str(c.load_device) for c in split.get_additional_models_with_key("multigpu")] == ["cuda:1"]
        with pytest.raises(ValueError, match=r"MultiGPU CFG Split node \(MultiGPU_WorkUnits\).*full copy of the DiT "
                                             r"on cuda:1"):
            _shard(env, split)
        with pytest.raises(ValueError, match=r"MultiGPU_WorkUnits"):
            ours(env, split, torch.zeros(LATENT), {}, "cpu,cpu")

    def test_select_model_device_before_shardDiT_composes(env, wan_file, two_devices, monkeypatch, caplog):
        """Select on another GPU deep-clones (core reloads the file for it); ShardDiT's devices then
        decide where that copy's blocks go, and the log says so."""
        base = _unet(env, wan_file)
        latent = torch.zeros(LATENT)
        ref = stock(env, base, latent, {})
        two_devices()
        moved = _node(env, "SelectModelDevice").execute(base, "gpu:1").result[0]
        monkeypatch.undo()
        assert str(moved.load_device) == "cuda:1" and moved.model is not base.model
        with caplog.at_level("INFO", logger="sharddit"):
            sharded = _shard(env, moved)
        assert "load device cuda:1" in caplog.text and "gives way to ShardDiT's plan: DiT home on cpu" in caplog.text
        assert torch.equal(ours(env, sharded, latent, {}, "cpu,cpu"), ref)
        env.mm.unload_all_models()
