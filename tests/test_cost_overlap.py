"""The cost model's price of the pipelined Ulysses exchange (pure, CI): ``exposed_exchange`` replays
``sequence/split.pipeline_schedule``, the order the engine runs (tests/test_sequence_pipeline.py
checks that order on the engine's own log). Hand-computed schedules, the unpipelined limit, and the
issue-34 plan figure with and without the overlap."""
import pytest
from sharddit.parallel.cost.model import (
    TRANSFER_LATENCY_S,
    Workload,
    estimate_sequence,
    exposed_exchange,
    hardware_from_options,
)
from sharddit.parallel.families import shape_from_spec
from sharddit.parallel.sequence.split import PIPELINE_CHUNKS, head_chunks, share_ranges

LAT = TRANSFER_LATENCY_S


def _wan14b():
    from sharddit.loaders.plan.presets import PRESETS
    return shape_from_spec(PRESETS["wan2.1-t2v-14b"])


def test_one_chunk_exposes_the_whole_exchange():
    assert exposed_exchange(0.020, 0.009, 0.003, 1) == pytest.approx(0.012 + 2 * LAT)
    assert exposed_exchange(5.0, 0.009, 0.003, 1) == pytest.approx(0.012 + 2 * LAT)  # nothing hides


def test_two_chunks_by_hand():
    """20.4 ms of attention, 9 ms of q/k/v, 3 ms of output, 2 chunks (times in ms, L the latency):
    link q/k/v 0 until 4.5+L, q/k/v 1 until 9+2L; attention 0 from 4.5+L to 14.7+L; output 0
    from 14.7+L to 16.2+2L; attention 1 from 14.7+L to 24.9+L; output 1 from 24.9+L to 26.4+2L:
    6 ms + 2L exposed of 12 ms + 4L."""
    ms = 1e-3
    assert exposed_exchange(20.4 * ms, 9 * ms, 3 * ms, 2) == pytest.approx(6 * ms + 2 * LAT)


def test_long_attention_hides_all_but_the_first_chunk_in_and_the_last_chunk_out():
    for c in (2, 4, 8):
        assert exposed_exchange(1.0, 0.009, 0.003, c) == pytest.approx(0.012 / c + 2 * LAT)


def test_no_attention_hides_nothing():
    assert exposed_exchange(0.0, 0.009, 0.003, 4) == pytest.approx(0.012 + 8 * LAT)


def test_the_issue_34_plan_reaches_3_6x_only_with_the_overlap():
    """``plan --model wan2.1-t2v-14b --dtype fp8 --devices 4 x 24 GiB --size 832x480 --frames 33
    --link-gbps 12 --parallel sequence``: cfg 6 (two groups of two GPUs), every block resident."""
    work = Workload(_wan14b(), 832, 480, 33, cfg=6, weight_bytes=1)
    hw = hardware_from_options(["RTX 4090"] * 4, link_gbps=12)
    every = [set(range(40))] * 4
    whole = estimate_sequence(work, hw, resident=every, pipelined=False)
    piped = estimate_sequence(work, hw, resident=every)
    assert whole.speedup == pytest.approx(3.31, abs=0.01) and whole.streamed_bytes == 0
    assert piped.speedup >= 3.6 and piped.streamed_bytes == 0 and piped.stream_s == 0
    assert piped.compute_s == whole.compute_s  # the same work: only the exposed exchange changes
    assert piped.exchange_s < 0.35 * whole.exchange_s
    assert "every block resident" in piped.note
    # both sides chunk the same: 40 heads over 2 ranks, 4 chunks of 5
    assert head_chunks(share_ranges(40, 2), PIPELINE_CHUNKS) == 4


def test_the_link_carries_the_stream_and_the_whole_exchange():
    """Streaming blocks (nothing resident) at cfg 6: the weights and the exchange share the link,
    so the step is at least the blocks' stream plus exchange, however much of the exchange the
    attention hides."""
    work = Workload(_wan14b(), 832, 480, 33, cfg=6)
    hw = hardware_from_options(["RTX 4090"] * 4, link_gbps=12)
    whole, piped = estimate_sequence(work, hw, pipelined=False), estimate_sequence(work, hw)
    assert piped.seconds_per_step < whole.seconds_per_step
    link_s = piped.streamed_bytes / hw.link_bytes_per_s + whole.exchange_s
    assert piped.seconds_per_step - piped.hop_s >= link_s * 0.999
    assert piped.stream_s > 0  # the link, not the compute, sets the pace here


def test_auto_prices_the_pipeline_only_where_every_rank_is_a_gpu_of_this_machine():
    """The engine pipelines the exchange between GPU ranks of one process; a worker's rank (its
    ``DistExchange``) or a CPU rank exchanges whole, and ``auto`` must price what will run."""
    from sharddit.parallel.cost.mode import ModeDecision, decide_auto_for_latent

    seq = ModeDecision("sequence", "fits")
    latent = (2, 16, 9, 60, 104)  # 832x480x33 at cfg > 1
    every = [set(range(40))] * 4

    def predicted(ranks):
        d = decide_auto_for_latent(seq, _wan14b(), latent, ranks, [10] * 4, {}, link_gbps=12, weight_bytes=1,
                                   resident=every)
        return float(d.reason.split("predicted ")[1].split("×")[0])

    assert predicted(["cuda:0", "cuda:1", "cuda:2", "cuda:3"]) == pytest.approx(3.75, abs=0.01)
    assert predicted(["cuda:0", "cuda:1", "w1/cuda:0", "w1/cuda:1"]) == pytest.approx(3.31, abs=0.01)


def test_worker_processes_are_priced_with_the_whole_exchange():
    """Ranks in worker processes exchange through ``DistExchange``, unpipelined: the network step
    (``cost/workers``) prices the whole exchange."""
    from sharddit.parallel.cost.model import Hardware
    from sharddit.parallel.cost.workers import compute_network_step

    work = Workload(_wan14b(), 832, 480, 33, cfg=1)
    flops, gbps = (99e12, 99e12), 100.0
    net = compute_network_step(work, flops, [20, 20], True, gbps)
    hw = Hardware(flops, gbps * 1e9 / 8)
    whole = estimate_sequence(work, hw, [20, 20], replicas=True, pipelined=False)
    assert net.step_s == pytest.approx(whole.seconds_per_step)
    assert estimate_sequence(work, hw, [20, 20], replicas=True).seconds_per_step < 0.95 * whole.seconds_per_step
