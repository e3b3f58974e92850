"""The CUDA layer of the dynamic-VRAM proof (the CPU layer: test_dynamic_vram_comfy.py): ``selftest``
run as a user runs it, on a GPU, where ComfyUI's dynamic VRAM is on as its ``main.py`` turns it on.

Its ``dynamic VRAM`` check (loaders/cli/selftest/dynamic_check.py) builds the tiny Wan 2.1 DiT through
core's loader (a ``ModelPatcherDynamic``), shards it over ``cuda:0,cuda:0`` in ``blocks`` and
``sequence`` mode (every patcher non-dynamic), compares with the unsharded dynamic result at cfg 4
and 1 (<= 1e-3: cuBLAS may pick other kernels for split shapes), then runs core's sampler on the
unsharded MODEL again and the sharded one again. ``--disable-dynamic-vram`` skips that check.
"""
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.comfy, pytest.mark.gpu]
REPO = Path(__file__).resolve().parents[1]
PREFIX = "[ShardDiT] selftest"


def _selftest(*extra) -> list[str]:
    proc = subprocess.run([sys.executable, str(REPO), "selftest", *extra], check=False, capture_output=True,
                          text=True, timeout=900, env=dict(os.environ), cwd=str(REPO.parent))
    assert proc.returncode == 0, f"exit {proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr[-4000:]}"
    return proc.stdout.splitlines()


def _one(lines, start: str) -> str:
    found = [line for line in lines if line.startswith(f"{PREFIX} {start}")]
    assert found, f"no line starting {PREFIX} {start!r} in:\n" + "\n".join(lines)
    return found[-1]


def _core_has_dynamic_vram() -> bool:
    source = Path(os.environ.get("COMFYUI_PATH", "/nonexistent")) / "comfy" / "model_patcher.py"
    return source.is_file() and "class ModelPatcherDynamic" in source.read_text(encoding="utf-8")


def test_gpu_selftest_with_dynamic_vram():
    lines = _selftest()
    header = _one(lines, "ComfyUI ")
    if not _core_has_dynamic_vram():
        assert "dynamic VRAM off: this ComfyUI has no dynamic VRAM" in header
        return
    assert "dynamic VRAM on" in header, header
    dynamic = [line for line in lines if line.startswith(f"{PREFIX} dynamic VRAM:")]
    text = "\n".join(dynamic)
    assert "core's loader built a ModelPatcherDynamic on cuda:0" in text, text
    for mode in ("blocks", "sequence"):
        assert f"{mode} on cuda:0,cuda:0: 3 patchers, all non-dynamic (ModelPatcher)" in text, text
        for cfg in ("4", "1"):
            assert f"{mode} cfg {cfg} vs unsharded: PASS" in text, text
    assert "core's sampler on the unsharded MODEL again: PASS" in text, text
    assert "blocks again after that: PASS" in text, text
    assert "host RAM peak" in text
    assert "7/7 checks passed" in _one(lines, "PASS:")


def test_gpu_selftest_with_dynamic_vram_disabled():
    lines = _selftest("--disable-dynamic-vram")
    assert "dynamic VRAM off: not requested" in _one(lines, "ComfyUI ")
    assert _one(lines, "dynamic VRAM:").startswith(f"{PREFIX} dynamic VRAM: off: not requested: skipped")

