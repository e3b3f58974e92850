"""``DistExchange`` with several positions of a batch group in one process (pure torch, gloo on
127.0.0.1): the host's two GPUs plus worker processes in one group. Ulysses attention through it
gives the same bits as the in-process ``ThreadExchange`` and as unsharded attention; the byte
counters match the arithmetic; a killed peer fails every local thread with its name; an aborted
pool or a missing local thread stops the wait."""
import multiprocessing as mp
import threading
import time

import pytest
import torch
from harness import dist_multi, dist_procs
from sharddit.parallel.distributed.exchange import DistExchange, DistPeerError
from sharddit.parallel.sequence.split import even_ranges
from sharddit.parallel.sequence.threads import RankThreadError, RankThreads

HEAD_DIM = 8
F32 = 4


def _spawn(tmp_path, group_ranks, tokens, heads, timeout_s=30.0, fates=None):
    fates = fates or {}
    ctx = mp.get_context("spawn")
    port = dist_procs.free_port()
    world = len(set(group_ranks))
    paths = [tmp_path / f"rank{r}.pt" for r in range(world)]
    procs = [ctx.Process(target=dist_multi.multi_rank, args=(r, group_ranks, port, tokens, heads, HEAD_DIM,
                                                             str(paths[r]), timeout_s, fates.get(r)))
             for r in range(world)]
    for p in procs:
        p.start()
    try:
        for r, p in enumerate(procs):
            if r not in fates:
                p.join(120)
                assert p.exitcode == 0, f"rank {r} process exit code {p.exitcode}"
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
    return [torch.load(p) if r not in fates else None for r, p in enumerate(paths)]


def _analytic(group_ranks, tokens, heads):
    """Bytes per position: received from every other position, and sent out of its process. q/k/v
    go out as (rows of the sender) x (heads of the receiver); the output comes back as (rows of the
    receiver) x (heads of the sender)."""
    n = len(group_ranks)
    rows = [b - a for a, b in even_ranges(tokens, n)]
    hs = [b - a for a, b in even_ranges(heads, n)]

    def part(src, dst, call):  # bytes of what src sends dst in call 0 (q, k, v) or 1 (output)
        return (3 * rows[src] * hs[dst] if call == 0 else rows[dst] * hs[src]) * HEAD_DIM * F32

    received = [sum(part(j, p, c) for j in range(n) if j != p for c in (0, 1)) for p in range(n)]
    sent = [sum(part(p, j, c) for j in range(n) if group_ranks[j] != group_ranks[p] for c in (0, 1))
            for p in range(n)]
    return received, sent


@pytest.mark.parametrize("group_ranks,tokens,heads", [
    ([0, 0, 1], 23, 3),        # host with two devices + one worker
    ([0, 0, 1, 1], 22, 6),     # two processes with two positions each
    ([0, 0, 1, 2], 24, 3),     # cuda:0,cuda:1,box2/cuda:0,box3/cuda:0: one position relays (no head)
    ([1, 0, 1], 24, 4),        # positions of one process not adjacent, the host's in the middle
])
def test_ulysses_several_positions_per_process_bit_identical(tmp_path, group_ranks, tokens, heads):
    got = _spawn(tmp_path, group_ranks, tokens, heads)
    n = len(group_ranks)
    out = {p: g["out"][p] for g in got for p in g["out"]}
    assert sorted(out) == list(range(n)), [g["errors"] for g in got]
    threads, thread_bytes = dist_procs.ulysses_threads(n, tokens, heads, HEAD_DIM)
    q, k, v = dist_procs.attention_inputs(1, tokens, heads, HEAD_DIM)
    whole = torch.cat([out[p] for p in range(n)], dim=1)
    received, sent = _analytic(group_ranks, tokens, heads)
    for g in got:
        for p in g["out"]:
            assert torch.equal(out[p], threads[p])
            assert g["calls"][p] == 2
            assert g["bytes_received"][p] == thread_bytes[p] == received[p]
            assert g["bytes_sent"][p] == sent[p]
    assert torch.allclose(whole, dist_procs.sdpa(q, k, v, heads), atol=1e-6)  # per head the same maths


@pytest.mark.parametrize("fate", ["kill", "silent"])
def test_dead_or_silent_peer_fails_every_local_thread_naming_it(tmp_path, fate):
    timeout_s = 5.0
    group_ranks = [0, 0, 1]
    start = time.monotonic()
    got = _spawn(tmp_path, group_ranks, 24, 4, timeout_s=timeout_s, fates={1: fate})
    host = got[0]
    assert not host["out"]
    assert sorted(host["errors"]) == [0, 1]
    for p, (kind, msg) in host["errors"].items():
        assert kind == "DistPeerError", msg
        assert msg.startswith("[ShardDiT] attention exchange 0 with position 2 (rank 1) failed"), msg
        assert "position 0" not in msg and "position 1 " not in msg  # only the remote peer is named
        if fate == "kill":  # seen from the closed connection, before the timeout could fire
            assert host["elapsed"][p] < timeout_s, host["elapsed"]
        else:  # one timeout fires, not a second
            assert 0.9 * timeout_s <= host["elapsed"][p] < 2 * timeout_s, host["elapsed"]
    assert time.monotonic() - start < 60


def _local_only(timeout_s, pool=None):
    """An exchange whose local positions 0, 1 never reach a remote (the test stops them first)."""
    return DistExchange(None, [0, 0, 1], {0: "cpu", 1: "cpu"}, dist_multi.peer_labels([0, 0, 1]), timeout_s,
                        pool=pool)


def _parts():
    return [torch.zeros(2), torch.ones(2), torch.full((2,), 2.0)]


def _expect():
    return [[(torch.float32, (2,))]] * 3


def test_aborted_pool_stops_a_local_wait_at_once():
    timeout_s = 30.0  # the abort, not this timeout, must end the wait: bounds below are half of it
    pool = RankThreads(["cpu", "cpu"], timeout_s=timeout_s)
    ex = _local_only(timeout_s, pool)
    waiting = pool.submit(0, lambda: ex.all_to_all(0, _parts(), _expect()))
    time.sleep(0.2)

    def fail():
        raise ValueError("rank 1 broke")

    start = time.monotonic()
    failing = pool.submit(1, fail)
    with pytest.raises(RankThreadError, match="rank 1 broke"):
        pool.wait(failing, 1)
    assert waiting.done.wait(timeout_s / 2)
    assert time.monotonic() - start < timeout_s / 2
    assert waiting.error is None  # RanksAborted, which the pool swallows
    pool.close()


def test_missing_local_thread_times_out_then_fails_fast():
    timeout_s = 2.0
    ex = _local_only(timeout_s)
    start = time.monotonic()
    with pytest.raises(TimeoutError, match=r"^\[ShardDiT\] attention exchange 0: position 0 waited 2 s for "
                                           r"position\(s\) \[1\] of this process$"):
        ex.all_to_all(0, _parts(), _expect())
    assert 0.9 * timeout_s <= time.monotonic() - start < 2 * timeout_s  # one timeout, not two
    start = time.monotonic()
    with pytest.raises(DistPeerError, match=r"^\[ShardDiT\] attention exchange \d+ not started: an earlier one failed "
                                            r"\(attention exchange 0: position 0 waited"):  # the prefix once
        ex.all_to_all(1, _parts(), _expect())
    assert time.monotonic() - start < timeout_s / 2  # fails fast: no second wait


def test_local_positions_of_two_processes_refused():
    with pytest.raises(ValueError, match=r"local positions \[0, 2\] belong to processes \[0, 1\]"):
        DistExchange(None, [0, 0, 1], {0: "cpu", 2: "cpu"}, ["a", "b", "c"], 5.0)


def test_failed_transfer_reaches_every_local_thread():
    """The last local thread to arrive does the transfer; when it fails (here: no process group)
    both threads raise DistPeerError naming the remote peer."""
    ex = _local_only(5.0)
    errors = {}

    def call(p):
        try:
            ex.all_to_all(p, _parts(), _expect())
        except Exception as e:  # noqa: BLE001
            errors[p] = e

    threads = [threading.Thread(target=call, args=(p,)) for p in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert sorted(errors) == [0, 1]
    for e in errors.values():
        assert isinstance(e, DistPeerError)
        assert "with position 2 (rank 1) failed" in str(e)
