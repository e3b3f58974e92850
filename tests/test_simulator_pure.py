"""Simulator pieces that need no ComfyUI: latent geometry, safetensors headers, the report (CI)."""
import json
import struct
from types import SimpleNamespace

import pytest
import torch

from sharddit.parallel.placement.devices import parse_device_plan
from sharddit.loaders.plan import presets
from sharddit.loaders.comfy.models import checks
from sharddit.parallel.placement.plan_types import BlockRange
from sharddit.loaders.plan.block_plan import fallback_block_ranges
from sharddit.loaders.plan.findings import DeviceReport, SimulationReport
from sharddit.parallel.placement.inventory import inventory_from_spec
from sharddit.parallel.placement.plan_types import PlacementRequest

GiB = 1 << 30


@pytest.mark.parametrize("name, size, batch, shape", [
    ("wan2.1-t2v-14b", (832, 480, 81), 2, (2, 16, 21, 60, 104)),
    ("wan2.2-ti2v-5b", (1280, 704, 121), 1, (1, 48, 31, 44, 80)),
    ("ltxv-13b", (768, 512, 97), 1, (1, 128, 13, 16, 24)),
    ("hunyuanvideo-13b", (848, 480, 129), 1, (1, 16, 33, 60, 106)),
])
def test_latent_geometry(name, size, batch, shape):
    assert presets.PRESETS[name].geometry.latent_shape(*size, batch) == shape


def test_wan22_a14b_is_two_14b_experts():
    a14b, t2v = presets.PRESETS["wan2.2-t2v-a14b"], presets.PRESETS["wan2.1-t2v-14b"]
    assert a14b.experts == 2 and a14b.unet_config == t2v.unet_config


def _write_safetensors(path, tensors: dict, metadata=None):
    header, offset = {}, 0
    for name, (dtype, shape, nbytes) in tensors.items():
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    if metadata:
        header["__metadata__"] = metadata
    raw = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + b"\0" * offset)


def test_header_only_meta_state_dict(tmp_path):
    path = tmp_path / "m.safetensors"
    _write_safetensors(path, {"a.weight": ("BF16", (4, 8), 64), "b": ("F8_E4M3", (3,), 3)}, {"k": "v"})
    header = checks.read_safetensors_header(str(path), "m.safetensors")
    assert header.pop("__metadata__") == {"k": "v"}
    sd = checks.meta_state_dict(header, strict=True)
    assert sorted(sd) == ["a.weight", "b"]
    assert sd["a.weight"].device.type == "meta" and sd["a.weight"].dtype == torch.bfloat16
    assert sd["b"].dtype == torch.float8_e4m3fn and sd["b"].shape == (3,)
    _write_safetensors(path, {"a.weight": ("F4", (4, 8), 16)})
    with pytest.raises(ValueError, match="tensor 'a.weight' has dtype 'F4', which the simulator does not know"):
        checks.meta_state_dict(checks.read_safetensors_header(str(path), "m.safetensors"), strict=True)
    assert checks.meta_state_dict(checks.read_safetensors_header(str(path), "m.safetensors"))["a.weight"].dtype == torch.uint8


def test_bad_model_names_the_value_and_the_fix(tmp_path):
    with pytest.raises(ValueError, match="'nope' is neither a preset .*wan2.1-t2v-14b"):
        presets.resolve_model("nope")
    bad = tmp_path / "x.safetensors"
    bad.write_bytes(b"\0" * 4)
    with pytest.raises(ValueError, match="not a safetensors file"):
        checks.read_safetensors_header(str(bad), "x.safetensors")


def test_fallback_ranges_split_by_usable_memory():
    inv = inventory_from_spec("cuda:0=24GiB,cuda:1=12GiB")
    ranges = fallback_block_ranges(inv, PlacementRequest(), [GiB] * 30)
    assert ranges == [BlockRange("cuda:0", 0, 20), BlockRange("cuda:1", 20, 30)]
    only = fallback_block_ranges(inv, PlacementRequest(devices=parse_device_plan("cuda:1")), [GiB] * 30)
    assert only == [BlockRange("cuda:1", 0, 30)]


_NO_NOTES = SimpleNamespace(notes=())


def _report(devices, plan=_NO_NOTES, batch=2, given=False):
    return SimulationReport("m", "wan", "bf16", (832, 480, 81), (batch, 16, 21, 60, 104), batch, given, 1,
                            inventory_from_spec("cuda:0=24GiB,cuda:1=24GiB"), plan, None, devices)


def test_report_verdict_and_shortfall():
    ok = DeviceReport("cuda:0", "spec", 24 * GiB, 24 * GiB, 24 * GiB, 13 * GiB, 3 * GiB, [0, 1, 2, 5], True)
    short = DeviceReport("cuda:1", "spec", 24 * GiB, 24 * GiB, 20 * GiB, 18 * GiB, 3 * GiB, [3, 4])
    assert ok.describe_blocks() == "home + blocks 0-2,5" and ok.shortfall == 0
    assert short.shortfall == GiB
    report = _report([ok, short])
    assert not report.fits and report.shortfalls() == {"cuda:1": GiB}
    assert "DOES NOT FIT: cuda:1 short by 1.0 GiB." in report.to_text()
    fits = _report([ok], batch=1)
    assert fits.fits and "cond and uncond one after the other" in fits.to_text()
    assert _report([ok], plan=None).fits is False
