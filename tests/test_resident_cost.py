"""Resident blocks priced (issue 34): the rule that picks the blocks a `sequence` rank keeps
(``cost/resident``) is the ring's own, and the cost model prices the bytes each rank still streams
per step, for ``plan`` and the runtime ``auto`` alike (pure, CI)."""
import pytest
import torch
from sharddit.parallel.cost.inputs import ModelShape
from sharddit.parallel.cost.mode import ModeDecision, decide_auto_for_latent
from sharddit.parallel.cost.model import (
    Workload,
    estimate_sequence,
    hardware_from_options,
)
from sharddit.parallel.cost.resident import (
    describe_resident,
    kept_blocks,
    resident_per_rank,
)
from sharddit.parallel.families import shape_from_config
from sharddit.parallel.sequence.record import RecordingOps
from test_stream_order import OWNERS, RANKS, _model, _resident_run

GiB = 1 << 30
WAN_14B = {"image_model": "wan2.1", "model_type": "t2v", "patch_size": (1, 2, 2), "dim": 5120, "num_heads": 40,
           "ffn_dim": 13824, "num_layers": 40, "in_dim": 16, "out_dim": 16}


def _wan14b() -> ModelShape:
    return shape_from_config("wan2.1-t2v-14b", "wan", WAN_14B, 8, 4, 512)


def test_the_rule_keeps_what_the_ring_keeps():
    """Two recorded GPU ranks of the MM toy (6 double, 4 single blocks of two sizes) with a budget of
    one double and one single block: first-fit in block order skips the doubles that no longer fit and
    still keeps a single. After the first forward each rank streams exactly the blocks the rule leaves."""
    model = _model()
    blocks = list(model.double_blocks) + list(model.single_blocks)
    nbytes = [sum(t.numel() * t.element_size() for t in b.parameters()) for b in blocks]
    places = OWNERS["double_blocks"] + OWNERS["single_blocks"]
    budget = nbytes[0] + nbytes[-1]
    runs, _ = _resident_run(model, RecordingOps(), budget=budget)
    kept = resident_per_rank(nbytes, places, RANKS, [budget, budget])
    expected = [sum(b for i, (b, p) in enumerate(zip(nbytes, places)) if p != r and i not in k)
                for r, k in zip(RANKS, kept)]
    assert kept[0] == (2, 6) and kept[1] == (0, 8), kept  # cuda:0 skips doubles 3-5 for single 6
    assert runs[2][1] == expected, (runs[2][1], expected)


def test_kept_blocks_names_its_inputs():
    assert kept_blocks([4, 4, 4], ["a", "b", "b"], "a", 8) == (1, 2)
    assert kept_blocks([4, 4, 4], ["a", "b", "b"], "a", 7) == (1,)
    with pytest.raises(ValueError, match="one entry per block"):
        kept_blocks([4, 4], ["a"], "a", 8)
    with pytest.raises(ValueError, match="one byte count per rank"):
        resident_per_rank([4], ["a"], ["a", "b"], [1])


def _streamed_all(n_blocks=40, ranks=4):
    owned = n_blocks // ranks
    return [tuple(i for i in range(n_blocks) if i // owned != r) for r in range(ranks)]


def test_every_block_resident_streams_nothing_and_is_priced_so():
    """Wan 2.1 14B bf16, 480p x 33, cfg 1, four 4090s at 12 GB/s: streaming a 0.7 GB block takes
    longer than computing it (weight-bound, 1.87x). With every block resident on every rank the
    step streams 0 bytes and costs what full replicas cost; with some kept, the bytes still streamed
    are those of the blocks the rule leaves, and the time lies between."""
    work = Workload(_wan14b(), 832, 480, 33, cfg=1.0, weight_bytes=2.0)
    hw = hardware_from_options("RTX 4090", 4, link_gbps=12)
    ring = estimate_sequence(work, hw)
    full = estimate_sequence(work, hw, resident=_streamed_all())
    replicas = estimate_sequence(work, hw, replicas=True)
    block = work.shape.blocks[0].weight_params * 2
    assert ring.streamed_bytes == 30 * block and "weight-bound" in ring.note
    assert full.streamed_bytes == 0 and full.stream_s == 0
    assert full.seconds_per_step == pytest.approx(replicas.seconds_per_step)
    assert full.note.startswith("every block resident, nothing streamed after the first step"), full.note
    half = [k[:20] for k in _streamed_all()]  # 20 of 30 kept, 10 streamed each
    part = estimate_sequence(work, hw, resident=half)
    assert part.streamed_bytes == 10 * block
    assert full.seconds_per_step < part.seconds_per_step < ring.seconds_per_step
    assert ring.speedup < 2.0 and full.speedup > 3.0, (ring.speedup, full.speedup)


def test_describe_says_every_block_or_the_split():
    devs = ["cuda:0"] * 2 + ["cuda:1"] * 2
    assert describe_resident(devs, ["cuda:0", "cuda:1"], [(), ()]) == ""
    assert describe_resident(devs, ["cuda:0", "cuda:1"], [(2, 3), (0, 1)]).startswith("with every block resident")
    assert describe_resident(devs, ["cuda:0", "cuda:1"], [(2,), ()]) == \
        "resident blocks: cuda:0 keeps 1, streams 1, cuda:1 keeps 0, streams 2"


def test_auto_prices_the_blocks_each_rank_keeps():
    """The runtime ``auto`` (``decide_auto_for_latent``) gets the blocks each rank keeps this run:
    its `sequence` is the plan's estimate with the same resident blocks, and says so."""
    shape, ranks = _wan14b(), ["cuda:0", "cuda:1", "cuda:2", "cuda:3"]
    latent = (1, 16, 9, 60, 104)  # 832x480x33, cond only
    memory = ModeDecision("sequence", "sequence: fits")
    names = dict.fromkeys(ranks, "NVIDIA GeForce RTX 4090")
    plain = decide_auto_for_latent(memory, shape, latent, ranks, [10] * 4, names, link_gbps=12)
    kept = decide_auto_for_latent(memory, shape, latent, ranks, [10] * 4, names, link_gbps=12,
                                  resident=_streamed_all())
    full = estimate_sequence(Workload(shape, 832, 480, 33, cfg=1.0), hardware_from_options("RTX 4090", 4, link_gbps=12),
                             [10] * 4, resident=_streamed_all())
    assert f"sequence: predicted {full.speedup:.2f}×" in kept.reason, kept.reason
    assert "weight-bound" in plain.reason and "weight-bound" not in kept.reason
    assert torch.tensor(full.speedup) > 3.0
