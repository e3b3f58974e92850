"""Cost model (pure, CI): shapes, inputs, calibration against published speed-ups, `auto` decision.

Every number asserted here comes out of the one set of constants in ``parallel/cost/inputs.py``
(``EFFICIENCY`` 0.6, ``DEFAULT_LINK_GBPS`` 12) and ``parallel/cost/model.py``
(``TRANSFER_LATENCY_S``); nothing is tuned per test. (The calibration against published end-to-end
tables solves one number per table, the seconds no run splits; see ``_calibrate``.)
"""
import ast
import importlib
from pathlib import Path

import pytest
from sharddit.parallel.cost.inputs import (
    DEFAULT_LINK_GBPS,
    gpu_flops,
    link_bandwidth,
    normalize_gpu_name,
    parse_link_gbps,
)
from sharddit.parallel.families import shape_from_config, shape_from_spec
from sharddit.parallel.cost.model import (
    estimate_core_cfg_split,
    Hardware,
    Workload,
    estimate_costs,
    estimate_sequence,
    hardware_from_options,
)
from sharddit.parallel.cost.report import (
    DevicePeak,
    choose_strategy,
    format_strategy_rows,
)

GiB = 1 << 30
ALL_FIT = {"one_gpu": True, "blocks": True, "sequence": True}


def _presets():
    # loaders/presets.py moves to loaders/plan/presets.py (issue 9): accept either.
    for name in ("sharddit.loaders.plan.presets", "sharddit.loaders.presets"):
        try:
            return importlib.import_module(name).PRESETS
        except ImportError:
            continue
    raise ImportError("no presets module")


def _shape(name):
    return shape_from_spec(_presets()[name])


def _wan14b():
    return _shape("wan2.1-t2v-14b")


def _wan14b_i2v():
    return shape_from_config("wan2.1-i2v-14b", "wan", _presets()["wan2.1-t2v-14b"].unet_config,
                             spatial=8, temporal=4, text_tokens=512, clip_tokens=257)


# ------------------------------------------------------------------ shapes
@pytest.mark.parametrize("size, tokens", [((1280, 720, 81), 75600), ((832, 480, 81), 32760),
                                          ((832, 480, 33), 14040)])
def test_wan_tokens_are_latent_frames_times_patched_grid(size, tokens):
    assert _wan14b().image_tokens(*size) == tokens


@pytest.mark.parametrize("name, billions", [
    # published sizes (model cards); the shape counts block weights only (embeddings, head and
    # HunyuanVideo's token refiner are outside the blocks), so allow 10 %.
    ("wan2.1-t2v-14b", 14.0), ("wan2.1-t2v-1.3b", 1.3), ("wan2.2-ti2v-5b", 5.0),
    ("ltxv-13b", 13.0), ("ltxv-2b", 2.0), ("hunyuanvideo-13b", 13.0), ("wan2.2-i2v-a14b", 14.0),
    ("kandinsky5-lite", 2.0)])
def test_block_weights_match_published_model_sizes(name, billions):
    shape = _shape(name)
    params = sum(b.weight_params * b.count for b in shape.blocks)
    assert abs(params / 1e9 - billions) / billions < 0.1, params


def test_wan14b_block_flops_match_anchors():
    # ANCHORS.md: one Wan 14B block, one sample: ~42 TFLOP at 480p×81 (attention 22),
    # ~163 TFLOP at 720p×81 (attention 117). One FLOP/s turns seconds into FLOPs.
    hw = Hardware((1.0,), 1.0)
    for size, expected in (((832, 480, 81), 42e12), ((1280, 720, 81), 163e12)):
        per_block = estimate_costs(Workload(_wan14b(), *size), hw)["one_gpu"].seconds_per_step / 40
        assert abs(per_block - expected) / expected < 0.03, (size, per_block)


def test_hunyuan_has_two_block_kinds_and_joint_text():
    shape = _shape("hunyuanvideo-13b")
    assert [b.count for b in shape.blocks] == [20, 40]
    assert all(b.joint_text and not b.cross_attention for b in shape.blocks)


# ------------------------------------------------------------------ inputs
@pytest.mark.parametrize("nvml, key", [
    ("NVIDIA GeForce RTX 4090", "rtx 4090"), ("RTX 4090", "rtx 4090"), ("4090", "rtx 4090"),
    ("NVIDIA GeForce RTX 3090 Ti", "rtx 3090 ti"), ("NVIDIA H100 80GB HBM3", "h100"),
    ("NVIDIA H100 PCIe", "h100 pcie"), ("NVIDIA L40S", "l40s"), ("NVIDIA L40", "l40"),
    ("NVIDIA A100-SXM4-80GB", "a100"), ("NVIDIA RTX 6000 Ada Generation", "rtx 6000 ada"),
    ("NVIDIA H200", "h200"), ("NVIDIA GeForce RTX 5090", "rtx 5090")])
def test_gpu_names_from_nvml_normalise(nvml, key):
    assert normalize_gpu_name(nvml) == key


def test_unknown_gpu_lists_known_names_and_the_fix():
    with pytest.raises(ValueError, match=r"rtx 4090.*measured throughput"):
        gpu_flops("NVIDIA GeForce GTX 1080")


def test_rtx4090_effective_throughput_is_anchors_99_tflops():
    assert gpu_flops("NVIDIA GeForce RTX 4090") == pytest.approx(99e12, rel=0.01)


@pytest.mark.parametrize("bad", ["0", "-3", "fast", None, "nan"])
def test_link_must_be_positive_gbps(bad):
    with pytest.raises(ValueError, match="--link-gbps"):
        parse_link_gbps(bad)


def test_link_default_is_pcie4_without_p2p_and_says_so():
    bw, note = link_bandwidth(None)
    assert bw == DEFAULT_LINK_GBPS * 1e9 and "PCIe 4.0 without P2P" in note
    assert link_bandwidth("25") == (25e9, "link 25 GB/s (given)")


def test_hardware_from_one_name_a_name_per_device_or_measured_throughput():
    one = hardware_from_options("NVIDIA GeForce RTX 4090", n_devices=2)
    assert one.flops == hardware_from_options(["RTX 4090", "4090"]).flops == (gpu_flops("RTX 4090"),) * 2
    assert "165.2 dense bf16 × 0.6" in one.note and "PCIe 4.0 without P2P" in one.note
    measured = hardware_from_options(["cuda:0", "cuda:1"], measured_tflops=[80, 40], link_gbps=25)
    assert measured.flops == (80e12, 40e12) and measured.link_bytes_per_s == 25e9
    with pytest.raises(ValueError, match="one per device"):
        hardware_from_options(["a", "b"], measured_tflops=[80])
    with pytest.raises(ValueError, match="must be a number > 0"):
        Workload(_wan14b(), 832, 480, 81, cfg=0)
    with pytest.raises(ValueError, match="frames"):
        Workload(_wan14b(), 832, 480, 0)


def test_bad_hardware_and_ownership_are_refused():
    with pytest.raises(ValueError, match="link_bytes_per_s"):
        Hardware((1e14,), 0.0)
    with pytest.raises(ValueError, match="measured throughput"):
        Hardware((), 1e9)
    with pytest.raises(ValueError, match="plan's block counts"):
        estimate_sequence(Workload(_wan14b(), 832, 480, 81), hardware_from_options(["RTX 4090"] * 2),
                          owned=[30, 5])


@pytest.mark.parametrize("size, gpus, share", [((832, 480, 81), 2, 0.13), ((832, 480, 81), 4, 0.20),
                                               ((1280, 720, 81), 2, 0.08), ((1280, 720, 81), 4, 0.12)])
def test_ulysses_exchange_share_matches_anchors_table(size, gpus, share):
    # ANCHORS.md "Communication arithmetic": Ulysses all-to-all (q, k, v, out) per GPU per block
    # as a share of its compute at 12 GB/s: 13 % / 20 % (480p, N=2/4), 8 % / 12 % (720p). That is
    # the whole exchange (unpipelined); pipelined by head chunks, less of it waits.
    work, hw = Workload(_wan14b(), *size), hardware_from_options(["RTX 4090"] * gpus, link_gbps=12)
    seq = estimate_sequence(work, hw, pipelined=False)
    assert seq.exchange_s / seq.compute_s == pytest.approx(share, abs=0.015)
    assert estimate_costs(work, hw)["sequence"].exchange_s < 0.5 * seq.exchange_s


# ------------------------------------------------------------------ calibration (published)
H100 = "NVIDIA H100 80GB HBM3"
# Published end-to-end tables: {GPUs: total seconds}. Sources:
# - Wan-Video/Wan2.1 README, "Computational Efficiency on Different GPUs": T2V-14B 1280×720×81,
#   50 steps, FSDP + Ulysses on H100 (NVLink 4, 450 GB/s): 1837.9 / 945.1 / 497.0 / 287.9 s.
#   Wan runs cond and uncond one after the other, each over all GPUs: cfg 1 here.
# - xDiT performance table (ANCHORS.md "Published speed-ups"): HunyuanVideo 1280×720×129 on
#   H100: 1904 / 925 / 514 / 338 s (guidance-distilled: one forward per step, cfg 1).
TABLES = [
    ("Wan 2.1 T2V-14B 720p×81 H100", lambda: Workload(_wan14b(), 1280, 720, 81, cfg=1), H100, 450,
     {1: 1837.9, 2: 945.1, 4: 497.0, 8: 287.9}),
    ("HunyuanVideo 720p×129 H100 (xDiT)", lambda: Workload(_shape("hunyuanvideo-13b"), 1280, 720, 129, cfg=1),
     H100, 450, {1: 1904, 2: 925, 4: 514, 8: 338}),
]
# Per-step ratios (s/it: nothing serial in them): (label, workload, GPUs, link GB/s, strategy, published).
# - Comfy-Org/ComfyUI PR #7063 ("MultiGPU Work Units", core's CFG split, ANCHORS.md "The speed
#   round"), 1x vs 2x RTX 3090, Wan I2V 480p fp8 (512×512×33): 10.80 -> 5.63 s/it = 1.92×. Core gives
#   each GPU a full copy and one of cond / uncond (``cost_baselines.estimate_core_cfg_split``).
# - The same split at cfg 1: one cond per step, so one GPU works: 1.0× (ANCHORS.md: "Nothing at
#   cfg = 1"; core's node hands conds out round-robin and there is one).
# - Link-bound: ANCHORS.md "Communication arithmetic": a short clip (480p×33) on 4 GPUs over PCIe
#   without P2P is weight-bound, "~1.8× at best" (an analysis of the same bytes, not a timing;
#   it is here because ideal scaling, 4×, misses it by far, as xDiT's 8×L40-over-PCIe report does).
# Dynamic VRAM has no row: the published streaming figures (ANCHORS.md: DisTorch2 Wan 2.2 14B fp8 on
# a 3090, 13.3 GB streamed, +13 % time; Flux Q8 1.29 -> 5.04 s/it) give no resolution, frame count
# or steps, so no workload can be rebuilt from them. Its checks are derived from the link arithmetic
# instead (tests/test_cost_baselines.py).
STEP_ROWS = [
    ("core CFG split 2×3090 Wan I2V 512×512×33 fp8", lambda: Workload(_wan14b_i2v(), 512, 512, 33, cfg=5, weight_bytes=1),
     ["NVIDIA GeForce RTX 3090"] * 2, None, "core_cfg_split", 1.92),
    ("core CFG split 2×3090 Wan I2V 512×512×33 fp8, cfg 1", lambda: Workload(_wan14b_i2v(), 512, 512, 33, cfg=1, weight_bytes=1),
     ["NVIDIA GeForce RTX 3090"] * 2, None, "core_cfg_split", 1.0),
    ("short clip 480p×33 on 4×4090, 12 GB/s", lambda: Workload(_wan14b(), 832, 480, 33, cfg=1),
     ["RTX 4090"] * 4, 12, "sequence", 1.8),
]
CALIBRATION_TOLERANCE = 0.10
"""Largest relative miss the rows allow the cost model: HunyuanVideo's 2 and 4 GPUs (-9 %; its
2-GPU run is superlinear, 2.06×, which no per-step model predicts). Ideal scaling misses the
link-bound row by 120 %."""
MAX_SERIAL_SHARE = 0.10
"""Serial seconds (text encoder, VAE decode) as a share of the one-GPU total: a 720p clip's VAE
decode and text encoding take tens of seconds of a ~30-minute run, not minutes."""


def _model_speedup(work, hw, strategy):
    if strategy == "core_cfg_split":
        return estimate_core_cfg_split(work, hw).speedup
    return estimate_costs(work, hw)[strategy].speedup


def _ideal_speedup(work, hw, strategy):
    return float(len(hw.flops))  # N× on N GPUs: what the calibration must be able to reject


def _calibrate(predict):
    """([(label, predicted, published)], {table: serial share}) for a per-step ``predict``.

    A table's totals include the parts no run splits: the same serial seconds S in every row
    (T_N = S + (T_1 - S) / p_N). S is solved from the table's largest-N row (one number per table,
    the same work in each of its rows) and must be a plausible share; the other rows are then
    predictions. Per-step rows compare the ratio directly."""
    rows, serial = [], {}
    for label, work, gpu, link, totals in TABLES:
        t1, n_max = totals[1], max(totals)
        p = {n: predict(work(), hardware_from_options([gpu] * n, link_gbps=link), "sequence") for n in totals if n > 1}
        s = (totals[n_max] - t1 / p[n_max]) / (1 - 1 / p[n_max])
        serial[label] = s / t1
        rows += [(f"{label} {n} GPUs", t1 / (s + (t1 - s) / p[n]), t1 / totals[n]) for n in p if n != n_max]
    for label, work, gpus, link, strategy, published in STEP_ROWS:
        rows.append((label, predict(work(), hardware_from_options(gpus, link_gbps=link), strategy), published))
    return rows, serial


def _misses(rows):
    return {label: (predicted - published) / published for label, predicted, published in rows}


def test_calibration_against_published_speedups():
    rows, serial = _calibrate(_model_speedup)
    misses = _misses(rows)
    assert len(misses) == 7
    assert all(abs(m) <= CALIBRATION_TOLERANCE for m in misses.values()), misses
    assert all(0 <= share <= MAX_SERIAL_SHARE for share in serial.values()), serial  # Wan 3 %, HunyuanVideo 6 %


def test_ideal_scaling_fails_the_calibration():
    """The calibration can fail: a model that predicts N× on N GPUs misses the link-bound row."""
    misses = _misses(_calibrate(_ideal_speedup)[0])
    assert max(abs(m) for m in misses.values()) > CALIBRATION_TOLERANCE, misses
    assert misses["short clip 480p×33 on 4×4090, 12 GB/s"] > 1.0
    assert misses["core CFG split 2×3090 Wan I2V 512×512×33 fp8, cfg 1"] == pytest.approx(1.0)  # 2× where 1×


def test_core_cfg_split_streams_and_exchanges_nothing():
    cost = estimate_core_cfg_split(STEP_ROWS[0][1](), hardware_from_options(STEP_ROWS[0][2]))
    assert cost.strategy == "core_cfg_split" and cost.stream_s == 0 and cost.exchange_s == 0
    # the same as ShardDiT's sequence mode with replicas on two GPUs (groups of one): one formula
    replica = estimate_costs(STEP_ROWS[0][1](), hardware_from_options(STEP_ROWS[0][2]), replicas=True)["sequence"]
    assert cost.seconds_per_step == replica.seconds_per_step


# ------------------------------------------------------------------ done-when (issue 12)
@pytest.mark.parametrize("cfg, target", [(1, 1.8), (6, 1.9)])
def test_wan14b_720p_on_two_4090_without_p2p_chooses_sequence(cfg, target):
    # 2× RTX 4090 24 GiB, default link (12 GB/s, no P2P). The whole model (28 GB bf16) does not
    # fit one card; blocks and sequence both fit (per the simulator, issue 11).
    costs = estimate_costs(Workload(_wan14b(), 1280, 720, 81, cfg=cfg),
                           hardware_from_options(["NVIDIA GeForce RTX 4090"] * 2))
    strategy, reason = choose_strategy(costs, {"one_gpu": False, "blocks": True, "sequence": True})
    assert strategy == "sequence" and costs["sequence"].speedup >= target
    assert costs["blocks"].speedup < 1.0  # one GPU busy at a time, plus the hops
    assert reason.startswith(f"sequence: predicted {costs['sequence'].speedup:.2f}× vs 1 GPU")
    assert "1 GPU 1.00× (does not fit)" in reason


def test_short_clip_on_four_cards_at_12gbps_is_weight_bound_but_sequence_still_pays():
    # 832×480×33 (14,040 tokens) on 4× 24 GiB at 12 GB/s. What the model predicts:
    # cfg 1: one block computes in ~31 ms per device while streaming a 703 MB block takes ~59 ms,
    #        so 30 of 40 blocks wait for weights: ~1.87× (ANCHORS: "~1.8× at best"); blocks 0.99×.
    # cfg 6: two groups of two GPUs, each block ~63 ms of compute (~1.5 ms of it waiting for the
    #        pipelined exchange); the link carries the 59 ms stream and the 12 ms exchange, so
    #        about 5 % of the step waits for it: ~3.56×.
    hw = hardware_from_options(["RTX 4090"] * 4, link_gbps=12)
    fits = {"one_gpu": False, "blocks": True, "sequence": True}
    cfg1 = estimate_costs(Workload(_wan14b(), 832, 480, 33, cfg=1), hw)
    assert 1.6 < cfg1["sequence"].speedup < 2.1 and "weight-bound" in cfg1["sequence"].note
    assert cfg1["sequence"].stream_s > 0.25 * cfg1["sequence"].seconds_per_step
    cfg6 = estimate_costs(Workload(_wan14b(), 832, 480, 33, cfg=6), hw)
    seq6 = cfg6["sequence"]
    assert 3.0 < seq6.speedup < 3.6 and 0 < seq6.stream_s < 0.1 * seq6.seconds_per_step
    for costs in (cfg1, cfg6):
        strategy, reason = choose_strategy(costs, fits)
        fastest = max((n for n in costs if fits[n]), key=lambda n: costs[n].speedup)
        assert strategy == fastest == "sequence", reason
    # With NVLink-class bandwidth the same clip is compute-bound again.
    fast = estimate_costs(Workload(_wan14b(), 832, 480, 33), hardware_from_options(["RTX 4090"] * 4, link_gbps=450))
    assert fast["sequence"].stream_s == 0 and fast["sequence"].speedup > 3.5


# ------------------------------------------------------------------ behaviour
def test_slower_link_never_makes_sequence_faster():
    work = Workload(_wan14b(), 832, 480, 81)
    times = [estimate_costs(work, hardware_from_options(["RTX 4090"] * 4, link_gbps=g))["sequence"].seconds_per_step
             for g in (3, 6, 12, 25, 450)]
    assert times == sorted(times, reverse=True) and times[0] > 1.5 * times[-1]


def test_cfg_split_on_three_gpus_is_bound_by_the_group_of_one():
    # Batch split first: groups of 2 and 1 GPUs; the lone GPU computes a whole sample.
    work = Workload(_wan14b(), 1280, 720, 81, cfg=6)
    two = estimate_costs(work, hardware_from_options(["RTX 4090"] * 2))["sequence"]
    three = estimate_costs(work, hardware_from_options(["RTX 4090"] * 3))["sequence"]
    assert three.speedup == pytest.approx(two.speedup, rel=0.02)


def test_mixed_gpus_split_tokens_evenly_so_the_slow_card_sets_the_pace():
    work = Workload(_wan14b(), 1280, 720, 81)
    hw = hardware_from_options(["RTX 4090", "RTX 3090"], link_gbps=450)
    seq = estimate_costs(work, hw)["sequence"]
    assert seq.speedup == pytest.approx(2 * gpu_flops("RTX 3090") / gpu_flops("RTX 4090"), rel=0.05)


def test_replicas_stream_nothing_and_owned_blocks_stream_the_rest():
    work, hw = Workload(_wan14b(), 832, 480, 81), hardware_from_options(["RTX 4090"] * 2)
    block = 351_272_960 * 2
    streamed = estimate_sequence(work, hw).bytes_per_device
    replica = estimate_sequence(work, hw, replicas=True).bytes_per_device
    assert streamed - replica == 20 * block


# ------------------------------------------------------------------ decision and text
def test_choose_strategy_takes_the_fastest_that_fits():
    costs = estimate_costs(Workload(_wan14b(), 1280, 720, 81), hardware_from_options(["RTX 4090"] * 2))
    assert choose_strategy(costs, ALL_FIT)[0] == "sequence"
    assert choose_strategy(costs, {"one_gpu": True, "blocks": True})[0] == "one_gpu"
    assert choose_strategy(costs, {"blocks": True})[0] == "blocks"
    with pytest.raises(ValueError, match="no ShardDiT mode fits"):
        choose_strategy(costs, {})


def test_strategy_rows_show_peaks_time_speedup_and_fit():
    costs = estimate_costs(Workload(_wan14b(), 1280, 720, 81), hardware_from_options(["RTX 4090"] * 2))
    peaks = {"one_gpu": DevicePeak(27 * GiB, 13 * GiB), "blocks": DevicePeak(int(13.5 * GiB), int(6.6 * GiB)),
             "sequence": DevicePeak(int(13.5 * GiB), 4 * GiB, int(1.3 * GiB))}
    text = format_strategy_rows(costs, peaks, {"one_gpu": False, "blocks": True, "sequence": True},
                                "RTX 4090", "link 12 GB/s assumed")
    lines = text.splitlines()
    assert lines[0].startswith("strategy") and "fits" in lines[0]
    row = next(line for line in lines if line.startswith("sequence "))
    assert "13.5 + 4.0 + 1.3 = 18.8" in row and f"{costs['sequence'].speedup:.2f}×" in row and row.endswith("yes")
    assert next(line for line in lines if line.startswith("one_gpu")).endswith("no")
    assert "hypothetical" in text and "link 12 GB/s assumed" in text


def test_cost_modules_are_pure_python():
    for name in ("cost/inputs.py", "cost/model.py", "cost/report.py", "cost/baselines.py"):
        tree = ast.parse((Path(__file__).parents[1] / "parallel" / name).read_text())
        imported = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        imported |= {n.module.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
        assert not imported & {"torch", "comfy", "comfy_api", "folder_paths", "nodes", "loaders"}, (name, imported)


def test_speed_weighted_shares_are_priced_for_mixed_cards():
    """A 5090 beside a 4090 at cfg 1 (one batch group of two): even shares wait for the 4090 at every
    block; shares by throughput (the engine's ``set_speeds``) finish both at once. Equal cards: the
    same time either way. At cfg > 1 on two cards each sample has a card: shares do not apply."""
    mixed = hardware_from_options(["RTX 5090", "RTX 4090"], link_gbps=64)
    work = Workload(_wan14b(), 1280, 720, 81, cfg=1)
    even, weighted = (estimate_sequence(work, mixed, weighted=w).seconds_per_step for w in (False, True))
    ideal = (209.5 + 165.2) / (2 * 165.2)  # even: the 4090's half decides; weighted: both cards' sum
    assert 0.95 * ideal <= even / weighted <= 1.02 * ideal, even / weighted
    same = hardware_from_options(["RTX 4090"] * 2, link_gbps=64)
    assert estimate_sequence(work, same, weighted=True).seconds_per_step == estimate_sequence(work, same).seconds_per_step
    cfg = Workload(_wan14b(), 1280, 720, 81, cfg=5)
    assert estimate_sequence(cfg, mixed, weighted=True).seconds_per_step == estimate_sequence(cfg, mixed).seconds_per_step


# ------------------------------------------------------------------ gathered keys/values (LTX-2.3)
def test_every_family_that_gathers_keys_values_prices_them():
    """The registry's two sides agree: a family whose `sequence` gathers keys/values by heads
    (``TokenSpec.gather_kv``: LTX-2's video->audio attention) has a cost shape whose blocks carry the
    gathered width, and no other family's blocks do (presets: each family's published config)."""
    from sharddit.parallel.families import get_family

    seen = set()
    for spec in _presets().values():
        specs = get_family(spec.family).token_specs or ()
        gathers = any(t.gather_kv for t in specs)
        widths = [b.gathered_kv_width for b in shape_from_spec(spec).blocks]
        assert all(widths) if gathers else not any(widths), (spec.name, spec.family, widths)
        seen.add((spec.family, gathers))
    assert ("ltxav", True) in seen, seen


def test_ltx23_video_to_audio_keys_values_are_priced_in_sequence():
    """LTX-2.3 at 1280x704x121, cfg 1, on two 4090s at 12 GB/s: besides the video self-attention's
    Ulysses exchange (q, k, v, out: 4 x (g-1)/g x tokens/g x 4096 x 2 bytes), each rank receives the
    other rank's video keys and values of its audio heads for the video->audio attention (2 x tokens/2
    x 2048 x 16/32 x 2 bytes): 2048 / (2 x 4096) = +25 % exchange bytes, which `sequence` pays on
    every block. Dropping the term would price LTX-2.3's exchange at the self-attention's alone."""
    from dataclasses import replace

    shape = _shape("ltx-2.3")
    (block,) = shape.blocks
    assert block.gathered_kv_width == 2048 and shape.width == 4096 and shape.heads == 32
    bare = replace(shape, blocks=(replace(block, gathered_kv_width=0),))
    hw = hardware_from_options(["RTX 4090"] * 2, link_gbps=12)
    work = Workload(shape, 1280, 704, 121, cfg=1)
    priced, unpriced = (estimate_sequence(Workload(s, 1280, 704, 121, cfg=1), hw) for s in (shape, bare))
    n, g = work.tokens, 2
    ulysses = 4 * (g - 1) / g * -(-n // g) * 4096 * 2
    gathered = 2 * (n - -(-n // g)) * 2048 * (16 / 32) * 2
    per_block = gathered / hw.link_bytes_per_s + 2 * 50e-6
    assert priced.exchange_s - unpriced.exchange_s == pytest.approx(block.count * per_block, rel=1e-6)
    assert gathered / ulysses == pytest.approx(0.25, rel=0.01)
    # against the whole Ulysses exchange (unpipelined: the engine's head chunks hide most of it, not
    # the gathered keys/values, which are not chunked and stay exposed whole)
    whole = [estimate_sequence(Workload(s, 1280, 704, 121, cfg=1), hw, pipelined=False) for s in (shape, bare)]
    assert (whole[0].exchange_s - whole[1].exchange_s) / whole[1].exchange_s == pytest.approx(0.25, abs=0.01)
    assert priced.bytes_per_device - unpriced.bytes_per_device == pytest.approx(block.count * gathered, rel=1e-6)
    assert priced.seconds_per_step > unpriced.seconds_per_step and priced.speedup > 1.2, priced
    # a group of one (cfg > 1 on two GPUs: cond and uncond each on its own GPU) exchanges nothing
    cfg = [estimate_sequence(Workload(s, 1280, 704, 121, cfg=4), hw) for s in (shape, bare)]
    assert cfg[0].exchange_s == cfg[1].exchange_s == 0.0
