"""Sequence mode with fewer image tokens per sample than the ranks that would split them (issue
19: a 16x16x1 latent at cfg 1 on ``cpu,cpu`` ended in a raw TypeError from a worker thread). Such a
forward runs whole (blocks mode, one device at a time), logged once with the token count, the
ranks and what splits; the result is the unsplit forward's. Toy DiT, threads on CPU."""
import logging

import pytest
import torch
from harness.toy_seq import SeqToyDiT
from sharddit.parallel.sequence.engine import attach_sequence_engine
from sharddit.parallel.sequence.split import TokenSpec
from sharddit.parallel.blocks.sharding import attach_block_sharding
from sharddit.parallel.blocks.routing import BlockLayout

WAN = BlockLayout(("blocks",), (("x",),))
WAN_SPEC = (TokenSpec({"x": 1, "e": 1, "freqs": 1}),)


@pytest.mark.parametrize("ranks,batch,tokens,per_group", [
    (2, 1, 1, 2),   # cfg 1, one token, two ranks
    (3, 1, 2, 3),   # cfg 1, two tokens, three ranks
    (3, 2, 1, 3),   # cfg > 1 on three ranks: one group of three (3 does not split in 2)
])
def test_fewer_tokens_than_ranks_runs_whole_and_equals_the_unsplit_forward(caplog, ranks, batch, tokens, per_group):
    torch.manual_seed(0)
    model = SeqToyDiT(dim=32, heads=4).eval()
    x, t, ctx = torch.randn(batch, tokens, 8), torch.rand(batch), torch.randn(batch, 5, 32)
    with torch.no_grad():
        ref = model(x, t, ctx)
    handle = attach_block_sharding(model, WAN, ["cpu"] * len(model.blocks), "cpu")
    engine = attach_sequence_engine(handle.router, [p for pl in handle.proxies.values() for p in pl], WAN_SPEC,
                                    ["cpu"] * ranks, timeout_s=30)
    try:
        with caplog.at_level(logging.WARNING, logger="sharddit"):
            for _ in range(2):
                with torch.no_grad(), handle.router.forward_scope(sequence=True):
                    out = model(x, t, ctx)
                assert torch.equal(out, ref), f"max diff {(out - ref).abs().max()}"  # whole: the same GEMM shapes
                assert engine.stats.fallbacks == len(model.blocks)
        lines = [r.getMessage() for r in caplog.records if "runs whole" in r.getMessage()]
        assert len(lines) == 1, lines  # once, not per block or per step
        assert (f"{tokens} image token(s) per sample, fewer than the {per_group} ranks that split each sample's "
                f"tokens") in lines[0], lines
    finally:
        engine.close()
        handle.detach()
