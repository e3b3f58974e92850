"""`plan` prices resident blocks (issue 34): Wan 2.1 14B at 832x480x33 on four 24 GiB GPUs over a
12 GB/s link, through the plan command (``loaders/cli/main``), as text and as JSON. In fp8 every GPU
has room for the whole model: `sequence` streams nothing after the first step and says so; in bf16
each GPU keeps what fits and the plan shows the split per GPU and prices the bytes still streamed.
About 10 s of CPU per plan."""
import json
import re

import pytest

pytestmark = pytest.mark.comfy
GiB = 1 << 30
FOUR_24 = "cuda:0=24GiB,cuda:1=24GiB,cuda:2=24GiB,cuda:3=24GiB"
BLOCK_PARAMS = 5120 * 5120 * 8 + 2 * 5120 * 13824  # one Wan 14B block's weights (cost/inputs: no biases)


def _plan(capsys, monkeypatch, *extra):
    """The plan's text as printed, and its JSON (``plan --json`` prints ``report.to_dict()``) from the
    same run: the simulation is spied on, not replaced (one ~10 s simulation instead of two)."""
    from sharddit.loaders.cli.main import main
    from sharddit.loaders.plan import dry_run as simulator

    reports, real = [], simulator.run_simulation
    monkeypatch.setattr(simulator, "run_simulation", lambda *a, **k: reports.append(real(*a, **k)) or reports[-1])
    args = ["plan", "--model", "wan2.1-t2v-14b", "--devices", FOUR_24, "--size", "832x480", "--frames", "33",
            "--link-gbps", "12", "--parallel", "sequence", *extra]
    assert main(args) == 0
    (report,) = reports
    return capsys.readouterr().out, json.loads(json.dumps(report.to_dict()))["parallel"]


def test_fp8_every_block_resident_streams_nothing(env, capsys, monkeypatch):
    text, data = _plan(capsys, monkeypatch, "--dtype", "fp8")
    seq = data["strategies"]["sequence"]
    assert seq["streamed_bytes_per_step"] == 0
    assert seq["speedup"] >= 3.6, seq  # issue 34's goal: the exchange pipelined beside the attention
    assert all((d["resident_blocks"], d["streamed_blocks"]) == (30, 30) for d in data["sequence_devices"].values())
    decision = next(line for line in text.splitlines() if line.startswith("sequence (requested) → "))
    assert decision.startswith(f"sequence (requested) → sequence: predicted {seq['speedup']:.2f}×"), decision
    assert decision.endswith("with every block resident on every GPU: nothing streamed after the first step")
    assert "sequence: every block resident, nothing streamed after the first step" in text


def test_bf16_shows_the_split_per_gpu_and_prices_what_still_streams(env, capsys, monkeypatch):
    """cfg 1: streaming a bf16 block takes longer than computing it, so the blocks kept matter: the
    step streams only the blocks each GPU could not keep (the busiest GPU's), and the prediction
    beats the ring alone (1.87x, ``test_resident_cost``)."""
    text, data = _plan(capsys, monkeypatch, "--cfg", "1")
    line = re.search(r"^resident blocks \(room beside the plan; dropped after each run\): (.+)$", text, re.MULTILINE)
    split = {d: (int(k), int(s)) for d, k, s in re.findall(r"(cuda:\d): (\d+) of 30 resident, (\d+) streamed",
                                                            line.group(1))}
    assert sorted(split) == ["cuda:0", "cuda:1", "cuda:2", "cuda:3"], line.group(0)
    assert all(0 < k < 30 and k + s == 30 for k, s in split.values()), split
    seq = data["strategies"]["sequence"]
    assert seq["streamed_bytes_per_step"] == max(s for _, s in split.values()) * BLOCK_PARAMS * 2
    assert 2.0 < seq["speedup"] < 3.0, seq
    assert re.search(r"blocks kept resident, \d+\.\d GiB still streamed per step on the busiest GPU", text), text
