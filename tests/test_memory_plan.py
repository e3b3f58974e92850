"""The `sequence` memory plan (pure): ring buffers per block shape, activations from tokens, and an
explicit ``parallel=sequence`` that does not fit refused with the GiB missing per device (issue 21).

Toy footprint, sizes in GiB (G = 2**30 bytes): HY = a HunyuanVideo-like DiT, 4 "double" blocks of
2 GiB then 8 "single" blocks of 1 GiB (16 GiB of blocks) + 1 GiB home, 2 GiB activation room.
"""
import pytest
from sharddit.parallel.placement.devices import parse_device_plan
from sharddit.parallel.cost.memory import (
    compute_prefetch_bytes,
    compute_sequence_activations,
    format_shortfalls,
    plan_sequence_memory,
)
from sharddit.parallel.placement.inventory import inventory_from_spec as spec
from sharddit.parallel.cost.mode import (
    decide_parallel,
    prefetch_bytes,
    sequence_shortfalls,
)
from sharddit.parallel.placement.planner import plan_placement
from sharddit.parallel.placement.plan_types import Footprint, PlacementRequest

G = 1 << 30
HY = Footprint(block_bytes=(2 * G,) * 4 + (G,) * 8, dit_home_bytes=G, dit_activation_bytes=2 * G)
KINDS = ["double"] * 4 + ["single"] * 8


def test_ring_counts_two_buffers_per_block_shape():
    assert prefetch_bytes(HY.block_bytes) == 2 * 2 * G + 2 * G  # two shapes: 4 buffers, not 2 x largest
    assert prefetch_bytes(HY.block_bytes, KINDS) == 6 * G
    devices = ["cuda:0"] * 4 + ["cuda:1"] * 8  # cuda:0 owns the doubles, cuda:1 the singles
    assert compute_prefetch_bytes(HY.block_bytes, devices, "cuda:0", KINDS) == 2 * G  # streams singles only
    assert compute_prefetch_bytes(HY.block_bytes, devices, "cuda:1", KINDS) == 4 * G
    one_single = ["cuda:0"] * 11 + ["cuda:1"]  # a kind streamed once needs one buffer
    assert compute_prefetch_bytes(HY.block_bytes, one_single, "cuda:1", KINDS) == 2 * 2 * G + 2 * G
    assert compute_prefetch_bytes(HY.block_bytes, one_single, "cuda:0", KINDS) == G


def test_activations_grow_with_tokens_and_split_by_rank():
    small = compute_sequence_activations("wan", 5120, 32760, 1, 2)
    large = compute_sequence_activations("wan", 5120, 75600, 1, 2)
    assert all(b > a * 2 for a, b in zip(small, large, strict=True))  # 2.3x the tokens
    # cfg > 1 on 4 ranks: two groups of two; a rank's share equals cfg 1 on 2 ranks (its own sample, half the tokens)
    four = compute_sequence_activations("wan", 5120, 32760, 2, 4)
    assert four[1] == four[2] == four[3] == small[1] and four[0] > four[1]  # rank 0 is home
    # 40 heads over a group of 3 ranks: 14/13/13; the rank with 14 holds more in the exchange
    uneven = compute_sequence_activations("wan", 5120, 32760, 1, 3, heads=40)
    even = compute_sequence_activations("wan", 5120, 32760, 1, 3)
    assert uneven[0] > even[0] and uneven[1] < even[1]
    with pytest.raises(ValueError, match="'flux'"):
        compute_sequence_activations("flux", 3072, 100, 1, 2)


def test_plan_rows_add_up():
    rows = plan_sequence_memory("hunyuan_video", 3072, 1000, 2, ["cuda:0", "cuda:1"], HY.block_bytes,
                                ["cuda:0"] * 4 + ["cuda:1"] * 8, "cuda:0", G, KINDS, text_tokens=256)
    assert [r.weights for r in rows] == [9 * G, 8 * G] and [r.prefetch for r in rows] == [2 * G, 4 * G]
    assert rows[0].activations > rows[1].activations > 0
    said = format_shortfalls(rows, {"cuda:0": 10 * G, "cuda:1": None})
    assert said.startswith("cuda:0 needs") and "GiB missing" in said and "cuda:1" not in said


def _plan(inventory):
    return plan_placement(spec(inventory), HY, PlacementRequest(devices=parse_device_plan("cuda:0,cuda:1")))


def test_explicit_sequence_checks_room_like_auto():
    roomy = "cuda:0=24GiB,cuda:1=24GiB"
    plan = _plan(roomy)
    assert decide_parallel("sequence", plan, HY, spec(roomy), 0, KINDS).mode == "sequence"
    assert decide_parallel("auto", plan, HY, spec(roomy), 0, KINDS).mode == "sequence"
    # 13 GiB each: cuda:0 holds home + the doubles (9 GiB) + 2 GiB activations and streams the singles
    # (2 x 1 GiB: fits exactly); cuda:1 holds the singles (8 GiB) + 2 and streams the doubles (2 x 2 GiB)
    tight = "cuda:0=13GiB,cuda:1=13GiB"
    plan = _plan(tight)
    assert plan.block_devices() == ("cuda:0",) * 4 + ("cuda:1",) * 8
    assert decide_parallel("auto", plan, HY, spec(tight), 0, KINDS).mode == "blocks"
    short = sequence_shortfalls(plan, HY, spec(tight), 0, KINDS)
    assert short == [("cuda:1 has 3.0 GiB left after its share (8.0 GiB weights + 2.0 GiB activations), needs "
                      "4.0 GiB for its streamed blocks: 1.0 GiB missing")]
    with pytest.raises(ValueError) as err:
        decide_parallel("sequence", plan, HY, spec(tight), 0, KINDS)
    text = str(err.value)
    assert "parallel 'sequence' does not fit" in text and "parallel 'auto'" in text and short[0] in text
    assert "cuda:0" not in text  # it has room for what it streams
    # a reserve counts against the room as it does for auto
    assert sequence_shortfalls(_plan(roomy), HY, spec(roomy), 12 * G, KINDS)
