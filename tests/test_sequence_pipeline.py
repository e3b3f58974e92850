"""Pipelined Ulysses by head chunks (``sequence/ulysses``), checked on CPU (pure, seconds).

On GPU ranks the heads are cut into chunks: chunk c+1's q/k/v are exchanged on an exchange stream
while chunk c attends, and chunk c's output goes back while chunk c+1 attends. Here the chunking is
forced on CPU ranks (``LocalRanks.chunks``): attention is per head, so the chunked forward must be
the unchunked one: bit for bit, except where CPU SDPA blocks a small call differently by its head
count (a few ulp: measured 2.7e-7 once, on 13 tokens with 1 head per call), so both it and the
unsharded reference are compared within the split bound of tests/harness/numerics.py. With ``RecordingOps`` standing in for two GPUs, the log must
show no race, and the overlap itself: chunk c+1's q/k/v copies queued before chunk c's attention
and unordered with it, chunk c's output copies unordered with chunk c+1's attention; removing any
one of ``stream.EXCHANGE_WAITS`` must make the race check fail.
"""
import dataclasses

import pytest
import torch
from harness.numerics import assert_split_close
from harness.seq_models import MM, MM_SPEC, WAN, WAN_SPEC
from harness.toy_seq import SeqToyDiT, SeqToyMMDiT
from sharddit.parallel.blocks.sharding import attach_block_sharding
from sharddit.parallel.sequence import stream as seq_stream
from sharddit.parallel.sequence.engine import attach_sequence_engine
from sharddit.parallel.sequence.record import RecordingOps
from sharddit.parallel.sequence.split import (
    PIPELINE_CHUNKS,
    even_ranges,
    head_chunks,
    pipeline_schedule,
    share_ranges,
)
from sharddit.parallel.sequence.stream import EXCHANGE_WAITS, without_wait
from sharddit.parallel.sequence.threads import ThreadExchange

GPUS = ("cuda:0", "cuda:1", "cuda:2")


def _run(model, layout, specs, n_ranks, inputs, chunks=None, rec=None):
    """(output, engine stats) of one `sequence` forward on ``n_ranks`` CPU ranks; ``chunks``: the
    head chunks forced (None: CPU's default, unpipelined); ``rec``: the exchanges recorded as GPUs."""
    n = sum(len(getattr(model, p)) for p in layout.block_lists)
    handle = attach_block_sharding(model, layout, ["cpu"] * n, "cpu")
    proxies = [p for pl in handle.proxies.values() for p in pl]
    engine = attach_sequence_engine(handle.router, proxies, specs, ["cpu"] * n_ranks, timeout_s=30)
    engine.runner.chunks = chunks
    if rec is not None:
        engine.runner.exchange_ops, engine.runner.places = rec, GPUS[:n_ranks]
    try:
        with torch.no_grad(), handle.router.forward_scope(sequence=True):
            out = model(*inputs)
    finally:
        engine.close()
        handle.detach()
    return out, engine.stats


def _wan(heads, dim, batch=1, tokens=13):
    torch.manual_seed(0)
    model = SeqToyDiT(dim=dim, heads=heads).eval()
    return model, (torch.randn(batch, tokens, 8), torch.rand(batch), torch.randn(batch, 5, dim))


def test_every_rank_chunks_its_own_heads_the_same_number_of_times():
    assert head_chunks(share_ranges(40, 2)) == PIPELINE_CHUNKS == 4  # Wan 14B at cfg > 1 on 4 GPUs: 20 heads each
    assert head_chunks(share_ranges(40, 3)) == 4  # 14, 13, 13 heads
    assert head_chunks(share_ranges(56, 3)) == 4 and head_chunks(share_ranges(7, 3)) == 2  # 3, 2, 2
    assert head_chunks(share_ranges(2, 3)) == 1  # a rank with no head: unpipelined
    assert head_chunks(share_ranges(40, 2), 1) == 1
    assert even_ranges(14, 4) == [(0, 4), (4, 8), (8, 11), (11, 14)]


def test_the_schedule_posts_the_next_chunk_before_this_chunks_attention():
    assert pipeline_schedule(1) == [("qkv", 0), ("attend", 0), ("out", 0)]  # the unpipelined exchange
    assert pipeline_schedule(3) == [("qkv", 0), ("qkv", 1), ("attend", 0), ("out", 0), ("qkv", 2),
                                    ("attend", 1), ("out", 1), ("attend", 2), ("out", 2)]


@pytest.mark.parametrize("n_ranks,heads,dim,batch,chunks", [
    (2, 4, 32, 1, 2),    # 2 heads each, 2 chunks of 1
    (3, 7, 28, 1, 4),    # 3, 2, 2 heads: every rank 2 chunks
    (3, 40, 80, 1, 4),   # Wan 14B's 40 heads over 3 ranks: 14, 13, 13 in 4 chunks
    (2, 56, 112, 2, 4),  # 56 heads, cond + uncond on 2 ranks: groups of one rank, nothing exchanged
    (3, 56, 112, 1, 8),  # 19, 19, 18 heads in 8 chunks
], ids=["2r-4h", "3r-7h", "3r-40h", "2r-56h-cfg", "3r-56h-8c"])
def test_chunked_is_the_unchunked_maths(n_ranks, heads, dim, batch, chunks):
    model, inputs = _wan(heads, dim, batch)
    with torch.no_grad():
        ref = model(*inputs)
    plain, st_plain = _run(model, WAN, WAN_SPEC, n_ranks, inputs)
    out, st = _run(model, WAN, WAN_SPEC, n_ranks, inputs, chunks=chunks)
    # per head the same maths on the same rows; but CPU SDPA blocks a small call by its head count
    # (13 tokens, 2 heads at once vs 1 and 1: a few ulp apart), so equal or within the split bound:
    # measured 2.7e-7 for 2r-4h, 0 for the others (the unchunked split itself: up to 4.8e-7)
    assert_split_close(out, plain, what=f"chunked vs unchunked {n_ranks} ranks {heads} heads")
    assert_split_close(out, ref, what=f"pipelined {n_ranks} ranks {heads} heads")
    assert st.bytes_exchanged == st_plain.bytes_exchanged  # the same bytes, in chunks
    per_group = [len(r) for _, r in st.groups]
    c = head_chunks(share_ranges(heads, per_group[0]), chunks) if per_group[0] > 1 else 0
    # all-to-all calls per rank and block: one per chunk for q/k/v, one per chunk back
    assert st.exchanges == [2 * c * 4] * n_ranks and st_plain.exchanges == [2 * 4 * (c > 0)] * n_ranks


@pytest.mark.parametrize("text_first", [False, True], ids=["text-tail", "text-head"])
def test_chunked_keeps_the_text_tokens_and_heads_first_layouts(text_first):
    """HunyuanVideo-like: q/k/v heads-first (``skip_reshape``), replicated text tokens after or
    before the image tokens, a mask over the whole sequence."""
    torch.manual_seed(0)
    model = SeqToyMMDiT(text_first=text_first, heads=4).eval()
    inputs = (torch.randn(1, 11, 8), torch.rand(1), torch.randn(1, 5, 64))
    specs = tuple(dataclasses.replace(s, text_first=text_first) for s in MM_SPEC)
    with torch.no_grad():
        ref = model(*inputs)
    plain, _ = _run(model, MM, specs, 2, inputs)
    out, st = _run(model, MM, specs, 2, inputs, chunks=2)
    assert torch.equal(out, plain) and st.fallbacks == 0
    assert_split_close(out, ref, what="pipelined mmdit")


def _recorded(chunks=3, n_ranks=2):
    rec = RecordingOps()
    model, inputs = _wan(6, 48)
    out, _ = _run(model, WAN, WAN_SPEC, n_ranks, inputs, chunks=chunks, rec=rec)
    return rec, out


def test_exchanges_overlap_attention_and_race_nothing():
    rec, out = _recorded()
    model, inputs = _wan(6, 48)
    plain, _ = _run(model, WAN, WAN_SPEC, 2, inputs)
    assert_split_close(out, plain, what="recorded chunked vs unchunked")
    assert rec.violations() == []
    log, before = rec.log, rec._before

    def per_block(kind, actor, label):
        """(log index, op) per block: the ops of ``kind`` on ``actor`` whose label starts so."""
        found = [(i, o) for i, o in enumerate(log) if o.kind == kind and o.actor.startswith(actor)
                 and o.label.startswith(label)]
        assert len(found) % 4 == 0 and found, (kind, actor, label)
        k = len(found) // 4
        return [found[b * k:(b + 1) * k] for b in range(4)]

    def side_by_side(a, b):
        return not before(a, b) and not before(b, a)

    for r, place in enumerate(GPUS[:2]):
        other = GPUS[1 - r]
        att = [per_block("kernel", f"{place}/current", f"attention {c}") for c in range(3)]
        att_other = [per_block("kernel", f"{other}/current", f"attention {c}") for c in range(3)]
        for c in range(2):
            qkv_next = per_block("copy", f"{place}/side", f"q/k/v {c + 1} from")
            out_c = per_block("copy", f"{place}/side", f"out {c} from")
            for blk in range(4):
                (i_att, a), = att[c][blk]
                for i, x in qkv_next[blk]:
                    assert i < i_att, f"{place} block {blk}: q/k/v {c + 1} queued after attention {c}"
                    assert side_by_side(a, x), f"{place} block {blk}: q/k/v {c + 1} serialized with attention {c}"
                (_, a_next), = att[c + 1][blk]
                (_, a_next_other), = att_other[c + 1][blk]
                (_, a_other), = att_other[c][blk]
                for _, o in out_c[blk]:  # reads the other rank's output of chunk c
                    assert before(a_other, o), f"{place}: output {c} copied before it was made"
                    assert side_by_side(a_next, o) and side_by_side(a_next_other, o), \
                        f"{place} block {blk}: output {c} not sent beside attention {c + 1}"


@pytest.mark.parametrize("wait", EXCHANGE_WAITS)
def test_removing_one_exchange_wait_makes_the_race_check_fail(wait):
    with without_wait(wait):
        rec, _ = _recorded()
    assert rec.violations(), f"no race found with {wait!r} removed"
    assert wait not in seq_stream._disabled


def test_cpu_ranks_keep_the_unpipelined_exchange():
    ex = ThreadExchange(["cpu", "cpu"], pool=None)
    assert ex.pipeline_chunks() == 1  # CPU ranks, fake devices
    assert ThreadExchange(["cpu", "cpu"], None, RecordingOps(), ["cuda:0", "cuda:1"]).pipeline_chunks() == 4
    model, inputs = _wan(4, 32)
    _, st = _run(model, WAN, WAN_SPEC, 2, inputs)
    assert st.exchanges == [2 * 4, 2 * 4]


@pytest.mark.parametrize("tail", [0, 3], ids=["no-text", "text-tail"])
@pytest.mark.parametrize("heads_first,out_heads_first", [(False, False), (True, False), (True, True)],
                         ids=["flat", "heads-in", "heads-in-out"])
def test_every_layout_chunks_like_the_unchunked_exchange(heads_first, out_heads_first, tail):
    """``ulysses_attention`` itself on 3 rank threads, 7 heads (3, 2, 2) in 2 chunks: q/k/v flat
    ``[B, L, H*D]`` or heads-first (``skip_reshape``), the output flat or heads-first
    (``skip_output_reshape``), with or without replicated text rows after the image rows."""
    from harness.toy_seq import _attention_impl
    from sharddit.parallel.sequence.split import plan_groups, rank_slices
    from sharddit.parallel.sequence.threads import RankThreads
    from sharddit.parallel.sequence.ulysses import ulysses_attention

    torch.manual_seed(0)
    b, main, heads, d, n = 1, 10, 7, 4, 3
    q, k, v = (torch.randn(b, heads, main + tail, d) for _ in range(3))  # heads-first; flat views below
    kwargs = {"skip_reshape": heads_first, "skip_output_reshape": out_heads_first}
    ref = _attention_impl(q, k, v, heads, skip_reshape=True, skip_output_reshape=out_heads_first)
    slices = rank_slices(plan_groups(1, n), main)

    def inputs(rs):
        out = []
        for x in (q, k, v):
            mine = torch.cat([x[:, :, rs.tokens[0]:rs.tokens[1]], x[:, :, main:]], dim=2)
            out.append(mine if heads_first else mine.transpose(1, 2).reshape(b, -1, heads * d))
        return out

    def run(chunks):
        pool = RankThreads(["cpu"] * n, timeout_s=30)
        try:
            ex = ThreadExchange(["cpu"] * n, pool, chunks=chunks)
            tasks = [pool.submit(r, lambda rs=rs: ulysses_attention(ex, rs, main, _attention_impl,
                                                                    (*inputs(rs), heads), dict(kwargs)))
                     for r, rs in enumerate(slices)]
            return [pool.wait(t, r) for r, t in enumerate(tasks)], ex.calls
        finally:
            pool.close()

    plain, plain_calls = run(1)
    chunked, calls = run(2)
    assert calls == [4] * n and plain_calls == [2] * n
    otok = 2 if out_heads_first else 1
    for rs, a, p in zip(slices, chunked, plain, strict=True):
        want = torch.cat([ref.narrow(otok, rs.tokens[0], rs.tokens[1] - rs.tokens[0]),
                          ref.narrow(otok, main, tail)], dim=otok)
        assert a.shape == p.shape == want.shape
        assert_split_close(a, p, what="chunked layout")
        assert_split_close(a, want, what="chunked layout vs unsharded")
