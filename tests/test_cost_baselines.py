"""Core ComfyUI's own options in the cost model (pure, CI): one GPU with dynamic VRAM and core's CFG
split — their memory per GPU, their predicted speed, and when the plan / ``auto`` mention them.

Dynamic VRAM has no published figure with a workload to rebuild (see tests/test_cost_model.py), so
its checks are the link arithmetic written out: a Wan 2.1 14B bf16 block is 351,272,960 weights =
702.5 MB, copied from pinned host RAM at 25 GB/s (PCIe 4.0 x16, ANCHORS.md) in 28.1 ms (+50 µs).
"""
import pytest
from sharddit.loaders.plan.presets import PRESETS
from sharddit.parallel.cost.baselines import (
    AS_FAST,
    CoreSetup,
    compare_with_core,
    core_baselines,
    estimate_activation_bytes,
)
from sharddit.parallel.cost.inputs import DEFAULT_HOST_LINK_GBPS
from sharddit.parallel.families import shape_from_config, shape_from_spec
from sharddit.parallel.cost.model import (
    Hardware,
    estimate_core_cfg_split,
    estimate_dynamic_vram,
    Workload,
    estimate_costs,
    estimate_one_gpu,
    hardware_from_options,
)
from sharddit.parallel.cost.report import choose_strategy, format_strategy_rows

GiB = 1 << 30
BLOCK = 351_272_960 * 2  # one Wan 2.1 14B block, bf16 bytes
COPY_S = BLOCK / (DEFAULT_HOST_LINK_GBPS * 1e9) + 50e-6  # 28.15 ms
TWO = ["cuda:0", "cuda:1"]


@pytest.fixture(scope="module")
def wan14b():
    return shape_from_spec(PRESETS["wan2.1-t2v-14b"])


@pytest.fixture(scope="module")
def wan14b_i2v():
    return shape_from_config("wan2.1-i2v-14b", "wan", PRESETS["wan2.1-t2v-14b"].unet_config,
                             spatial=8, temporal=4, text_tokens=512, clip_tokens=257)


# ------------------------------------------------------------------ dynamic VRAM: speed
def test_whole_model_resident_is_the_one_gpu_row(wan14b):
    work, hw = Workload(wan14b, 832, 480, 81), hardware_from_options("RTX 4090")
    cost = estimate_dynamic_vram(work, hw, 40 * BLOCK)
    assert cost.seconds_per_step == estimate_one_gpu(work, hw).seconds_per_step
    assert cost.stream_s == 0 and cost.bytes_per_device == 0 and cost.note == "whole model resident"


def test_short_clip_waits_for_the_host_link(wan14b):
    """832×480×1 frame (1,560 tokens): a block computes in 10.6 ms on a 4090 (99 TFLOPS), its copy
    takes 28.15 ms. 5 GiB resident = blocks 0-6 and 64 % of block 7 (its 36 % copies in 10.2 ms,
    hidden); blocks 8-39 wait for their copies: 32 × 28.15 + 8 × 10.6 ms = 0.986 s vs 0.425 s with
    every weight resident (0.43×)."""
    work, hw = Workload(wan14b, 832, 480, 1, cfg=1), hardware_from_options("RTX 4090")
    compute = estimate_one_gpu(work, hw).seconds_per_step / 40
    assert compute == pytest.approx(0.0106, rel=0.01)
    cost = estimate_dynamic_vram(work, hw, 5 * GiB)
    assert cost.seconds_per_step == pytest.approx(32 * COPY_S + 8 * compute, rel=1e-9)
    assert cost.speedup == pytest.approx(0.43, abs=0.01)
    assert cost.bytes_per_device == 40 * BLOCK - 5 * GiB
    assert "streams 21.2 GiB per step from pinned host RAM at 25 GB/s, 57% of the step waiting" in cost.note


def test_long_clip_hides_the_stream_behind_compute(wan14b):
    """720p×81, cfg 6 together: a block computes 3.3 s for two samples, its copy takes 28 ms: any
    amount streamed is hidden, dynamic VRAM runs as fast as one GPU holding everything (1.00×) —
    which is all ``blocks`` gives too (ANCHORS.md: MultiGPU users found one GPU with dynamic VRAM
    faster than their multi-GPU split)."""
    work, hw = Workload(wan14b, 1280, 720, 81, cfg=6), hardware_from_options("RTX 4090")
    cost = estimate_dynamic_vram(work, hw, 10 * GiB)
    assert cost.stream_s == 0 and cost.speedup == pytest.approx(1.0)
    assert cost.bytes_per_device == 40 * BLOCK - 10 * GiB


def test_two_calls_stream_twice_and_a_slower_host_link_is_never_faster(wan14b):
    work = Workload(wan14b, 832, 480, 5, cfg=6)
    hw = hardware_from_options("RTX 4090")
    one, two = estimate_dynamic_vram(work, hw, 0), estimate_dynamic_vram(work, hw, 0, calls=2)
    assert two.bytes_per_device == 2 * one.bytes_per_device and two.seconds_per_step > one.seconds_per_step
    times = [estimate_dynamic_vram(work, Hardware(hw.flops, hw.link_bytes_per_s, host_link_bytes_per_s=g * 1e9), 0)
             .seconds_per_step for g in (6, 12, 25, 50)]
    assert times == sorted(times, reverse=True) and times[0] > times[-1]
    resident = [estimate_dynamic_vram(work, hw, k * BLOCK).seconds_per_step for k in (0, 10, 20, 40)]
    assert resident == sorted(resident, reverse=True)
    with pytest.raises(ValueError, match="calls 3"):
        estimate_dynamic_vram(work, hw, 0, calls=3)


# ------------------------------------------------------------------ core CFG split: speed
def test_cfg_split_uses_two_gpus_at_cfg_above_1_and_one_at_cfg_1(wan14b_i2v):
    hw2, hw4 = hardware_from_options(["RTX 3090"] * 2), hardware_from_options(["RTX 3090"] * 4)
    work = Workload(wan14b_i2v, 512, 512, 33, cfg=5, weight_bytes=1)
    two, four = estimate_core_cfg_split(work, hw2), estimate_core_cfg_split(work, hw4)
    assert 1.85 <= two.speedup <= 2.0 and four.seconds_per_step == two.seconds_per_step  # round-robin: 2 conds
    cfg1 = estimate_core_cfg_split(Workload(wan14b_i2v, 512, 512, 33, cfg=1, weight_bytes=1), hw2)
    assert cfg1.speedup == 1.0 and cfg1.note.startswith("cfg 1: one cond per step")


# ------------------------------------------------------------------ memory per GPU and availability
def _setup(usable, act=int(6.6 * GiB), **kw):
    return CoreSetup(dit_bytes=40 * BLOCK + GiB // 2, home_bytes=GiB // 2, activation_per_sample=act,
                     usable=tuple(usable), **kw)


def test_cfg_split_holds_a_full_copy_and_one_sample_per_gpu(wan14b):
    work, hw = Workload(wan14b, 1280, 720, 81, cfg=6), hardware_from_options(["RTX 4090"] * 4)
    devices = [f"cuda:{i}" for i in range(4)]
    rows = core_baselines(work, hw, _setup([23 * GiB] * 4), devices)
    split = rows["core_cfg_split"]
    assert split.devices == ("cuda:0", "cuda:1") and split.detail == "full copy 26.7 GiB per GPU"
    assert split.peak.weights_bytes == 40 * BLOCK + GiB // 2 and split.peak.activation_bytes == int(6.6 * GiB)
    assert not split.fits  # 26.7 + 6.6 GiB on a 23 GiB card
    assert core_baselines(work, hw, _setup([80 * GiB, 80 * GiB, 1, 1]), devices)["core_cfg_split"].fits
    assert not core_baselines(work, hw, _setup([80 * GiB, 30 * GiB]), TWO)["core_cfg_split"].fits


def test_dynamic_vram_keeps_what_fits_and_streams_the_rest(wan14b):
    """23 GiB usable, cond+uncond together (2 × 6.6 GiB activations + the home + one block fit):
    resident blocks = 23 - 0.5 - 13.2 GiB = 9.3 GiB; the rest of 26.2 GiB, 16.9 GiB, streams each step."""
    work, hw = Workload(wan14b, 1280, 720, 81, cfg=6), hardware_from_options(["RTX 4090"] * 2)
    row = core_baselines(work, hw, _setup([23 * GiB] * 2), TWO)["dynamic_vram"]
    resident = 23 * GiB - GiB // 2 - 2 * int(6.6 * GiB)
    assert row.devices == ("cuda:0",) and row.fits
    assert row.peak.weights_bytes == GiB // 2 + resident and row.peak.activation_bytes == 2 * int(6.6 * GiB)
    assert row.cost.bytes_per_device == 40 * BLOCK - resident
    # 14 GiB: the pair (13.2) does not fit beside the home and one block (0.5 + 0.65), so cond and
    # uncond go one at a time, each call streaming what is not resident
    small = core_baselines(work, hw, _setup([14 * GiB] * 2), TWO)["dynamic_vram"]
    assert small.fits and small.peak.activation_bytes == int(6.6 * GiB)
    assert small.cost.bytes_per_device == 2 * (40 * BLOCK - (14 * GiB - GiB // 2 - int(6.6 * GiB)))
    # not even one block beside the activations: does not fit
    assert not core_baselines(work, hw, _setup([7 * GiB] * 2), TWO)["dynamic_vram"].fits


def test_rows_only_where_this_comfyui_has_them(wan14b):
    work, hw = Workload(wan14b, 832, 480, 81, cfg=6), hardware_from_options(["RTX 4090"] * 2)
    assert set(core_baselines(work, hw, _setup([23 * GiB] * 2), TWO)) == {"dynamic_vram", "core_cfg_split"}
    assert core_baselines(work, hw, _setup([23 * GiB] * 2, cfg_split=False, dynamic_vram=False), TWO) == {}
    assert set(core_baselines(work, hw, _setup([23 * GiB]), ["cuda:0"])) == {"dynamic_vram"}  # one GPU: no split
    cond = "on ComfyUI with dynamic VRAM (NVIDIA)"
    row = core_baselines(work, hw, _setup([23 * GiB] * 2, dynamic_condition=cond), TWO)["dynamic_vram"]
    assert row.cost.note.startswith(cond + ": streams") and row.detail.startswith("streams")


def test_activation_estimate_matches_the_simulated_wan_peaks(wan14b):
    # the simulator's measured Wan 2.1 14B peaks, batch 1 (tests/README.md): 2.9 GiB at 480p×81, 6.6 at 720p×81
    assert estimate_activation_bytes(Workload(wan14b, 832, 480, 81)) / GiB == pytest.approx(2.9, rel=0.05)
    assert estimate_activation_bytes(Workload(wan14b, 1280, 720, 81)) / GiB == pytest.approx(6.6, rel=0.05)


# ------------------------------------------------------------------ what the plan and auto say
def test_core_cfg_split_that_fits_is_named_beside_sequence(wan14b_i2v):
    """2×3090 24 GiB, Wan I2V fp8 512×512×33 (a 14 GiB full copy fits): sequence and core's split
    both put cond and uncond on their own GPU; the split streams nothing, so it is as fast."""
    work, hw = Workload(wan14b_i2v, 512, 512, 33, cfg=5, weight_bytes=1), hardware_from_options(["RTX 3090"] * 2)
    costs = estimate_costs(work, hw)
    rows = core_baselines(work, hw, CoreSetup(int(14.3 * GiB), GiB // 4, 2 * GiB, (23 * GiB, 23 * GiB)), TWO)
    chosen, _ = choose_strategy({**costs, **{k: r.cost for k, r in rows.items()}},
                                {"one_gpu": True, "blocks": True, "sequence": True, **{k: True for k in rows}})
    assert chosen == "sequence"  # auto never picks core's options
    line = compare_with_core(chosen, costs[chosen], rows)
    split = rows["core_cfg_split"].cost
    assert f"core's CFG split predicted {split.speedup:.2f}× (fits: full copy 14.3 GiB per GPU) — as fast as " \
           "sequence; use it if you prefer core" in line
    assert "dynamic VRAM" not in line  # one GPU is half as fast: not mentioned


def test_nothing_is_said_when_core_is_slower_or_does_not_fit(wan14b):
    work, hw = Workload(wan14b, 1280, 720, 81, cfg=6), hardware_from_options(["RTX 4090"] * 2)
    costs = estimate_costs(work, hw)
    rows = core_baselines(work, hw, _setup([23 * GiB] * 2), TWO)  # split does not fit, dynamic 1.0×
    assert compare_with_core("sequence", costs["sequence"], rows) == ""
    blocks = compare_with_core("blocks", costs["blocks"], rows)  # blocks is 1.00× too: dynamic ties it
    assert blocks.startswith("one GPU with dynamic VRAM predicted 1.00× (fits: streams 16.9 GiB per step")
    assert blocks.endswith("— as fast as blocks; use it if you prefer core")
    faster = rows["dynamic_vram"].cost.seconds_per_step * (1 - 2 * AS_FAST)
    from dataclasses import replace

    assert "faster than blocks" in compare_with_core("blocks", replace(costs["blocks"], seconds_per_step=faster * 2), rows)


def test_strategy_rows_list_core_options_after_sharddits_modes(wan14b):
    work, hw = Workload(wan14b, 1280, 720, 81, cfg=6), hardware_from_options(["RTX 4090"] * 2)
    rows = core_baselines(work, hw, _setup([23 * GiB] * 2), TWO)
    costs = {**estimate_costs(work, hw), **{k: r.cost for k, r in rows.items()}}
    peaks = {k: r.peak for k, r in rows.items()}
    text = format_strategy_rows(costs, peaks, {k: r.fits for k, r in rows.items()})
    names = [line.split(" ")[0] for line in text.splitlines()[2:7]]
    assert names == ["one_gpu", "blocks", "sequence", "dynamic_vram", "core_cfg_split"]
    assert next(line for line in text.splitlines() if line.startswith("core_cfg_split")).endswith("no")
    assert "core_cfg_split: cond and uncond at once on two GPUs, a full copy each" in text
