"""``python <pack-dir> selftest`` as a user runs it (a subprocess with COMFYUI_PATH), plus its
exit status logic in-process.

The CPU run hides every GPU (``CUDA_VISIBLE_DEVICES=""``) so it checks the ``cpu,cpu`` report on
any machine; the ``gpu`` run expects ``cuda:0`` + ``cpu`` (one GPU; ``sequence`` too, so blocks really
stream) or all GPUs.
"""
import re
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.comfy
REPO = Path(__file__).resolve().parents[1]
PREFIX = "[ShardDiT] selftest"


def _selftest(**env) -> subprocess.CompletedProcess:
    full_env = {**os.environ, "COMFYUI_PATH": os.environ.get("COMFYUI_PATH", ""), **env}
    return subprocess.run([sys.executable, str(REPO), "selftest"], check=False, capture_output=True, text=True,
                          timeout=900, env=full_env, cwd=str(REPO.parent))


def _lines(proc) -> list[str]:
    assert proc.returncode == 0, f"exit {proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr[-4000:]}"
    return proc.stdout.splitlines()


def _one(lines, start: str) -> str:
    found = [line for line in lines if line.startswith(f"{PREFIX} {start}")]
    assert found, f"no line starting {PREFIX} {start!r} in:\n" + "\n".join(lines)
    return found[-1]


@pytest.fixture(scope="module")
def cpu_report(tmp_path_factory):
    """Every GPU hidden from torch, three served by a stand-in NVML (as ComfyUI on Windows without
    --cuda-device all, or CUDA_VISIBLE_DEVICES narrowed): the report must say so."""
    from harness.fake_nvml import write_fake_pynvml

    folder = tmp_path_factory.mktemp("fake_nvml")
    write_fake_pynvml(folder)
    return _selftest(CUDA_VISIBLE_DEVICES="", PYTHONPATH=str(folder))


def _core_has(flag: str) -> bool:
    """Whether the ComfyUI under test has a command-line switch (read from its own cli_args.py)."""
    return flag in (Path(os.environ["COMFYUI_PATH"]) / "comfy" / "cli_args.py").read_text()


def test_cpu_selftest_passes_with_full_report(cpu_report):
    lines = _lines(cpu_report)
    assert lines and all(line.startswith(PREFIX) for line in lines), cpu_report.stdout
    assert "ComfyUI device cpu" in _one(lines, "ComfyUI ")
    assert re.search(r"ComfyUI \d+\.\d+\.\d+ at ", _one(lines, "ComfyUI ")), "the version, read from the tree"
    settings = _one(lines, "settings:")
    compiler = "off (needs dynamic VRAM on a CUDA GPU)" if _core_has("--disable-comfy-compiler") else "not in this ComfyUI"
    graphs = "off (needs dynamic VRAM on a CUDA GPU)" if _core_has("--disable-cuda-graphs") else "not in this ComfyUI"
    dynamic = re.search(r"dynamic VRAM (off: .*)$", _one(lines, "ComfyUI ")).group(1)  # why differs by core
    assert settings == (f"{PREFIX} settings: dynamic VRAM {dynamic}, Comfy Compiler {compiler}, "
                        f"CUDA graphs {graphs}, pinned memory on"), settings
    assert _one(lines, "GPUs:") == f"{PREFIX} GPUs: torch sees 0, NVML sees 3"
    hidden = _one(lines, "NVML sees 3 GPUs, torch 0:")
    assert "RTX 4090 (NVML 0), RTX 3090 (NVML 1), RTX 3060 (NVML 2) hidden" in hidden and "CUDA_VISIBLE_DEVICES=0,1,2" in hidden
    assert "GiB free /" in _one(lines, "device cpu (CPU):")
    assert "cpu vs cpu blocks 0-1, cpu blocks 2-3" in _one(lines, "sampling: tiny Wan 2.1 DiT")
    assert "identical, max diff 0" in _one(lines, "sampling: PASS: bit-exact expected")
    assert _one(lines, "p2p:").startswith(f"{PREFIX} p2p: no GPU: skipped")
    assert _one(lines, "hop:").startswith(f"{PREFIX} hop: no GPU: skipped")
    assert "9 tiles" in _one(lines, "VAE: tiny Wan 2.1 VAE") and "on cpu,cpu" in _one(lines, "VAE: tiny")
    assert "(limit 1e-05)" in _one(lines, "VAE: PASS: max diff")
    seq = [line for line in lines if line.startswith(f"{PREFIX} sequence:")]
    # A split changes GEMM shapes: within the CPU bound (identical on this AVX2 host; 4.8e-5 seen on AVX-512)
    assert re.search(r"cfg 4 on cpu,cpu \(cond/uncond split\): PASS: (identical|max diff \S+) \(limit 0.0001\)", seq[0])
    assert re.search(r"cfg 1 on cpu,cpu \(tokens split, 16 exchanges\): PASS: (identical|max diff \S+) \(limit 0.0001\)",
                     seq[1])
    assert _one(lines, "prefetch:").startswith(f"{PREFIX} prefetch: no GPU: skipped")
    dynamic = _one(lines, "dynamic VRAM:")
    assert dynamic.startswith(f"{PREFIX} dynamic VRAM: off: ") and "skipped" in dynamic
    verdict = _one(lines, "PASS:")
    assert "7/7 checks passed" in verdict and verdict.endswith(settings.split("settings: ", 1)[1]), verdict


def test_selftest_switches_set_cores_own_or_say_it_has_none(comfy_env, monkeypatch):
    """``selftest --disable-cuda-graphs`` / ``--disable-comfy-compiler``: core's switch where it exists."""
    from comfy.cli_args import args
    from harness.comfy_env import pack_module

    settings = pack_module(comfy_env, "loaders.cli.selftest.switches")
    for name in settings.SWITCHES:
        if hasattr(args, name):
            monkeypatch.setattr(args, name, False)
    lines = settings.apply_switches({name: True for name in settings.SWITCHES})
    for name, flag in (("disable_comfy_compiler", "--disable-comfy-compiler"),
                       ("disable_cuda_graphs", "--disable-cuda-graphs")):
        if _core_has(flag):
            assert getattr(args, name) is True and not any(line.startswith(flag) for line in lines)
        else:
            assert f"{flag}: " in "\n".join(lines) and "not in this ComfyUI; nothing to turn off" in "\n".join(lines)
    summary = settings.settings_summary("off: no CUDA GPU")
    assert ("CUDA graphs off (--disable-cuda-graphs)" if _core_has("--disable-cuda-graphs")
            else "CUDA graphs not in this ComfyUI") in summary


def test_without_comfyui_exit_2_and_says_how():
    proc = _selftest(COMFYUI_PATH="/nonexistent/ComfyUI")
    assert proc.returncode == 2
    assert "COMFYUI_PATH" in proc.stderr


@pytest.fixture
def selftest_module(comfy_env):
    from harness.comfy_env import pack_module

    return pack_module(comfy_env, "loaders.cli.selftest.suite")


def test_choose_devices(selftest_module):
    choose = selftest_module.choose_devices
    assert choose(0) == ("cpu", ["cpu", "cpu"])
    assert choose(1) == ("cuda:0", ["cuda:0", "cpu"])
    assert choose(3) == ("cuda:0", ["cuda:0", "cuda:1", "cuda:2"])
    assert selftest_module.one_kind(["cpu", "cpu"]) and not selftest_module.one_kind(["cpu", "cuda:0"])


def test_failed_or_crashing_check_exits_1_and_the_rest_still_run(selftest_module, monkeypatch, capsys):
    """Exit status logic without the real checks (they are covered by the subprocess run)."""
    def failing(check, *args):
        check.ok = False
        check.lines.append("FAIL: made to fail")

    def crashing(check, *args):
        raise RuntimeError("boom")

    import torch

    monkeypatch.setattr(torch, "set_num_threads", lambda n: None)  # run_selftest pins 1 thread: not in pytest
    ran = []
    monkeypatch.setattr(selftest_module, "check_sampling", failing)
    monkeypatch.setattr(selftest_module, "check_p2p", crashing)
    monkeypatch.setattr(selftest_module, "check_hops", lambda check, *a: ran.append("hop"))
    monkeypatch.setattr(selftest_module, "check_vae", lambda check, *a: ran.append("VAE"))
    monkeypatch.setattr(selftest_module, "check_sequence", lambda check, *a: ran.append("sequence"))
    monkeypatch.setattr(selftest_module, "check_prefetch_overlap", lambda check, *a: ran.append("prefetch"))
    monkeypatch.setattr(selftest_module, "check_dynamic_vram", lambda check, *a: ran.append("dynamic VRAM"))
    assert selftest_module.run_selftest("/comfyui") == 1
    out = capsys.readouterr().out
    assert f"{PREFIX} p2p: FAIL: RuntimeError: boom" in out
    assert f"{PREFIX} FAIL (sampling, p2p): 5/7 checks passed" in out
    assert ran == ["hop", "sequence", "prefetch", "dynamic VRAM", "VAE"]

    for name in ("check_sampling", "check_p2p"):
        monkeypatch.setattr(selftest_module, name, lambda check, *a: None)
    assert selftest_module.run_selftest("/comfyui") == 0
    assert f"{PREFIX} PASS: 7/7 checks passed" in capsys.readouterr().out


@pytest.mark.gpu
def test_gpu_selftest_shards_over_cuda_and_cpu():
    import torch

    n = torch.cuda.device_count()
    lines = _lines(_selftest())
    assert "ComfyUI device cuda:0" in _one(lines, "ComfyUI ")
    assert "GiB free /" in _one(lines, "device cuda:0")
    sampling = _one(lines, "sampling: tiny Wan 2.1 DiT")
    if n == 1:
        assert "cuda:0 vs cuda:0 blocks 0-1, cpu blocks 2-3" in sampling
        assert "(limit 0.001" in _one(lines, "sampling: PASS: max diff")
        assert "one GPU" in _one(lines, "p2p:")
        assert "GB/s" in _one(lines, "hop: cuda:0 -> cpu: 64 MiB in")
        assert "on cuda:0,cpu vs core decode_tiled on cuda:0" in _one(lines, "VAE: tiny")
    else:
        assert f"cuda:{n - 1} blocks" in sampling
        assert "GB/s" in _one(lines, "hop: cuda:0 -> cuda:1: 64 MiB in")
    assert _one(lines, "VAE: PASS")
    seq = [line for line in lines if line.startswith(f"{PREFIX} sequence:")]
    assert len(seq) == 2 and all("PASS" in line for line in seq), seq
    if n == 1:  # the CPU rank makes every rank stream the blocks the other owns (side stream, events)
        assert all("on cuda:0,cpu" in line for line in seq), seq
        assert all(re.search(r"streamed [1-9][\d.]*/[1-9][\d.]* MiB per rank", line) for line in seq), seq
    assert "through the engine's ring" in _one(lines, "prefetch: copy") and "overlap" in _one(lines, "prefetch: copy")
    assert "7/7 checks passed" in _one(lines, "PASS:")
