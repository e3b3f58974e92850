"""Issue 30, fix 5: every process posts its collectives in one common order (pure torch, gloo on 127.0.0.1).

NCCL promises progress only when the processes post the collectives of their communicators (the
weight broadcasts on ``all`` / ``workers``, each batch group's attention all-to-alls) in orders that
fit one global order (``parallel/distributed/order.py``). Gloo does not need it, so the forward
itself passes either way: the test records every post of every process (``harness.dist_order``)
and checks the orders. Two slow host threads are forced: the host's first weight broadcast is held
back (its exchanges of that block must still come after it), and the host's first exchange in the
second batch group (the next block's broadcast must still wait for it). Before the fix the host
posted in thread-timing order and both formed a cycle with the workers' orders."""
import time

import pytest
import torch
from harness import dist_order, dist_procs
from harness.numerics import assert_split_close
from sharddit.parallel.distributed.exchange import DistExchange
from sharddit.parallel.distributed.ranks import DistRanks, attach_remote_ranks

from harness.seq_models import engine_for as _engine, run_sequence as _run, toy_copies as _copies, toy_inputs as _inputs

TIMEOUT_S = 10.0


@pytest.fixture
def lobby():
    with dist_procs.lobby_with_workers(TIMEOUT_S) as lob:
        yield lob


def test_every_process_posts_its_collectives_in_one_common_order(lobby, tmp_path, monkeypatch):
    """cpu,w1/cpu,cpu,w2/cpu at batch 2: two batch groups, each the host and one worker; blocks owned
    by the host (sent on ``all``) and by each worker (sent on ``workers``)."""
    model, ref_model = _copies(2)
    paths = {name: tmp_path / f"{name}.jsonl" for name in ("w1", "w2")}
    for name, path in paths.items():
        proc = dist_order.start_recording_worker(lobby.port, name, TIMEOUT_S, path)
        lobby.procs.append(proc)
        dist_procs.wait_joined(lobby, f"{name}/cpu", proc)
    handle, engine = _engine(model, ["cpu"] * 4)
    attach_remote_ranks(engine, lobby, {1: "w1/cpu", 3: "w2/cpu"}, {"w1/cpu": "cpu", "w2/cpu": "cpu"})

    slow = {"weights": 1.0, "exchange": 2.0}  # seconds, each once

    def slow_weights(self, blocks, _orig=DistRanks._host_broadcasts):
        time.sleep(slow.pop("weights", 0.0))  # the designated proxy thread is slow to block 0's weights
        return _orig(self, blocks)

    def slow_exchange(self, pos, parts, expect=None, _orig=DistExchange.all_to_all):
        if self.procs == [0, 2]:  # the host's rank in the second batch group is slow to its first exchange
            time.sleep(slow.pop("exchange", 0.0))
        return _orig(self, pos, parts, expect)

    monkeypatch.setattr(DistRanks, "_host_broadcasts", slow_weights)
    monkeypatch.setattr(DistExchange, "all_to_all", slow_exchange)
    host = dist_order.record_collectives()
    try:
        x = _inputs(2)
        with torch.no_grad():
            ref = ref_model(*x)
        assert_split_close(_run(handle, model, *x), ref, what="cpu,w1/cpu,cpu,w2/cpu batch 2")
        assert engine.stats.groups == [((0, 1), (0, 1)), ((1, 2), (2, 3))], engine.stats.groups
    finally:
        host.restore()
        engine.close()
    logs = {"host": list(host), **{n: dist_order.read_log(p) for n, p in paths.items()}}
    ops = {n: [(e["op"], tuple(e["ranks"])) for e in log] for n, log in logs.items()}
    # what each process posts: blocks 0 and 2 from the host, 1 and 3 from their worker owners, and
    # two all-to-alls (q/k/v out, attention back) per block in each process's batch group
    assert sum(op == ("broadcast", (0, 1, 2)) for op in ops["host"]) == 2, ops["host"]
    assert sum(op[0] == "all_to_all_single" for op in ops["host"]) == 16, ops["host"]
    for name in ("w1", "w2"):
        assert sum(op == ("broadcast", (1, 2)) for op in ops[name]) == 2, ops[name]
        assert sum(op[0] == "all_to_all_single" for op in ops[name]) == 8, ops[name]
    assert dist_order.order_faults(logs) == [], "\n".join(f"{n}: {o}" for n, o in ops.items())


def test_the_order_check_finds_a_cycle_and_a_mismatch():
    """The checker itself: two processes posting two groups' collectives in opposite orders."""
    a = {"op": "broadcast", "group": "1", "ranks": [0, 1], "bytes": 8}
    b = {"op": "all_to_all_single", "group": "2", "ranks": [0, 1], "bytes": 4}
    assert dist_order.order_faults({"p0": [a, b], "p1": [a, b]}) == []
    assert "cycle" in dist_order.order_faults({"p0": [a, b], "p1": [b, a]})[0]
    assert "another member's" in dist_order.order_faults({"p0": [a], "p1": [dict(a, bytes=16)]})[0]
