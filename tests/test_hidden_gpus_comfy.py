"""GPUs the driver has but this process cannot use (``CUDA_VISIBLE_DEVICES``; ComfyUI on Windows sets
it to 0 unless started with ``--cuda-device all``): ``plan`` and the Placement Plan node say so once,
with the fix. NVML is injected: a stand-in ``pynvml`` serving three GPUs, with
``CUDA_VISIBLE_DEVICES=""`` so torch (a CPU machine here) uses none of them.
"""
import os
import subprocess
import sys
from pathlib import Path

import pytest
from harness.comfy_env import pack_module
from harness.fake_nvml import FAKE_PYNVML, write_fake_pynvml

pytestmark = pytest.mark.comfy
REPO = Path(__file__).resolve().parents[1]
NOTE = "[ShardDiT] NVML sees 3 GPUs, torch 0: RTX 4090 (NVML 0), RTX 3090 (NVML 1), RTX 3060 (NVML 2) hidden"


def _fake_pynvml(folder: Path):
    return write_fake_pynvml(folder)


def test_plan_node_says_once_which_gpus_are_hidden(env, monkeypatch, tmp_path):
    inv = pack_module(env, "parallel.placement.inventory")
    fake = _fake_pynvml(tmp_path)
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    monkeypatch.setattr(inv, "_read_torch_ids", lambda: None)
    node = env.nodes.NODE_CLASS_MAPPINGS["ShardDiTPlan"]
    out = node.execute(devices="auto", model="wan2.1-t2v-1.3b", width=128, height=128, frames=1,
                       batch="1", dtype="fp8", reserve_vram_gb=0.0)
    text = out.result[0]
    assert text.startswith(NOTE) and text.count("NVML sees") == 1, text[:600]
    assert "list every GPU in it (CUDA_VISIBLE_DEVICES=0,1,2; ComfyUI: --cuda-device 0,1,2)" in text
    assert out.ui["text"] == (text,)
    imagined = node.execute(devices="cuda:0=8GiB", model="wan2.1-t2v-1.3b", width=128, height=128, frames=1,
                            batch="1", dtype="fp8", reserve_vram_gb=0.0).result[0]
    assert "NVML sees" not in imagined, "imagined GPUs: this machine's view does not apply"


def test_plan_command_says_once_which_gpus_are_hidden(tmp_path):
    (tmp_path / "pynvml.py").write_text(FAKE_PYNVML)
    env = {**os.environ, "PYTHONPATH": str(tmp_path), "CUDA_VISIBLE_DEVICES": ""}
    proc = subprocess.run([sys.executable, str(REPO), "plan", "--model", "wan2.1-t2v-1.3b", "--size", "128x128",
                           "--frames", "1", "--batch", "1", "--dtype", "fp8"], capture_output=True, text=True,
                          env=env, timeout=600, cwd=str(REPO.parent))
    assert proc.returncode in (0, 3), proc.stderr[-3000:]
    assert proc.stdout.startswith(NOTE), proc.stdout[:600]
    assert (proc.stdout + proc.stderr).count("NVML sees") == 1


HIDDEN = "RTX 3090 (NVML 1), RTX 3060 (NVML 2) hidden from this process (CUDA_VISIBLE_DEVICES '0')"


@pytest.fixture
def windows_one_gpu(env, monkeypatch, tmp_path):
    """ComfyUI on Windows without --cuda-device all: CUDA_VISIBLE_DEVICES=0 of three GPUs."""
    inv = pack_module(env, "parallel.placement.inventory")
    monkeypatch.setitem(sys.modules, "pynvml", _fake_pynvml(tmp_path))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    monkeypatch.setattr(inv, "_read_torch_ids", lambda: None)
    monkeypatch.setattr(inv, "_on_windows", lambda: True)
    assert inv.read_inventory().names == ("cuda:0", "cpu")
    return inv


@pytest.mark.parametrize("node_id, inputs", [
    ("ShardDiTLoadDiffusionModel", {"devices": "cuda:0,cuda:1"}),
    ("ShardDiTShardModel", {"devices": "cuda:0,cuda:2"}),
    ("ShardDiTKSampler", {"devices": "cuda:1"}),
    ("ShardDiTLoadTextEncoder", {"device": "cuda:1"}),
    ("ShardDiTLoadVAE", {"device": "cuda:2"}),
    ("ShardDiTVAEDecodeTiled", {"devices": "cuda:0,cuda:1"}),
])
def test_node_errors_name_the_hidden_gpus_and_cuda_device_all(env, windows_one_gpu, node_id, inputs):
    message = env.nodes.NODE_CLASS_MAPPINGS[node_id].validate_inputs(**inputs)
    assert isinstance(message, str) and "does not exist; this machine has cuda:0, cpu" in message, message
    assert HIDDEN in message and "start ComfyUI with --cuda-device all" in message, message


def test_auto_says_it_chose_from_the_one_gpu_shown(env, tiny, windows_one_gpu, caplog):
    import logging

    from harness.sampling import load

    shard_devices = pack_module(env, "loaders.comfy.shard.which_devices")
    model = load(env, tiny.wan21_t2v_state_dict())
    with caplog.at_level(logging.WARNING, logger="sharddit"):
        assert shard_devices._local_auto_devices(model, 0.0, None).text == "cuda:0"
        assert shard_devices._local_auto_devices(model, 0.0, None).text == "cuda:0"
    said = [r.getMessage() for r in caplog.records if "devices 'auto' -> cuda:0" in r.getMessage()]
    assert len(said) == 1, f"once per choice: {said}"
    assert "chosen from the 1 GPU this process sees" in said[0] and HIDDEN in said[0]
    assert "--cuda-device all" in said[0]


def test_placement_counts_the_vram_aimdo_holds_for_comfyui(env, monkeypatch, tmp_path):
    """comfy-aimdo (dynamic VRAM) keeps VRAM for ComfyUI that NVML reports as used; core's own
    ``ModelPatcher.get_free_memory`` adds ``comfy_aimdo.model_vbar.vbars_analyze(index)`` back.
    Stand-in numbers: NVML 20 GiB free on each of three GPUs, aimdo can release 12 GiB on cuda:1.
    A 30 GiB VAE then fits only there, and ``auto`` must put it there, not on the CPU."""
    try:
        import comfy.memory_management as cmm
        from comfy_aimdo import model_vbar
    except ImportError as err:
        pytest.skip(f"this ComfyUI has no comfy-aimdo dynamic VRAM ({err}) (added after ComfyUI 0.3.64)")
    assert hasattr(cmm, "aimdo_enabled") and hasattr(model_vbar, "vbars_analyze")
    inv = pack_module(env, "parallel.placement.inventory")
    placement = pack_module(env, "loaders.comfy.core.component_placement")
    monkeypatch.setitem(sys.modules, "pynvml", _fake_pynvml(tmp_path))
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setattr(inv, "_read_torch_ids", lambda: None)
    monkeypatch.setattr(placement, "_PLACED", {})  # no DiT or other component placed by earlier tests
    monkeypatch.setattr(cmm, "aimdo_enabled", True)
    monkeypatch.setattr(model_vbar, "vbars_analyze", lambda device=None: {1: 12 << 30}.get(device, 0))
    now = placement.current_inventory()
    assert now.names == ("cuda:0", "cuda:1", "cuda:2", "cpu")
    assert [g.releasable_bytes >> 30 for g in now.gpus] == [0, 12, 0]
    assert now.get("cuda:1").available_bytes == 32 << 30 and now.get("cuda:0").available_bytes == 20 << 30
    assert placement.plan_component_device("vae", 30 << 30, "auto", reserve_vram_gb=0.0) == "cuda:1"
    monkeypatch.setattr(cmm, "aimdo_enabled", False)  # dynamic VRAM off: aimdo holds nothing for ComfyUI
    assert placement.current_inventory().get("cuda:1").releasable_bytes == 0
    assert placement.plan_component_device("vae", 30 << 30, "auto", reserve_vram_gb=0.0) == "cpu"


def test_releasable_memory_adds_torchs_cached_blocks(env, monkeypatch):
    """What core's ``get_free_memory`` adds to the driver's free memory: torch's reserved but inactive
    blocks (NVML counts them as used). Stand-in allocator numbers on three CUDA devices."""
    import torch

    settings = pack_module(env, "loaders.comfy.core.running_state")
    stats = {1: {"reserved_bytes.all.current": 5 << 30, "active_bytes.all.current": 2 << 30}}
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 3)
    monkeypatch.setattr(torch.cuda, "memory_stats", lambda i: stats.get(i, {}))
    monkeypatch.setattr(settings, "aimdo_on", lambda: False)
    assert [settings.releasable_bytes(d) >> 30 for d in ("cuda:0", "cuda:1", "cuda:2", "cpu")] == [0, 3, 0, 0]
    assert settings.releasable_bytes("cuda:5") == 0, "a device torch does not have"
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: False)
    assert settings.releasable_bytes("cuda:1") == 0, "before CUDA is used nothing is cached (and no context is made)"


def test_the_plan_node_counts_what_aimdo_can_release(env, monkeypatch, tmp_path):
    """The Plan node plans on the free memory the loaders use: NVML free + what aimdo can release.
    Stand-in numbers as above (20 GiB free each, aimdo 12 GiB on cuda:1): Wan 2.1 14B bf16 (26.6 GiB of
    weights) fits on cuda:1 alone only when the 12 GiB count."""
    try:
        import comfy.memory_management as cmm
        from comfy_aimdo import model_vbar
    except ImportError as err:
        pytest.skip(f"this ComfyUI has no comfy-aimdo dynamic VRAM ({err}) (added after ComfyUI 0.3.64)")
    assert hasattr(cmm, "aimdo_enabled")
    inv = pack_module(env, "parallel.placement.inventory")
    plan_node = pack_module(env, "loaders.plan.node_logic")
    settings = pack_module(env, "loaders.comfy.core.running_state")
    monkeypatch.setitem(sys.modules, "pynvml", _fake_pynvml(tmp_path))
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setattr(inv, "_read_torch_ids", lambda: None)
    # aimdo on for the memory reading only (core's ops would run their dynamic-VRAM path on the meta model)
    monkeypatch.setattr(settings, "aimdo_on", lambda: True)
    monkeypatch.setattr(model_vbar, "vbars_analyze", lambda device=None: {1: 12 << 30}.get(device, 0))
    _, report = plan_node.run_plan("wan2.1-t2v-14b", "cuda:1", 832, 480, 17, "1", "bf16", 1.0, "blocks", 1.0)
    assert report.fits and [d.device for d in report.devices if d.blocks] == ["cuda:1"]
    monkeypatch.setattr(settings, "aimdo_on", lambda: False)
    _, report = plan_node.run_plan("wan2.1-t2v-14b", "cuda:1", 832, 480, 17, "1", "bf16", 1.0, "blocks", 1.0)
    assert not report.fits
