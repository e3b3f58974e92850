"""Issue 30, fix 5, on Ray members: every process posts its collectives in one common order.

NCCL promises progress only when the processes post the collectives of their communicators (the
weight broadcasts on ``all`` / ``workers``, each batch group's attention all-to-alls) in orders that
fit one global order (``parallel/distributed/order.py``). Gloo does not need it, so the forward
itself passes either way: every post of the host and of each member's rank actor is recorded
(``harness.dist_order``; the actors write theirs to ``<pid>.jsonl``) and the orders are checked.
Two slow host threads are forced: the host's first weight broadcast is held back (its exchanges of
that block must still come after it), and the host's first exchange in the second batch group
(the next block's broadcast must still wait for it)."""
import time

import pytest
import torch
from harness import dist_order, dist_toys  # noqa: F401  (dist_toys: the toy blocks' describers)
from harness.numerics import assert_split_close
from harness.seq_models import engine_for, run_sequence, toy_copies, toy_inputs
from sharddit.parallel.distributed.exchange import DistExchange
from sharddit.parallel.distributed.ranks import DistRanks, attach_remote_ranks

pytestmark = pytest.mark.cluster
TIMEOUT_S = 10.0


def test_every_process_posts_its_collectives_in_one_common_order(ray_members, monkeypatch):
    """cpu,w1/cpu,cpu,w2/cpu at batch 2: two batch groups, each the host and one member; blocks owned
    by the host (sent on ``all``) and by each member (sent on ``workers``)."""
    from sharddit.parallel.cluster.host import ClusterHost

    host = ClusterHost(ray_members.address, TIMEOUT_S)
    pids = {n: ray_members.ray.get(host.rank(f"{n}/cpu").where.remote(), timeout=TIMEOUT_S)["pid"]
            for n in ("w1", "w2")}
    model, ref_model = toy_copies(2)
    handle, engine = engine_for(model, ["cpu"] * 4)
    attach_remote_ranks(engine, host, {1: "w1/cpu", 3: "w2/cpu"}, {"w1/cpu": "cpu", "w2/cpu": "cpu"})
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
    recorded = dist_order.record_collectives()
    try:
        x = toy_inputs(2)
        with torch.no_grad():
            ref = ref_model(*x)
        assert_split_close(run_sequence(handle, model, *x), ref, what="cpu,w1/cpu,cpu,w2/cpu batch 2")
        assert engine.stats.groups == [((0, 1), (0, 1)), ((1, 2), (2, 3))], engine.stats.groups
    finally:
        recorded.restore()
        engine.close()
        host.close_session()
        for actor in host.ranks.values():
            ray_members.ray.kill(actor)
    logs = {"host": list(recorded),
            **{n: dist_order.read_log(ray_members.record_dir / f"{pid}.jsonl") for n, pid in pids.items()}}
    ops = {n: [(e["op"], tuple(e["ranks"])) for e in log] for n, log in logs.items()}
    # what each process posts: blocks 0 and 2 from the host, 1 and 3 from their member owners, and
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
