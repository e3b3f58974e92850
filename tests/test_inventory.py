"""Inventory: spec parser, NVML -> torch mapping (CUDA_VISIBLE_DEVICES), fallbacks, held bytes."""
import json
import os
import re
import subprocess
import sys
import types

import pytest

from sharddit.parallel.placement import inventory as inv
from sharddit.parallel.placement.inventory import SPEC_FORM, DeviceInfo, Inventory, inventory_from_spec, parse_bytes
from sharddit.parallel.placement.visible import (
    PhysicalGpu,
    infer_visible_gpus,
    match_torch_devices,
    normalize_pci_bus_id,
    normalize_uuid,
)

pytestmark = pytest.mark.no_blas  # no BLAS arithmetic: left out of the other-MKL_CBWR rerun in .ci/run

GiB = 1 << 30
MiB = 1 << 20

# Three physical GPUs as NVML lists them (PCI order); uuids share the prefix "GPU-aa".
A = PhysicalGpu(0, "RTX 4090", 24 * GiB, 20 * GiB, "GPU-aa11-0000", "00000000:01:00.0")
B = PhysicalGpu(1, "RTX 3060", 12 * GiB, 11 * GiB, "GPU-aa22-0000", "00000000:21:00.0")
C = PhysicalGpu(2, "RTX 3090", 24 * GiB, 23 * GiB, "GPU-bb33-0000", "00000000:41:00.0")
PHYSICAL = (A, B, C)


# ---------------------------------------------------------------- spec


def test_spec_basic():
    got = inventory_from_spec(" cuda:1 = 12GiB , cuda:0=20GiB/24GiB, cpu=64GiB ")
    assert got == Inventory(
        devices=(
            DeviceInfo("cuda:0", "spec", 24 * GiB, 20 * GiB),
            DeviceInfo("cuda:1", "spec", 12 * GiB, 12 * GiB),
            DeviceInfo("cpu", "CPU", 64 * GiB, 64 * GiB),
        ),
        source="spec",
    )
    assert got.names == ("cuda:0", "cuda:1", "cpu")
    assert [g.device for g in got.gpus] == ["cuda:0", "cuda:1"]
    assert got.cpu.total_bytes == 64 * GiB
    assert got.get("cuda:1").torch_index == 1 and got.cpu.torch_index is None


@pytest.mark.parametrize(
    "text, n_bytes",
    [("24GiB", 24 * GiB), ("24 gib", 24 * GiB), ("1.5GiB", 3 * GiB // 2), ("12GB", 12 * 10**9),
     ("512MiB", 512 * MiB), ("500MB", 500 * 10**6), ("1000bytes", 1000), ("1000B", 1000)],
)
def test_parse_bytes(text, n_bytes):
    assert parse_bytes(text) == n_bytes


@pytest.mark.parametrize("text", ["24", "GiB", "24TiB", "-1GiB", "1e3GB", ""])
def test_parse_bytes_invalid(text):
    with pytest.raises(ValueError, match=re.escape(
        f"size {text!r} is not a size like '24GiB', '12GB', '512MiB', '500MB' or '1000bytes'"
    )):
        parse_bytes(text)


@pytest.mark.parametrize(
    "spec, message",
    [
        ("", "inventory spec '' is empty"),
        ("cuda:0", "inventory spec 'cuda:0': 'cuda:0' is not 'device=size'"),
        ("cuda:0=24GiB=1", "inventory spec 'cuda:0=24GiB=1': 'cuda:0=24GiB=1' is not 'device=size'"),
        ("cuda:0=24GiB,", "inventory spec 'cuda:0=24GiB,': '' is not 'device=size'"),
        ("gpu0=24GiB", "inventory spec 'gpu0=24GiB': 'gpu0=24GiB': devices 'gpu0': 'gpu0' is not a device"),
        ("cuda:0=24", "inventory spec 'cuda:0=24': 'cuda:0=24': size '24' is not a size like '24GiB'"),
        ("cuda:0=24GiB/x", "inventory spec 'cuda:0=24GiB/x': 'cuda:0=24GiB/x': size 'x' is not a size"),
        ("cuda:0=30GiB/24GiB", "inventory spec 'cuda:0=30GiB/24GiB': 'cuda:0=30GiB/24GiB': free 30GiB is more than total 24GiB"),
        ("cuda:0=1GiB,cuda:0=2GiB", "inventory spec 'cuda:0=1GiB,cuda:0=2GiB' lists 'cuda:0' twice"),
    ],
)
def test_spec_invalid(spec, message):
    with pytest.raises(ValueError, match="^" + re.escape(f"[ShardDiT] {message}") + ".*" + re.escape(f"accepted: {SPEC_FORM}")) as err:
        inventory_from_spec(spec)
    assert str(err.value).count("[ShardDiT]") == 1, "a wrapped part's reason joins the sentence, without its prefix"


def test_held_bytes():
    base = inventory_from_spec("cuda:0=10GiB/24GiB,cuda:1=12GiB")
    held = base.with_held_bytes({"cuda:0": 13 * GiB})
    assert held.get("cuda:0").available_bytes == 23 * GiB
    assert held.get("cuda:1").available_bytes == 12 * GiB
    assert held.with_held_bytes({}) == base
    with pytest.raises(ValueError, match=re.escape("held bytes for ['cuda:7'], which are not in the inventory (cuda:0, cuda:1)")):
        base.with_held_bytes({"cuda:7": 1})
    with pytest.raises(ValueError, match=re.escape("held bytes must be >= 0, got {'cuda:0': -1}")):
        base.with_held_bytes({"cuda:0": -1})
    with pytest.raises(ValueError, match=re.escape("device 'cuda:2' is not in the inventory (cuda:0, cuda:1)")):
        base.get("cuda:2")


# ---------------------------------------------------------------- NVML -> torch mapping


def test_normalize():
    assert normalize_uuid("GPU-AA11-0000") == normalize_uuid("aa11-0000") == "aa11-0000"
    assert normalize_pci_bus_id("00000000:01:00.0") == normalize_pci_bus_id("0000:01:00.0") == "0000:01:00"
    with pytest.raises(ValueError, match=re.escape("PCI bus id '01:00.0' is not in the form 'domain:bus:device.function'")):
        normalize_pci_bus_id("01:00.0")


@pytest.mark.parametrize(
    "cvd, expected",
    [
        (None, (A, B, C)),
        ("0,1,2", (A, B, C)),
        ("1,0", (B, A)),
        (" 2 , 0 ", (C, A)),
        ("2", (C,)),
        ("", ()),
        ("-1", ()),
        ("0,5,1", (A,)),  # CUDA stops at the first invalid index
        ("1,1,0", (B,)),  # a repeat ends the list too
        ("GPU-bb33-0000,GPU-aa11-0000", (C, A)),
        ("GPU-bb,GPU-aa2", (C, B)),  # unique prefixes, as CUDA accepts
        ("gpu-BB33", (C,)),
        ("GPU-aa,1", ()),  # ambiguous prefix: invalid
        ("GPU-ff", ()),
        ("2,GPU-aa11", (C, A)),  # mixed forms
        ("MIG-aa11-0000/1/0", ()),  # MIG is not supported
        ("aa11-0000", ()),  # a UUID needs its GPU- prefix
    ],
)
def test_infer_visible_gpus(cvd, expected):
    assert infer_visible_gpus(PHYSICAL, cvd) == expected


def test_infer_visible_gpus_orders_by_pci_bus():
    assert infer_visible_gpus((C, A, B), "0,2") == (A, C)


def test_match_torch_devices():
    assert match_torch_devices(PHYSICAL, [("bb33-0000", ""), ("aa11-0000", "")]) == (C, A)
    assert match_torch_devices(PHYSICAL, [("GPU-aa22-0000", "0000:01:00")]) == (B,)  # uuid wins
    assert match_torch_devices(PHYSICAL, [("", "0000:21:00"), ("", "0000:41:00")]) == (B, C)
    assert match_torch_devices(PHYSICAL, [("ffff", "0000:99:00")]) is None
    assert match_torch_devices(PHYSICAL, [("aa11-0000", ""), ("aa11-0000", "")]) is None
    assert match_torch_devices(PHYSICAL, []) == ()


# ---------------------------------------------------------------- read_inventory and fallbacks


def _fake_pynvml(gpus, fail=False):
    """A stand-in for NVIDIA's pynvml module (nvidia-ml-py) serving ``gpus``."""
    mod = types.ModuleType("pynvml")

    def init():
        if fail:
            raise RuntimeError("NVML Shared Library Not Found")

    mod.nvmlInit = init
    mod.nvmlShutdown = lambda: None
    mod.nvmlDeviceGetCount = lambda: len(gpus)
    mod.nvmlDeviceGetHandleByIndex = lambda i: gpus[i]
    mod.nvmlDeviceGetMemoryInfo = lambda g: types.SimpleNamespace(total=g.total_bytes, free=g.free_bytes, used=0)
    mod.nvmlDeviceGetName = lambda g: g.name.encode()  # old bindings return bytes
    mod.nvmlDeviceGetUUID = lambda g: g.uuid
    mod.nvmlDeviceGetPciInfo = lambda g: types.SimpleNamespace(busId=g.pci_bus_id.encode())
    return mod


@pytest.fixture
def no_torch_cuda(monkeypatch):
    monkeypatch.setattr(inv, "_read_torch_ids", lambda: None)
    monkeypatch.setattr(inv, "_read_torch_gpus", lambda: ())


def test_read_inventory_nvml_with_cuda_visible_devices(monkeypatch, no_torch_cuda):
    monkeypatch.setitem(sys.modules, "pynvml", _fake_pynvml(PHYSICAL))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,0")
    got = inv.read_inventory()
    assert got.source == "nvml"
    assert got.gpus == (
        DeviceInfo("cuda:0", "RTX 3090", 24 * GiB, 23 * GiB, "GPU-bb33-0000", "0000:41:00"),
        DeviceInfo("cuda:1", "RTX 4090", 24 * GiB, 20 * GiB, "GPU-aa11-0000", "0000:01:00"),
    )
    assert got.names[-1] == "cpu"


def test_read_inventory_nvml_matched_by_torch_uuid(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", _fake_pynvml(PHYSICAL))
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setattr(inv, "_read_torch_ids", lambda: (("aa22-0000", ""), ("bb33-0000", "")))
    got = inv.read_inventory()
    assert [(g.device, g.name) for g in got.gpus] == [("cuda:0", "RTX 3060"), ("cuda:1", "RTX 3090")]


def test_read_inventory_torch_fallback(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", _fake_pynvml(PHYSICAL, fail=True))
    torch_gpus = (DeviceInfo("cuda:0", "AMD Instinct", 64 * GiB, 60 * GiB),)
    monkeypatch.setattr(inv, "_read_torch_gpus", lambda: torch_gpus)
    got = inv.read_inventory()
    assert got.source == "torch" and got.gpus == torch_gpus


def test_read_inventory_unmatched_torch_devices_fall_back_to_torch(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", _fake_pynvml(PHYSICAL))
    monkeypatch.setattr(inv, "_read_torch_ids", lambda: (("ffff", ""),))
    torch_gpus = (DeviceInfo("cuda:0", "Other", 8 * GiB, 8 * GiB),)
    monkeypatch.setattr(inv, "_read_torch_gpus", lambda: torch_gpus)
    got = inv.read_inventory()
    assert got.source == "torch" and got.gpus == torch_gpus


def test_read_inventory_nvml_but_none_visible_is_cpu_only(monkeypatch, no_torch_cuda):
    monkeypatch.setitem(sys.modules, "pynvml", _fake_pynvml(PHYSICAL))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    got = inv.read_inventory()
    assert got.source == "cpu" and got.names == ("cpu",)


def test_read_inventory_cpu_only_when_nothing(monkeypatch, no_torch_cuda):
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import pynvml -> ImportError
    got = inv.read_inventory()
    assert got.source == "cpu" and got.names == ("cpu",)


def test_read_inventory_here_does_not_raise():
    """On this machine (no GPU) the real read reports CPU only; with a GPU it lists cuda:0 first."""
    import torch

    got = inv.read_inventory()
    assert got.cpu is not None and got.cpu.total_bytes > 0
    if not torch.cuda.is_available():
        assert got.source == "cpu" and got.names == ("cpu",)
    else:
        assert got.names[0] == "cuda:0"


def test_read_cpu_info_without_psutil(monkeypatch):
    monkeypatch.setitem(sys.modules, "psutil", None)
    cpu = inv.read_cpu_info()
    assert cpu.device == "cpu" and cpu.total_bytes >= cpu.free_bytes > 0


_SUBPROCESS = """
import json, sys
sys.path.insert(0, sys.argv[1])
import conftest
from sharddit.parallel.placement.inventory import read_inventory
inv = read_inventory()
print(json.dumps({"source": inv.source, "gpus": [[g.device, g.uuid, g.total_bytes] for g in inv.gpus]}))
"""


def _inventory_in_subprocess(env_update):
    env = dict(os.environ, **env_update)
    tests_dir = os.path.dirname(__file__)
    out = subprocess.run([sys.executable, "-c", _SUBPROCESS, tests_dir], env=env, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.gpu
def test_real_nvml_matches_torch_and_honours_cuda_visible_devices():
    import torch

    full = _inventory_in_subprocess({})
    assert full["source"] == "nvml", full
    assert len(full["gpus"]) == torch.cuda.device_count()
    first_uuid = full["gpus"][0][1]
    assert first_uuid.startswith("GPU-")
    assert full["gpus"][0][2] == torch.cuda.get_device_properties(0).total_memory
    # UUID form (and a unique prefix of it) selects the same GPU as cuda:0.
    by_uuid = _inventory_in_subprocess({"CUDA_VISIBLE_DEVICES": first_uuid[:12]})
    assert [g[1] for g in by_uuid["gpus"]] == [first_uuid]
    last = len(full["gpus"]) - 1
    by_index = _inventory_in_subprocess({"CUDA_VISIBLE_DEVICES": str(last)})
    assert [g[1] for g in by_index["gpus"]] == [full["gpus"][last][1]]
    hidden = _inventory_in_subprocess({"CUDA_VISIBLE_DEVICES": ""})
    assert hidden == {"source": "cpu", "gpus": []}


def test_missing_nvml_and_gpu_logged_once_per_process(monkeypatch, no_torch_cuda):
    """Every device read used to log both lines again (266 lines over 48 prompts)."""
    import logging

    monkeypatch.setitem(sys.modules, "pynvml", None)
    monkeypatch.setattr(inv, "_LOGGED", set())  # a fresh process
    records = []
    handler = logging.Handler()
    handler.emit = records.append
    logger = logging.getLogger("sharddit")
    logger.addHandler(handler)
    old_level = logger.level
    logger.setLevel(logging.INFO)
    try:
        for _ in range(5):
            assert inv.read_inventory().names == ("cpu",)
    finally:
        logger.removeHandler(handler)
        logger.setLevel(old_level)
    lines = [r.getMessage() for r in records]
    assert sum(m.startswith("[ShardDiT] NVML unavailable") for m in lines) == 1, lines
    assert sum(m.startswith("[ShardDiT] no CUDA GPU visible") for m in lines) == 1, lines


# ---------------------------------------------------------------- GPUs the driver has but torch does not


def test_hidden_gpus_note_names_them_and_the_fix():
    from sharddit.parallel.placement.visible import hidden_gpus_note

    assert hidden_gpus_note(PHYSICAL, PHYSICAL, 3, None, windows=False) == ""
    linux = hidden_gpus_note(PHYSICAL, (A,), 1, "0", windows=False)
    assert linux.startswith("NVML sees 3 GPUs, torch 1: RTX 3060 (NVML 1), RTX 3090 (NVML 2) hidden")
    assert "(CUDA_VISIBLE_DEVICES '0')" in linux
    assert "unset CUDA_VISIBLE_DEVICES or list every GPU in it (CUDA_VISIBLE_DEVICES=0,1,2; ComfyUI: --cuda-device " \
           "0,1,2)" in linux
    windows = hidden_gpus_note(PHYSICAL, (A,), 1, "0", windows=True)
    assert "start ComfyUI with --cuda-device all" in windows and "CUDA_VISIBLE_DEVICES=0 without it" in windows
    assert "2 of them hidden" in hidden_gpus_note(PHYSICAL, None, 1, "0", windows=False)  # unmatched: a count
    container = hidden_gpus_note(PHYSICAL, (A, B), 2, None, windows=False)
    assert "RTX 3090 (NVML 2) hidden" in container and "CUDA_VISIBLE_DEVICES unset" in container
    assert "docker run --gpus all" in container


@pytest.mark.parametrize("cvd, names, hidden", [("0", ("cuda:0", "cpu"), "RTX 3060 (NVML 1), RTX 3090 (NVML 2)"),
                                                 ("", ("cpu",), "RTX 4090 (NVML 0), RTX 3060 (NVML 1), RTX 3090"),
                                                 (None, ("cuda:0", "cuda:1", "cuda:2", "cpu"), None)])
def test_read_inventory_says_once_which_gpus_are_hidden(monkeypatch, no_torch_cuda, cvd, names, hidden):
    """ComfyUI on Windows starts with CUDA_VISIBLE_DEVICES=0 unless given --cuda-device all."""
    import logging

    monkeypatch.setitem(sys.modules, "pynvml", _fake_pynvml(PHYSICAL))
    if cvd is None:
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    else:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", cvd)
    monkeypatch.setattr(inv, "_on_windows", lambda: True)
    monkeypatch.setattr(inv, "_LOGGED", set())  # a fresh process
    records = []
    handler = logging.Handler()
    handler.emit = records.append
    logger = logging.getLogger("sharddit")
    logger.addHandler(handler)
    old_level = logger.level
    logger.setLevel(logging.INFO)
    try:
        got = [inv.read_inventory() for _ in range(3)]
    finally:
        logger.removeHandler(handler)
        logger.setLevel(old_level)
    assert got[0].names == names
    notes = [r.getMessage() for r in records if "NVML sees" in r.getMessage()]
    if hidden is None:
        assert got[0].hidden_note == "" and notes == []
        return
    assert hidden in got[0].hidden_note and "--cuda-device all" in got[0].hidden_note
    assert all(g.hidden_note == got[0].hidden_note for g in got)
    assert notes == [f"[ShardDiT] {got[0].hidden_note}"], "said once per process, as a log line"


def test_read_inventory_torch_matched_names_the_unmatched_gpu(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", _fake_pynvml(PHYSICAL))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-aa22,GPU-bb33")
    monkeypatch.setattr(inv, "_read_torch_ids", lambda: (("aa22-0000", ""), ("bb33-0000", "")))
    monkeypatch.setattr(inv, "_on_windows", lambda: False)
    note = inv.read_inventory().hidden_note
    assert "NVML sees 3 GPUs, torch 2: RTX 4090 (NVML 0) hidden" in note
    assert "CUDA_VISIBLE_DEVICES=0,1,2" in note
