"""Weight bytes each `sequence` rank streams per step, with and without room for resident blocks (issue 34).

A HunyuanVideo-shaped toy (``tests/harness/toy_seq.SeqToyMMDiT``: 6 double and 4 single blocks) runs
three forwards in `sequence` on two CPU ranks that ``parallel/sequence/record.RecordingOps`` presents
as ``cuda:0`` and ``cuda:1`` (each owns half the blocks, so each streams the other half). Counted, not
timed: the ring's ``bytes_copied`` per forward (``SequenceStats.bytes_streamed``) for three budgets:
none (the ring alone), room for half of what each rank streams, and room for all of it. With room for
all, every step after the first streams 0 bytes; the outputs are checked bit-identical to the ring's.

    python benchmarks/resident_bytes.py
"""
from __future__ import annotations

import sys
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]


def main() -> int:
    sys.path.insert(0, str(REPO / "tests"))
    from harness.pack import import_pack

    import_pack()
    from harness.toy_seq import SeqToyMMDiT

    from sharddit.parallel.blocks.sharding import attach_block_sharding
    from sharddit.parallel.blocks.routing import BlockLayout
    from sharddit.parallel.sequence.engine import attach_sequence_engine
    from sharddit.parallel.sequence.record import RecordingOps
    from sharddit.parallel.sequence.split import TokenSpec
    from sharddit.parallel.sequence.stream import BlockStream

    layout = BlockLayout(("double_blocks", "single_blocks"), (("img", "txt"), ("x",)))
    specs = (TokenSpec({"img": 1, "pe": 2}, replicated_streams=("txt",), tail_stream="txt"),
             TokenSpec({"x": 1, "pe": 2}, tail_stream="txt"))
    ranks = ("cuda:0", "cuda:1")
    torch.manual_seed(1)
    inputs = (torch.randn(1, 64, 8), torch.rand(1), torch.randn(1, 8, 128))

    def run(budget):
        torch.manual_seed(0)
        model = SeqToyMMDiT(dim=128, heads=4, n_double=6, n_single=4).eval()
        blocks = list(model.double_blocks) + list(model.single_blocks)
        rec = RecordingOps()
        for g, block in enumerate(blocks):
            rec.put(block, ranks[g * 2 // len(blocks)])
        size = [sum(t.numel() * t.element_size() for t in b.parameters()) for b in blocks]
        streams = [sum(n for g, n in enumerate(size) if ranks[g * 2 // len(blocks)] != r) for r in ranks]
        handle = attach_block_sharding(model, layout, ["cpu"] * len(blocks), "cpu")
        engine = attach_sequence_engine(handle.router, [p for pl in handle.proxies.values() for p in pl], specs,
                                        ["cpu", "cpu"], timeout_s=60)
        engine.streams = [BlockStream("cpu", ops=rec, place=p) for p in ranks]
        engine.keep_resident([int(budget * n) for n in streams])
        per_step, outs = [], []
        try:
            for _ in range(3):
                with torch.no_grad(), handle.router.forward_scope(sequence=True):
                    outs.append(model(*inputs))
                per_step.append(list(engine.stats.bytes_streamed))
        finally:
            engine.close()
            handle.detach()
        assert rec.violations() == [], rec.violations()
        return per_step, outs, streams

    ring, ring_out, streams = run(0)
    print("toy: 10 blocks over 2 ranks; each rank streams the other's: "
          + ", ".join(f"{r} {n / 2**20:.2f} MiB" for r, n in zip(ranks, streams, strict=True)) + " per step")
    for label, budget in (("no room (ring only)", 0), ("room for half", 0.5), ("room for all", 1.0)):
        per_step, outs, _ = run(budget)
        assert all(torch.equal(a, b) for a, b in zip(outs, ring_out, strict=True)), label
        steps = "; ".join(f"step {i + 1}: " + ", ".join(f"{b / 2**20:.2f}" for b in s) for i, s in enumerate(per_step))
        print(f"{label:20s} MiB streamed per rank — {steps}")
        later = sum(per_step[-1])
        print(f"  ratio of a later step to the ring's: {later / sum(ring[-1]):.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
