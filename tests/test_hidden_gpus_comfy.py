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

pytestmark = pytest.mark.comfy
REPO = Path(__file__).resolve().parents[1]
GPUS = [("RTX 4090", "GPU-aa11-0000", "00000000:01:00.0"), ("RTX 3090", "GPU-bb22-0000", "00000000:21:00.0"),
        ("RTX 3060", "GPU-cc33-0000", "00000000:41:00.0")]
FAKE_PYNVML = f'''"""Stand-in for nvidia-ml-py's pynvml (test only): three GPUs."""
from types import SimpleNamespace
GPUS = {GPUS!r}
def nvmlInit(): pass
def nvmlShutdown(): pass
def nvmlDeviceGetCount(): return len(GPUS)
def nvmlDeviceGetHandleByIndex(i): return GPUS[i]
def nvmlDeviceGetMemoryInfo(g): return SimpleNamespace(total=24 << 30, free=20 << 30, used=0)
def nvmlDeviceGetName(g): return g[0]
def nvmlDeviceGetUUID(g): return g[1]
def nvmlDeviceGetPciInfo(g): return SimpleNamespace(busId=g[2])
'''
NOTE = "[ShardDiT] NVML sees 3 GPUs, torch 0: RTX 4090 (NVML 0), RTX 3090 (NVML 1), RTX 3060 (NVML 2) hidden"


def _fake_pynvml(folder: Path):
    import importlib.util

    (folder / "pynvml.py").write_text(FAKE_PYNVML)
    spec = importlib.util.spec_from_file_location("pynvml", folder / "pynvml.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


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
