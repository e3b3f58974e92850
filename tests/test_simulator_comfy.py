"""Dry-run simulator on ComfyUI's own model classes (fake GPUs, no weights) and the ``plan`` CLI.

Expected figures (Wan 2.1 14B, bf16, 20/20 blocks on two fake GPUs, per device), from the shapes:
- weights: the parameter bytes of ComfyUI's own class built on meta (``_real_bytes``): 20 blocks of
  351,272,960 parameters = 13.1 GiB, plus the embeddings and head at home = 13.5 GiB; 26.6 GiB in all.
- activations: every tensor live at a block's peak is [batch, tokens, a multiple of the width], so
  the peak scales with batch × tokens: 480p×81 = 21×30×52 = 32,760 tokens, 720p×81 = 21×45×80 =
  75,600. The one measured figure they scale from is ``ACT_480P_B1_GIB`` (tests/README.md, "The
  simulator's reference figure"). Each simulation takes ~10-30 s of CPU here.
"""
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]
GiB = 1 << 30
TWO_24 = "cuda:0=24GiB,cuda:1=24GiB"
TOKENS_480P, TOKENS_720P = 21 * 30 * 52, 21 * 45 * 80
ACT_480P_B1_GIB = 2.9
"""Peak activations per device, Wan 2.1 14B bf16 at 480p×81, batch 1 (tests/README.md)."""


def _act_gib(tokens: int, batch: int) -> float:
    """Expected peak activations: the 480p batch-1 figure scaled by batch × tokens."""
    return ACT_480P_B1_GIB * batch * tokens / TOKENS_480P  # 480p b2 5.8, 720p b1 6.7, b2 13.4


def _wan14b_weight_gib(presets):
    """(whole model, 20 blocks, home part) in GiB from the parameter bytes of ComfyUI's class on meta."""
    dit = _build_meta_model(presets.PRESETS["wan2.1-t2v-14b"], torch.bfloat16, None).diffusion_model
    blocks = [_real_bytes(b) for b in dit.blocks]
    whole = _real_bytes(dit)
    return whole / GiB, sum(blocks[20:]) / GiB, (whole - sum(blocks[20:])) / GiB


def _build_meta_model(spec, weight_dtype, manual_cast_dtype):
    """ComfyUI's class of ``spec`` on meta, as the dry run builds it (after the fixture's ComfyUI import)."""
    from sharddit.loaders.plan.context import build_meta_model

    return build_meta_model(spec, weight_dtype, manual_cast_dtype)


@pytest.fixture(scope="module")
def sim():
    from sharddit.loaders.comfyui_import import import_comfyui

    import_comfyui()  # CPU mode, ComfyUI root on sys.path (never the pack's own dir)
    from sharddit.loaders.plan import dry_run as simulator
    from sharddit.loaders.plan import presets

    return simulator, presets


def _close(value_bytes, expected_gib, rel=0.10):
    return abs(value_bytes / GiB - expected_gib) <= rel * expected_gib


def _real_bytes(module) -> int:
    return sum(p.numel() * p.element_size() for p in module.parameters()) + \
        sum(b.numel() * b.element_size() for b in module.buffers())


@pytest.mark.comfy
def test_wan14b_480p_cond_uncond_fits_two_24gib(sim):
    simulator, presets = sim
    report = simulator.simulate("wan2.1-t2v-14b", TWO_24, 832, 480, 81, batch=2, dtype="bf16")
    assert report.fits, report.to_text()
    assert report.latent_shape == (2, 16, 21, 60, 104)
    by_dev = {d.device: d for d in report.devices}
    assert set(by_dev) == {"cuda:0", "cuda:1"}
    for d in report.devices:
        assert d.need < 24 * GiB
        assert _close(d.peak_activations, _act_gib(TOKENS_480P, 2)), d
    _, second_half, first_and_home = _wan14b_weight_gib(presets)  # 13.1 and 13.5 GiB
    assert _close(by_dev["cuda:0"].weights, first_and_home) and _close(by_dev["cuda:1"].weights, second_half)

    # weight bytes per device == real parameter sizes of what the plan put there
    dit = _build_meta_model(presets.PRESETS["wan2.1-t2v-14b"], torch.bfloat16, None).diffusion_model
    expected = {}
    for r in report.plan.block_ranges:
        expected[r.device] = expected.get(r.device, 0) + sum(_real_bytes(b) for b in dit.blocks[r.start:r.stop])
    home = _real_bytes(dit) - sum(_real_bytes(b) for b in dit.blocks)
    expected[report.plan.home_device] += home
    assert {d.device: d.weights for d in report.devices} == expected
    assert sum(expected.values()) == _real_bytes(dit)


@pytest.mark.comfy
def test_wan14b_720p_cond_uncond_does_not_fit_and_names_shortfall(sim):
    simulator, _ = sim
    report = simulator.simulate("wan2.1-t2v-14b", TWO_24, 1280, 720, 81, batch=2, dtype="bf16")
    assert not report.fits
    assert report.plan is None and "does not fit" in report.plan_error
    assert [d.blocks for d in report.devices] == [list(range(20)), list(range(20, 40))]
    for d in report.devices:
        assert _close(d.peak_activations, _act_gib(TOKENS_720P, 2)), d
        assert d.shortfall > 0
    assert "DOES NOT FIT: cuda:0 short by" in report.to_text()


@pytest.mark.comfy
def test_attention_entry_points_restored(sim):
    simulator, _ = sim
    import comfy.ldm.flux.math as flux_math
    import comfy.ldm.modules.attention as attention
    import comfy.ldm.wan.model as wan

    before = (attention.optimized_attention, attention.optimized_attention_masked,
              wan.optimized_attention, flux_math.optimized_attention)
    simulator.simulate("wan2.1-t2v-1.3b", "cuda:0=8GiB", 256, 256, 5, batch=1)
    after = (attention.optimized_attention, attention.optimized_attention_masked,
             wan.optimized_attention, flux_math.optimized_attention)
    assert before == after


@pytest.mark.comfy
@pytest.mark.parametrize("name, cls, params_b", [
    ("wan2.1-t2v-14b", "WanModel", 14.29), ("wan2.1-t2v-1.3b", "WanModel", 1.42),
    ("wan2.2-t2v-a14b", "WanModel", 14.29), ("wan2.2-ti2v-5b", "WanModel", 5.00),
    ("ltxv-13b", "LTXVModel", 13.04), ("ltxv-2b", "LTXVModel", 1.92),
    ("hunyuanvideo-13b", "HunyuanVideo", 12.82),
])
def test_presets_build_comfyui_classes_on_meta(sim, name, cls, params_b):
    _, presets = sim
    dit = _build_meta_model(presets.PRESETS[name], torch.bfloat16, None).diffusion_model
    assert type(dit).__name__ == cls
    assert abs(sum(p.numel() for p in dit.parameters()) / 1e9 - params_b) < 0.01
    assert all(p.device.type == "meta" for p in dit.parameters())


@pytest.fixture(scope="module")
def tiny_wan_file(tmp_path_factory, sim):
    """A real (tiny, zero-filled) Wan t2v checkpoint with ComfyUI's key names: dim 256, 2 blocks."""
    import comfy.ldm.wan.model as wan
    import comfy.ops
    from safetensors.torch import save_file

    model = wan.WanModel(model_type="t2v", dim=256, ffn_dim=512, num_heads=2, num_layers=2, in_dim=16,
                         out_dim=16, text_dim=4096, freq_dim=256, device="meta",
                         operations=comfy.ops.disable_weight_init)
    sd = {k: torch.zeros(v.shape, dtype=torch.bfloat16) for k, v in model.state_dict().items()}
    path = tmp_path_factory.mktemp("models") / "tiny_wan.safetensors"
    save_file(sd, str(path))
    return path


@pytest.mark.comfy
def test_safetensors_header_detected_by_comfyui_and_simulated(sim, tiny_wan_file):
    simulator, presets = sim
    spec = presets.resolve_model(str(tiny_wan_file))
    assert spec.family == "wan" and spec.file_dtype == "bf16"
    assert spec.unet_config["dim"] == 256 and spec.unet_config["num_layers"] == 2
    report = simulator.simulate(str(tiny_wan_file), "cuda:0=1GiB,cuda:1=1GiB", 256, 256, 9, dtype=None,
                                reserve_vram_gb=0.0)  # 1 GiB imagined GPUs: no room for the default reserve
    assert report.fits and report.batch == 2
    dit = _build_meta_model(spec, torch.bfloat16, None).diffusion_model
    assert sum(d.weights for d in report.devices) == _real_bytes(dit)
    # the file's bytes, except that ComfyUI keeps Wan's patch embedding (16*256*4 + 256) in fp32
    data = os.path.getsize(tiny_wan_file) - _header_len(tiny_wan_file)
    assert _real_bytes(dit) == data + (16 * 256 * 4 + 256) * 2


def _header_len(path) -> int:
    with open(path, "rb") as f:
        return 8 + int.from_bytes(f.read(8), "little")


def _cli(*args, env_extra=None, drop=("COMFYUI_PATH",)):
    env = {k: v for k, v in os.environ.items() if k not in drop}
    env.update(env_extra or {})
    return subprocess.run([sys.executable, str(REPO), *args], capture_output=True, text=True, env=env,
                          cwd=str(REPO), timeout=600)


@pytest.mark.comfy
def test_cli_plan_fits_on_two_gpus_exit_0(sim):
    out = _cli("plan", "--model", "wan2.1-t2v-14b", "--devices", TWO_24, "--size", "832x480",
               "--frames", "81", "--batch", "1", "--parallel", "blocks",
               env_extra={"COMFYUI_PATH": os.environ["COMFYUI_PATH"]})
    assert out.returncode == 0, out.stdout + out.stderr
    blocks_table = out.stdout.split("Strategies")[0]
    rows = re.findall(r"^(cuda:\d) \| (.+?) \| +([\d.]+) \| +([\d.]+) \|", blocks_table, re.MULTILINE)
    assert [(r[0], r[1].strip()) for r in rows] == [("cuda:0", "home + blocks 0-19"), ("cuda:1", "blocks 20-39")]
    _, second_half, first_and_home = _wan14b_weight_gib(sim[1])
    assert [float(r[2]) for r in rows] == pytest.approx([first_and_home, second_half], rel=0.1)
    assert [float(r[3]) for r in rows] == pytest.approx([_act_gib(TOKENS_480P, 1)] * 2, rel=0.1)
    assert "FITS: batch 1." in out.stdout


@pytest.mark.comfy
def test_cli_plan_single_24gib_exit_3_with_shortfall(sim):
    out = _cli("plan", "--model", "wan2.1-t2v-14b", "--devices", "cuda:0=24GiB", "--size", "832x480",
               "--frames", "81", "--batch", "2", env_extra={"COMFYUI_PATH": os.environ["COMFYUI_PATH"]})
    assert out.returncode == 3, out.stdout + out.stderr
    short = re.search(r"DOES NOT FIT(?: with ShardDiT)?: cuda:0 short by ([\d.]+) GiB", out.stdout)
    assert short, out.stdout
    # usable = 24 GiB - the default reserve (1.0 GiB, as the nodes)
    whole, _, _ = _wan14b_weight_gib(sim[1])  # 26.6 GiB
    assert float(short.group(1)) == pytest.approx(whole + _act_gib(TOKENS_480P, 2) - (24 - 1.0), abs=0.6)


PRESETS = ("wan2.1-t2v-14b", "wan2.1-t2v-1.3b", "wan2.2-t2v-a14b", "wan2.2-ti2v-5b", "ltxv-13b", "ltxv-2b",
           "hunyuanvideo-13b", "wan2.2-i2v-a14b", "kandinsky5-lite", "kandinsky5-pro", "hunyuanvideo-1.5", "ltx-2.3",
           "ltx-2.3-fp8", "minimax-h3", "minimax-h3-fp8")


def test_preset_list_is_complete():
    from sharddit.loaders.plan.presets import preset_names

    assert tuple(preset_names()) == PRESETS


@pytest.mark.comfy
@pytest.mark.parametrize("name", [p for p in PRESETS if p != "ltx-2.3-fp8"])  # planned in test_presets_2026_comfy.py
def test_cli_plan_every_preset_exits_0_or_3(sim, name, capsys):
    """``plan`` answers for every preset on this ComfyUI (in-process: one ComfyUI import for all;
    an exception here is the traceback a user would see). Small size: the answer, not the figures."""
    from sharddit.loaders.cli.main import main

    _, presets = sim
    requires = presets.PRESETS[name].requires
    if not presets.comfyui_has(requires):  # a newer model: plan refuses it with the reason (exit 2)
        assert main(["plan", "--model", name, "--devices", TWO_24]) == 2
        assert "added after ComfyUI 0.3.64" in capsys.readouterr().err
        pytest.skip(f"{requires} is absent from this ComfyUI (added after ComfyUI 0.3.64)")
    rc = main(["plan", "--model", name, "--devices", TWO_24, "--size", "256x256", "--frames", "9"])
    out = capsys.readouterr()
    assert rc in (0, 3), out.out + out.err
    assert ("FITS:" in out.out) if rc == 0 else ("DOES NOT FIT" in out.out), out.out
    assert re.search(r"^text encoder: .+ \d+\.\d GiB bf16", out.out, re.MULTILINE), out.out  # beside the DiT


def test_cli_without_comfyui_path_says_how_to_set_it():
    out = _cli("plan", "--model", "wan2.1-t2v-14b", "--devices", TWO_24)
    assert out.returncode == 2
    assert "COMFYUI_PATH" in out.stderr and "cannot find ComfyUI" in out.stderr
    assert "Traceback" not in out.stderr


@pytest.mark.comfy
def test_fp8_weights_are_one_byte_and_compute_in_bf16(sim):
    simulator, presets = sim
    report = simulator.simulate("wan2.1-t2v-1.3b", "cuda:0=8GiB", 256, 256, 5, batch=1, dtype="fp8")
    dit = _build_meta_model(presets.PRESETS["wan2.1-t2v-1.3b"], torch.float8_e4m3fn,
                                   torch.bfloat16).diffusion_model
    n_params = sum(p.numel() for p in dit.parameters())
    assert report.fits and report.dtype == "fp8"
    assert report.devices[0].weights == _real_bytes(dit)
    assert abs(report.devices[0].weights / n_params - 1.0) < 0.01  # ~1 byte per parameter


@pytest.mark.comfy
def test_cli_rounds_a_size_off_the_grid_as_comfyui_does_and_refuses_a_truncated_file(tiny_wan_file, tmp_path):
    """A size off the model's grid is planned as ComfyUI computes it, and said: the latent node
    floors to the VAE stride (833x481 -> 104x60 latent cells for Wan), the DiT pads to 2x2 patches
    (52x30 tokens = 832x480); LTX's 32-pixel cells take core's own 1280x720 to 1280x704 (LTX-Video
    13B here: LTX-2.3, same cells, is not in ComfyUI 0.3.64).
    A truncated file is refused (exit 2) instead of planned as if it were whole."""
    env = {"COMFYUI_PATH": os.environ["COMFYUI_PATH"]}
    out = _cli("plan", "--model", "wan2.1-t2v-14b", "--devices", TWO_24, "--size", "833x481", "--frames", "5",
               "--json", env_extra=env)
    assert out.returncode in (0, 3), out.stderr
    report = json.loads(out.stdout)
    assert report["size"][:2] == [832, 480] and report["latent_shape"][-2:] == [60, 104], report
    assert report["size_note"].startswith("size 833x481 -> 832x480: ComfyUI's latent node rounds down to 8-pixel"), report
    out = _cli("plan", "--model", "ltxv-13b", "--devices", TWO_24, "--size", "1280x720", "--frames", "9",
               env_extra=env)
    assert out.returncode in (0, 3), out.stderr
    assert re.search(r"^size 1280x720 -> 1280x704: ComfyUI's latent node rounds down to 32-pixel steps", out.stdout,
                     re.MULTILINE), out.stdout
    cut = tmp_path / "cut.safetensors"
    data = tiny_wan_file.read_bytes()
    cut.write_bytes(data[: len(data) - 1000])
    out = _cli("plan", "--model", str(cut), "--devices", TWO_24, "--size", "256x256", env_extra=env)
    assert out.returncode == 2 and "is truncated" in out.stderr and "Traceback" not in out.stderr, out.stderr
