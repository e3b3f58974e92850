"""`sequence` mode on toy DiTs (pure torch, CI): every rank computes every block on its share.

Tier 1 (CPU ranks): the split forward matches the unsharded forward — batch groups, uneven token
ranges, more ranks than heads, per-token modulation, a replicated text tail. Every split here gives
some GEMM fewer rows than in the reference (a rank's tokens, one sample of two), so CPU BLAS may sum
in another order: equal or within the split bound of tests/harness/numerics.py (its table gives
the figures measured across MKL kernel paths and torch versions).
"""
import dataclasses
import threading

import pytest
import torch
from harness.numerics import assert_split_close
from harness.seq_models import MM, MM_SPEC, WAN, WAN_SPEC
from harness.toy_seq import SeqToyDiT, SeqToyMMDiT

from sharddit.parallel.sequence.engine import attach_sequence_engine
from sharddit.parallel.sequence.split import even_ranges, plan_groups
from sharddit.parallel.sequence.local import LocalRanks
from sharddit.parallel.sequence.threads import RankThreadError
from sharddit.parallel.blocks.sharding import attach_block_sharding



def _shard(model, layout, specs, ranks, **collaborators):
    n = sum(len(getattr(model, p)) for p in layout.block_lists)
    block_devices = [ranks[min(len(ranks) - 1, g * len(ranks) // n)] for g in range(n)]
    handle = attach_block_sharding(model, layout, block_devices, "cpu")
    proxies = [p for pl in handle.proxies.values() for p in pl]
    engine = attach_sequence_engine(handle.router, proxies, specs, ranks, timeout_s=30, **collaborators)
    return handle, engine


def _run(handle, fn):
    with torch.no_grad(), handle.router.forward_scope(sequence=True):
        return fn()


def test_plan_groups_split_batch_first():
    assert [(g.batch, g.ranks) for g in plan_groups(2, 2)] == [((0, 1), (0,)), ((1, 2), (1,))]
    assert [(g.batch, g.ranks) for g in plan_groups(1, 3)] == [((0, 1), (0, 1, 2))]
    assert [(g.batch, g.ranks) for g in plan_groups(2, 4)] == [((0, 1), (0, 1)), ((1, 2), (2, 3))]
    assert [(g.batch, g.ranks) for g in plan_groups(2, 3)] == [((0, 2), (0, 1, 2))]  # 3 does not split in 2
    assert even_ranges(7, 3) == [(0, 3), (3, 5), (5, 7)] and even_ranges(2, 3) == [(0, 1), (1, 2), (2, 2)]


@pytest.mark.parametrize("ranks", [["cpu", "cpu"], ["cpu", "cpu", "cpu"]])
@pytest.mark.parametrize("batch,tokens,heads,per_token_e", [
    (1, 13, 4, False),   # cfg = 1: tokens split, 13 not divisible
    (2, 12, 4, False),   # cond + uncond: batch groups first
    (1, 10, 2, True),    # 3 ranks > 2 heads: one rank relays only; per-token modulation
])
def test_wan_like_matches_unsharded(ranks, batch, tokens, heads, per_token_e):
    torch.manual_seed(0)
    model = SeqToyDiT(dim=32, heads=heads, per_token_e=per_token_e).eval()
    x, t, ctx = torch.randn(batch, tokens, 8), torch.rand(batch), torch.randn(batch, 5, 32)
    with torch.no_grad():
        ref = model(x, t, ctx)
    handle, engine = _shard(model, WAN, WAN_SPEC, ranks)
    out = _run(handle, lambda: model(x, t, ctx))
    assert_split_close(out, ref, what=f"wan-like {len(ranks)} ranks batch {batch} tokens {tokens}")
    st = engine.stats
    assert st.blocks_run == [4] * len(ranks) and st.fallbacks == 0
    group_sizes = [len(r) for _, r in st.groups]
    # one all-to-all pair per block for each rank that shares a group; none for a rank alone
    for _, group_ranks in st.groups:
        for r in group_ranks:
            assert st.exchanges[r] == (2 * 4 if len(group_ranks) > 1 else 0)
    assert sum(group_sizes) == len(ranks)
    assert st.scatters == 1 and st.gathers == 1
    engine.close()
    handle.detach()


def test_exchange_bytes_match_the_analytic_figure():
    torch.manual_seed(0)
    model = SeqToyDiT(dim=32, heads=4).eval()
    b, tokens, dim = 1, 12, 32
    x, t, ctx = torch.randn(b, tokens, 8), torch.rand(b), torch.randn(b, 5, dim)
    handle, engine = _shard(model, WAN, WAN_SPEC, ["cpu", "cpu"])
    _run(handle, lambda: model(x, t, ctx))
    # per block and rank: q, k, v in (its 6 rows of the other's 2 heads x 3) + output back (same size)
    per_block = 4 * b * (tokens // 2) * (dim // 2) * 4
    assert engine.stats.bytes_exchanged == [4 * per_block, 4 * per_block]
    engine.close()


@pytest.mark.parametrize("text_first", [False, True], ids=["text-tail", "text-head"])
@pytest.mark.parametrize("ranks,batch", [(["cpu", "cpu"], 1), (["cpu", "cpu", "cpu"], 1), (["cpu", "cpu"], 2)])
def test_mmdit_text_tokens_match_unsharded(ranks, batch, text_first):
    """Text after the image tokens (HunyuanVideo in ComfyUI < 0.14) or before them (>= 0.14). With a
    batch split the double blocks' modulation ``Linear(vec)`` runs on 1 row instead of 2 (CPU BLAS's
    matrix-vector path); with a token split each rank's Linears run on its rows only: either may sum
    in another order (tests/harness/numerics.py)."""
    torch.manual_seed(0)
    model = SeqToyMMDiT(text_first=text_first).eval()
    x, t, ctx = torch.randn(batch, 11, 8), torch.rand(batch), torch.randn(batch, 5, 64)
    mask = torch.tensor([0.0, 0.0, 0.0, -1e4, -1e4])
    with torch.no_grad():
        ref = model(x, t, ctx, txt_mask=mask)
    specs = tuple(dataclasses.replace(s, text_first=text_first) for s in MM_SPEC)
    handle, engine = _shard(model, MM, specs, ranks)
    out = _run(handle, lambda: model(x, t, ctx, txt_mask=mask))
    assert_split_close(out, ref, what=f"mmdit {len(ranks)} ranks batch {batch}")
    assert engine.stats.fallbacks == 0 and engine.stats.gathers == 3  # img + txt after doubles, x after singles
    engine.close()


def test_worker_fault_raises_with_device_and_leaves_no_thread():
    torch.manual_seed(0)
    model = SeqToyDiT(dim=32, heads=4).eval()
    x, t, ctx = torch.randn(1, 12, 8), torch.rand(1), torch.randn(1, 5, 32)
    with torch.no_grad():
        ref = model(x, t, ctx)
    handle, engine = _shard(model, WAN, WAN_SPEC, ["cpu", "cpu"])
    real = handle.proxies["blocks"][2].real_block
    calls = {"n": 0}
    original = real.forward

    def faulty(*a, **k):
        if threading.current_thread().name.startswith("sharddit-seq-1"):
            calls["n"] += 1
            raise RuntimeError("injected fault")
        return original(*a, **k)

    real.forward = faulty
    with pytest.raises(RankThreadError, match=r"worker 1 on cpu failed during block 2: RuntimeError: injected fault"):
        _run(handle, lambda: model(x, t, ctx))
    assert engine.pool is None and calls["n"] == 1
    assert not [t for t in threading.enumerate() if t.name.startswith("sharddit-seq")]  # workers joined
    del real.forward
    out = _run(handle, lambda: model(x, t, ctx))
    assert_split_close(out, ref, what="after a worker fault")
    engine.close()


def test_unsupported_argument_runs_whole_in_blocks_mode():
    torch.manual_seed(0)
    model = SeqToyMMDiT().eval()
    x, t, ctx = torch.randn(1, 11, 8), torch.rand(1), torch.randn(1, 5, 64)
    with torch.no_grad():
        ref = model(x, t, ctx)
    handle, engine = _shard(model, MM, MM_SPEC, ["cpu", "cpu"])
    for blk in handle.proxies["double_blocks"]:
        fwd = blk.real_block.forward
        blk.real_block.forward = lambda *a, _f=fwd, **k: _f(*a, **{**k, "modulation_dims_img": None})
    orig = model.double_blocks[0].forward
    model.double_blocks[0].forward = lambda *a, **k: orig(*a, **{**k, "modulation_dims_img": [(0, None, 0)]})
    out = _run(handle, lambda: model(x, t, ctx))
    assert_split_close(out, ref, what="one block whole, the others split")  # the other 3 blocks still split tokens
    assert engine.stats.fallbacks == 1
    engine.close()


@pytest.mark.parametrize("text_first", [False, True], ids=["text-tail", "text-head"])
def test_mmdit_with_the_wrong_token_order_differs(text_first):
    """The order matters (why it is read off the model): a spec with the other order gives a
    different result at cfg 1, so the tests above would catch a mix-up."""
    torch.manual_seed(0)
    model = SeqToyMMDiT(text_first=text_first).eval()
    x, t, ctx = torch.randn(1, 11, 8), torch.rand(1), torch.randn(1, 5, 64)
    with torch.no_grad():
        ref = model(x, t, ctx)
    wrong = tuple(dataclasses.replace(s, text_first=not text_first) for s in MM_SPEC)
    handle, engine = _shard(model, MM, wrong, ["cpu", "cpu"])
    out = _run(handle, lambda: model(x, t, ctx))
    assert (out - ref).abs().max() > 1e-3
    engine.close()
    handle.detach()


def test_a_finished_forward_keeps_no_rank_rows_alive_between_steps():
    """Between steps (and during VAE decode) the rank threads stay up; nothing of the last forward
    may stay alive with them: its block tasks' closures hold every rank's output rows (issue 30:
    the last task lived until the next step, in a cycle only a GC pass would free). Checked with
    the GC off, so a reference cycle counts as alive."""
    import gc
    import time
    import weakref

    torch.manual_seed(0)
    model = SeqToyDiT(dim=32, heads=4).eval()
    x, t, ctx = torch.randn(1, 12, 8), torch.rand(1), torch.randn(1, 5, 32)
    seen, built = [], []  # the forward, weakly, as the main thread sees it before each block
    handle, engine = _shard(model, WAN, WAN_SPEC, ["cpu", "cpu"], should_stop=lambda: built[0]._fwd is not None
                            and seen.append(weakref.ref(built[0]._fwd)))
    built.append(engine)
    gc.collect()
    gc.disable()
    try:
        _run(handle, lambda: model(x, t, ctx))
        assert engine.pool is not None and engine.pool.alive_threads() == 2  # kept for the next step
        assert seen, "no forward seen: this test would prove nothing"
        deadline = time.monotonic() + 2.0  # a worker drops its task just after marking it done
        while seen[-1]() is not None and time.monotonic() < deadline:
            time.sleep(0.01)
        assert seen[-1]() is None, "the last forward (every rank's rows) is alive between steps"
    finally:
        gc.enable()
        engine.close()
        handle.detach()


def test_a_rank_thread_drops_a_finished_tasks_result():
    """A task's result (a worker rank's rows fetched home: ``distributed.ranks``) is the caller's
    alone once it has it: the idle rank thread keeps no reference to it until its next task."""
    import time
    import weakref

    from sharddit.parallel.sequence.threads import RankThreads

    pool = RankThreads(["cpu"], timeout_s=10)
    try:
        task = pool.submit(0, lambda: torch.ones(8), "rows")
        ref = weakref.ref(pool.wait(task, 0))
        del task
        deadline = time.monotonic() + 2.0
        while ref() is not None and time.monotonic() < deadline:
            time.sleep(0.01)
        assert ref() is None, "the idle rank thread still holds its last task's result"
    finally:
        pool.close()



def test_a_rank_threads_pack_error_reads_with_one_prefix():
    """A pack error raised on a rank thread is re-raised on the caller's as ``RankThreadError``,
    which names the worker and wraps the error's reason: ``[ShardDiT]`` once, at the start."""
    from sharddit.parallel.errors import InputError
    from sharddit.parallel.sequence.threads import RankThreads

    def fail():
        raise InputError("block 2 wants 12 rows, got 10")

    pool = RankThreads(["cpu"], timeout_s=10)
    try:
        with pytest.raises(RankThreadError) as got:
            pool.wait(pool.submit(0, fail, "block 2"), 0)
    finally:
        pool.close()
    assert str(got.value) == ("[ShardDiT] sequence worker 0 on cpu failed during block 2: "
                              "InputError: block 2 wants 12 rows, got 10")

@pytest.mark.parametrize("ranks", [2, 3, 4])
def test_row_table_cut_gives_each_rank_its_rows(ranks):
    """MiniMax H3's ``mod_segments`` (``TokenSpec.row_tables``): ``(start, stop, row)`` ranges of one
    packed sequence, ``row`` an index or one per token. Cut per rank and renumbered from the rank's
    first row, every token keeps the modulation row it had (token by token), and nothing else."""
    from sharddit.parallel.sequence.split import cut_row_table, rank_slices

    main = 23
    per_token = torch.arange(100, 110)
    table = [(0, 5, 1), (5, 9, 4), (9, 19, per_token), (19, 23, 2)]
    want = [r for a, b, row in table for r in (row.tolist() if isinstance(row, torch.Tensor) else [row] * (b - a))]
    got = []
    for rs in rank_slices(plan_groups(1, ranks), main):
        cut = cut_row_table(table, rs, main, 0, "mod_segments")
        t0, t1 = rs.tokens
        assert cut[0][0] == 0 and cut[-1][1] == t1 - t0  # renumbered from the rank's first row, contiguous
        assert all(b0 == a1 for (_, b0, _), (a1, _, _) in zip(cut, cut[1:]))
        got += [r for a, b, row in cut for r in (row.tolist() if isinstance(row, torch.Tensor) else [row] * (b - a))]
    assert got == want
    with pytest.raises(ValueError, match="outside 23 tokens"):
        cut_row_table([(0, 30, 1)], rank_slices(plan_groups(1, 2), main)[0], main, 0, "mod_segments")


@pytest.mark.parametrize("speeds,batch,want", [
    ((3, 1), 1, [(0, 12), (12, 16)]),  # a 3x faster rank: 3/4 of the tokens (and of the 4 heads: 3 and 1)
    ((1, 1, 2), 1, [(0, 4), (4, 8), (8, 16)]),
    ((3, 1), 2, [(0, 16), (0, 16)]),  # cond + uncond, one rank each: shares do not apply
])
def test_speed_weighted_shares_keep_the_maths(speeds, batch, want):
    """``SequenceEngine.set_speeds``: token (and head) shares proportional to each rank's speed; each
    rank still gets one contiguous range, so the result stays within the split bound."""
    torch.manual_seed(0)
    model = SeqToyDiT(dim=32, heads=4).eval()
    x, t, ctx = torch.randn(batch, 16, 8), torch.rand(batch), torch.randn(batch, 5, 32)
    with torch.no_grad():
        ref = model(x, t, ctx)
    handle, engine = _shard(model, WAN, WAN_SPEC, ["cpu"] * len(speeds))
    engine.set_speeds(speeds)
    out = _run(handle, lambda: model(x, t, ctx))
    assert_split_close(out, ref, what=f"speeds {speeds} batch {batch}")
    assert engine.stats.tokens == want and engine.stats.fallbacks == 0
    with pytest.raises(ValueError, match="one per rank"):
        engine.set_speeds((1,) * (len(speeds) + 1))
    engine.close()
    handle.detach()


def test_the_runner_arrives_through_the_engine_only():
    """The engine's collaborators come through its constructor or its own methods: the runner is
    read-only from outside, a runner factory gets the engine, and ``use_runner`` refuses a change
    inside a forward (a forward half on one runner and half on another)."""
    torch.manual_seed(0)
    model = SeqToyDiT(dim=32, heads=4).eval()
    x, t, ctx = torch.randn(1, 12, 8), torch.rand(1), torch.randn(1, 5, 32)
    given = []

    def factory(engine):
        given.append(engine)
        return LocalRanks(engine.devices)

    handle, engine = _shard(model, WAN, WAN_SPEC, ["cpu", "cpu"], runner=factory)
    try:
        assert given == [engine] and isinstance(engine.runner, LocalRanks)
        with pytest.raises(AttributeError):
            engine.runner = LocalRanks(engine.devices)
        with pytest.raises(AttributeError):
            handle.router.engine = None
        refused, first = [], engine.runner

        def swap_inside():
            with pytest.raises(RuntimeError, match="inside a forward"):
                engine.use_runner(LocalRanks(engine.devices))
            refused.append(1)

        engine.set_split_check(lambda: swap_inside() if not refused else None)
        _run(handle, lambda: model(x, t, ctx))
        assert refused and engine.runner is first, "a runner change inside a forward was not refused"
        other = LocalRanks(engine.devices)
        assert engine.use_runner(other, timeout_s=99) is other and engine.runner is other
        assert engine.timeout_s == 99
    finally:
        engine.close()
        handle.detach()


class _Stopped(Exception):
    """Stands for ComfyUI's ``InterruptProcessingException`` (the user pressed Cancel)."""


def test_should_stop_stops_every_rank_at_its_next_block_and_its_exception_passes_through():
    """``should_stop`` (a constructor argument) runs before each block on the rank threads too: raised
    there after the first block, the forward ends early, and the exception type listed in
    ``interrupt_exceptions`` reaches the caller as it is, not wrapped as a rank thread error."""
    import threading

    torch.manual_seed(0)
    model = SeqToyDiT(dim=32, heads=4).eval()
    x, t, ctx = torch.randn(1, 12, 8), torch.rand(1), torch.randn(1, 5, 32)
    calls = []

    def should_stop():
        if threading.current_thread().name.startswith("sharddit-seq"):
            calls.append(1)
            if len(calls) > 2:  # each of the two ranks ran its first block
                raise _Stopped("interrupted")

    handle, engine = _shard(model, WAN, WAN_SPEC, ["cpu", "cpu"], should_stop=should_stop,
                            interrupt_exceptions=(_Stopped,))
    try:
        with pytest.raises(_Stopped):
            _run(handle, lambda: model(x, t, ctx))
        assert 0 < sum(engine.stats.blocks_run) < 4 * 2, engine.stats
    finally:
        engine.close()
        handle.detach()
