"""The plan's strategy rows: `sequence` peaks simulated with the real engine on fake GPUs, predicted
speed from the cost model, and `auto` picking the fastest that fits (issue 12).

ComfyUI's Wan 2.1 14B (40 blocks, dim 5120, ffn 13824, 40 heads) on ``meta``, one forward per
strategy inside FakeTensorMode. Each simulation takes ~10-30 s of CPU here.
"""
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
GiB = 1 << 30
FOUR_12 = "cuda:0=12GiB,cuda:1=12GiB,cuda:2=12GiB,cuda:3=12GiB"


@pytest.fixture(scope="module")
def sim():
    from sharddit.loaders.comfyui_import import import_comfyui

    import_comfyui()
    from sharddit.loaders.plan import dry_run as simulator

    return simulator


def _start(*args, comfy=True):
    env = {k: v for k, v in os.environ.items() if k != "COMFYUI_PATH"}
    if comfy:
        env["COMFYUI_PATH"] = os.environ["COMFYUI_PATH"]
    return subprocess.Popen([sys.executable, str(REPO), "plan", "--model", "wan2.1-t2v-14b", *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=str(REPO))


def _done(proc):
    out, err = proc.communicate(timeout=900)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def _plan(*args, comfy=True):
    return _done(_start(*args, comfy=comfy))


@pytest.mark.comfy
def test_wan14b_720p_fits_four_12gib_in_sequence_not_in_blocks(sim):
    """cfg 1 (batch 1). Formula check of the simulated sequence peaks per device:
    weights = the blocks it owns (+ the DiT home on cuda:0), prefetch = two of the largest block
    (``cost/mode.prefetch_bytes``), activations at least the FFN hidden of its quarter of the
    tokens (L/4 x 13824 bf16) and at most half of what blocks mode needs for all tokens."""
    from sharddit.parallel.cost.mode import prefetch_bytes

    report = sim.simulate("wan2.1-t2v-14b", FOUR_12, 1280, 720, 81, parallel="auto", cfg=1, gpu="RTX 4090")
    st = report.strategies
    assert report.batch == 1 and st.cfg == 1
    assert st.fits["sequence"] and not st.fits["blocks"] and not st.fits["one_gpu"]
    assert st.chosen == "sequence" and report.fits
    usable = 12 * GiB - 1 * GiB  # the default 1 GiB reserve
    seq = st.sequence_devices
    assert [p.device for p in seq] == ["cuda:0", "cuda:1", "cuda:2", "cuda:3"]
    block_bytes = (5120 * 5120 * 8 + 2 * 5120 * 13824) * 2  # weights of one Wan 14B block, bf16
    blocks_act = max(d.peak_activations for d in report.devices)
    tokens = 21 * 45 * 80
    for p in seq:
        assert p.total <= usable, p
        assert p.prefetch == prefetch_bytes([block_bytes]) or abs(p.prefetch / prefetch_bytes([block_bytes]) - 1) < 0.01
        assert abs(p.weights - 10 * block_bytes - (st.peaks["one_gpu"].weights_bytes - 40 * block_bytes
                                                     if p.device == "cuda:0" else 0)) < 0.01 * p.weights
        assert tokens // 4 * 13824 * 2 <= p.activations <= blocks_act / 2
    # blocks: the same quarter of the weights but every token's activations on each device
    assert any(d.shortfall for d in report.devices) or report.plan is None
    text = report.to_text()
    assert "auto → sequence: predicted" in text and "FITS: sequence over 4 GPUs (batch 1, tokens split)." in text
    from sharddit.loaders.plan.picture import picture_from_report

    pic = picture_from_report(report)
    assert pic.fits and pic.title == f"FITS - auto -> sequence on 4 GPUs, {st.costs['sequence'].speedup:.2f}x vs 1 GPU"
    # the bars show the sequence ranks: their blocks, the two streamed-block buffers, activations
    assert [b.device for b in pic.bars] == ["cuda:0", "cuda:1", "cuda:2", "cuda:3"]
    assert [b.segments["prefetch"] for b in pic.bars] == [p.prefetch for p in seq]
    assert pic.bars[1].label == "blocks 10-19" and not any(b.short for b in pic.bars)


@pytest.mark.comfy
def test_wan14b_720p_cfg6_fits_four_12gib_in_lean_sequence(sim):
    """Issue 24 item 5. cfg 6 on four 12 GiB cards: cond and uncond together need 13.1 GiB on cuda:0
    (of 11.0 usable), so `sequence` runs lean (``sequence/lean``): cond, then uncond, each with its
    tokens over all four GPUs; its peaks are one pass's (a cfg-1 forward), its cost two passes'.
    ``plan`` exits 0 exactly when ``report.fits`` (``cli/plan_command``)."""
    report = sim.simulate("wan2.1-t2v-14b", FOUR_12, 1280, 720, 81, parallel="auto", cfg=6, gpu="RTX 4090")
    st = report.strategies
    assert st.cfg == 6 and st.sequence_lean and st.fits["sequence"] and not st.fits["blocks"]
    assert st.chosen == "sequence" and report.fits
    usable = 12 * GiB - 1 * GiB
    seq = st.sequence_devices
    assert [p.device for p in seq] == ["cuda:0", "cuda:1", "cuda:2", "cuda:3"]
    assert all(p.total <= usable for p in seq), seq
    assert re.search(r"lean: cond and uncond together do not fit \(cuda:0 13\.\d of 11\.0 GiB\)", st.reason), st.reason
    assert st.costs["sequence"].note.startswith("lean: 2 passes per step") and st.costs["sequence"].speedup > 1
    text = report.to_text()
    assert "FITS: sequence over 4 GPUs (lean: cond, then uncond, each with its tokens split over every GPU)." in text
    assert st.to_dict()["sequence_lean"] is True


def _text_and_json(report):
    """The report as ``plan`` prints it and as ``plan --json`` prints it (``cli/plan_command``: the
    text, or ``json.dumps(report.to_dict())``; it exits 0 exactly when ``report.fits``). In process:
    the CLI's own flags and exit codes are test_simulator_comfy's and the tests below."""
    return report.to_text(), json.loads(json.dumps(report.to_dict()))


def _strategies(data):
    return data["parallel"]["chosen"], data["parallel"]["strategies"]


@pytest.mark.comfy
@pytest.mark.parametrize("cfg,least", [(1, 1.8), (6, 1.9)])
def test_done_when_two_4090s_720p_auto_picks_sequence(sim, cfg, least):
    report = sim.simulate("wan2.1-t2v-14b", "cuda:0=24GiB,cuda:1=24GiB", 1280, 720, 81, parallel="auto", cfg=cfg,
                          gpu="RTX 4090")
    text, as_json = _text_and_json(report)
    assert report.fits, text
    lines = text.splitlines()
    # per-device peak GiB (the name column is as wide as the longest row name: core_cfg_split on 0.29)
    assert any(re.match(r"sequence +\| 13\.", line) for line in lines), text
    assert "Simulated forward (sequence, per device):" in text
    decision = next(line for line in lines if line.startswith("auto → "))
    assert decision.startswith("auto → sequence: predicted"), decision
    chosen, rows = _strategies(as_json)
    assert chosen == "sequence" and rows["sequence"]["fits"]
    assert rows["sequence"]["speedup"] >= least
    assert rows["blocks"]["speedup"] == pytest.approx(1.0, abs=0.02)  # one GPU busy at a time
    peak = rows["sequence"]["peak"]
    assert peak["prefetch_bytes"] > 0 and peak["weights_bytes"] + peak["activation_bytes"] + peak["prefetch_bytes"] < 23 * GiB


@pytest.mark.comfy
def test_four_cards_480p_33_frames_on_pcie_says_whether_sequence_pays(sim):
    """Short video (9 x 30 x 52 = 14040 tokens) on a 12 GB/s link: the pick is the fastest row
    that fits, and the decision line carries its predicted speed-up."""
    report = sim.simulate("wan2.1-t2v-14b", "cuda:0=24GiB,cuda:1=24GiB,cuda:2=24GiB,cuda:3=24GiB", 832, 480, 33,
                          parallel="auto", cfg=1, gpu="RTX 4090", link_gbps=12)
    text, as_json = _text_and_json(report)
    assert report.fits, text
    chosen, rows = _strategies(as_json)
    fitting = {k: v for k, v in rows.items() if v["fits"]}
    assert chosen == min(fitting, key=lambda k: fitting[k]["seconds_per_step"])
    assert rows["sequence"]["devices"] == ["cuda:0", "cuda:1", "cuda:2", "cuda:3"]
    assert f"auto → {chosen}: predicted {rows[chosen]['speedup']:.2f}× vs 1 GPU" in text
    assert "link 12 GB/s (given)" in text


@pytest.mark.parametrize("flag,value,words", [
    ("--cfg", "0.5", ["cfg '0.5'", "--cfg 6"]),
    ("--gpu", "GTX 480", ["'GTX 480'", "rtx 4090", "--gpu"]),
    ("--link-gbps", "-1", ["'-1'", "--link-gbps 12"]),
    ("--parallel", "fast", ["'fast'", "auto", "sequence"]),
])
def test_bad_strategy_flags_exit_2_naming_value_and_fix(flag, value, words):
    out = _plan("--devices", "cuda:0=24GiB", flag, value, comfy=False)
    assert out.returncode == 2, out.stdout + out.stderr
    for w in words:
        assert w in out.stderr, out.stderr
    assert "Traceback" not in out.stderr


def _core_has_cfg_split():
    root = Path(os.environ["COMFYUI_PATH"])
    return (root / "comfy" / "multigpu.py").exists() and (root / "comfy_extras" / "nodes_multigpu.py").exists()


def _core_has_dynamic_vram():
    return "class ModelPatcherDynamic" in (Path(os.environ["COMFYUI_PATH"]) / "comfy" / "model_patcher.py").read_text()


@pytest.mark.comfy
def test_core_options_beside_sharddits_modes(sim):
    """Wan 2.1 1.3B bf16 at 832×480×33, cfg 6, on two 8 GiB GPUs: a full copy (2.6 GiB) fits each, so
    core's CFG split puts cond and uncond on their own GPU as sequence does, streaming nothing: the
    decision names it as fast as sequence. One GPU with dynamic VRAM holds everything here (1.00×).
    On a core without them (0.3.64) the rows are absent and the plan says so."""
    report = sim.simulate("wan2.1-t2v-1.3b", "cuda:0=8GiB,cuda:1=8GiB", 832, 480, 33, parallel="auto", cfg=6,
                          gpu="RTX 4090")
    st, text = report.strategies, report.to_text()
    whole, act = st.peaks["one_gpu"].weights_bytes, max(d.peak_activations for d in report.devices)
    assert st.chosen == "sequence"  # auto picks among ShardDiT's modes only
    if _core_has_cfg_split():
        split = st.to_dict()["strategies"]["core_cfg_split"]
        assert split["devices"] == ["cuda:0", "cuda:1"] and split["fits"]
        assert split["peak"] == {"weights_bytes": whole, "activation_bytes": act // report.batch, "prefetch_bytes": 0}
        assert 1.9 < split["speedup"] <= 2.0
        assert f"core's CFG split predicted {split['speedup']:.2f}× (fits: full copy {whole / GiB:.1f} GiB per GPU) " \
               "— as fast as sequence; use it if you prefer core" in st.decision_line()
        assert re.search(r"^core_cfg_split +\| .* \| yes$", text, re.MULTILINE), text
    else:
        assert "core_cfg_split" not in st.costs and "core's CFG split" not in text
    if _core_has_dynamic_vram():
        dyn = st.to_dict()["strategies"]["dynamic_vram"]
        assert dyn["devices"] == ["cuda:0"] and dyn["fits"] and dyn["speedup"] == pytest.approx(1.0)
        assert dyn["peak"]["weights_bytes"] >= whole - GiB // 4  # everything resident (cost model's block bytes)
        # no GPU in this process: the row states the condition it holds under
        assert "dynamic_vram: on ComfyUI with dynamic VRAM (NVIDIA): whole model resident" in text
    else:
        assert "dynamic_vram" not in st.costs
    if not _core_has_cfg_split() and not _core_has_dynamic_vram():
        assert "core's own options: neither in this ComfyUI (one GPU with dynamic VRAM needs core 0.16+, " \
               "core's MultiGPU CFG Split 0.23+)" in text


@pytest.mark.comfy
def test_a_plan_only_core_can_run_says_so_in_its_verdict(sim):
    """Wan 2.1 14B bf16 at 1280×720×81 on one 24 GiB GPU: no ShardDiT mode fits (one device, 26 GiB of
    weights), but core's dynamic VRAM streams what does not fit from host RAM, and its row says `yes`.
    The verdict and `auto`'s line agree with that row (issue 35: a plan that said "DOES NOT FIT … buy
    larger GPUs" under its own fitting `dynamic_vram` row); the exit code stays 3 (ShardDiT does not fit).
    Where a ComfyUI has no dynamic VRAM (0.3.64), nothing fits and the verdict says only that."""
    report = sim.simulate("wan2.1-t2v-14b", "cuda:0=24GiB", 1280, 720, 81, parallel="auto", cfg=6, gpu="RTX 4090")
    st, text = report.strategies, report.to_text()
    assert not report.fits and not st.ok
    verdict = text[text.index("DOES NOT FIT"):]
    if _core_has_dynamic_vram():
        assert st.fits["dynamic_vram"], st.fits
        assert re.search(r"^dynamic_vram +\| .* \| yes$", text, re.MULTILINE), text
        assert verdict.startswith("DOES NOT FIT with ShardDiT: cuda:0 short by"), verdict
        assert "But core's own dynamic_vram fits these GPUs (" in verdict and "on cuda:0, predicted 1.00×" in verdict
        assert "core's own dynamic_vram fits (its row)" in st.decision_line()
    else:
        assert verdict.startswith("DOES NOT FIT: cuda:0 short by") and "But core's own" not in text
    assert "no ShardDiT mode fits" in st.decision_line() and "[ShardDiT]" not in st.decision_line()
