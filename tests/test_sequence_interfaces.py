"""The declared contracts of `sequence` mode (``parallel.sequence.interfaces``) and their
implementations: both exchanges are ``Exchange``s, both rank runners ``RankRunner``s, with the
protocol's method signatures, and the engine asks no rank or exchange what it is. CPU only."""
import inspect

import pytest
from sharddit.parallel.distributed.exchange import DistExchange
from sharddit.parallel.distributed.ranks import DistRanks
from sharddit.parallel.sequence import engine as engine_module
from sharddit.parallel.sequence.interfaces import Exchange, RankRunner
from sharddit.parallel.sequence.local import LocalRanks
from sharddit.parallel.sequence.split import Group
from sharddit.parallel.sequence.threads import RankThreads, ThreadExchange


def _methods(proto) -> list[str]:
    return [n for n, v in vars(proto).items() if inspect.isfunction(v) and not n.startswith("_")]


def _same_signatures(proto, cls) -> None:
    for name in _methods(proto):
        want = list(inspect.signature(getattr(proto, name)).parameters)
        got = list(inspect.signature(getattr(cls, name)).parameters)
        assert got == want, f"{cls.__name__}.{name}{got} differs from {proto.__name__}.{name}{want}"


@pytest.fixture
def threads():
    pool = RankThreads(["cpu", "cpu"], timeout_s=5)
    yield pool
    pool.close()


def test_both_exchanges_satisfy_the_exchange_protocol(threads):
    local = ThreadExchange(["cpu", "cpu"], threads)
    # the host's side of a group of two: position 0 here, position 1 in worker process 1 (no
    # process group is needed to build it; one is needed only to exchange)
    remote = DistExchange(None, [0, 1], {0: "cpu"}, ["the host", "worker w1"], 5.0)
    for ex in (local, remote):
        assert isinstance(ex, Exchange), type(ex).__name__
        assert ex.bytes_received == ex.bytes_sent == ex.calls == [0, 0]
    _same_signatures(Exchange, ThreadExchange)
    _same_signatures(Exchange, DistExchange)
    assert not isinstance(object(), Exchange)


def test_thread_exchange_counts_by_the_contract(threads):
    import torch
    ex = ThreadExchange(["cpu", "cpu"], threads)
    parts = {p: [torch.full((3,), float(p * 2 + j)) for j in range(2)] for p in range(2)}
    tasks = [threads.submit(p, lambda p=p: ex.all_to_all(p, parts[p])) for p in range(2)]
    got = [threads.wait(t, p) for p, t in enumerate(tasks)]
    assert [g[1].tolist() for g in got] == [[2.0] * 3, [3.0] * 3]  # position 1's parts for 0, for 1
    assert ex.calls == [1, 1] and ex.bytes_received == [12, 12] and ex.bytes_sent == [0, 0]


def test_both_rank_runners_satisfy_the_rank_runner_protocol():
    assert issubclass(LocalRanks, RankRunner) and issubclass(DistRanks, RankRunner)
    _same_signatures(RankRunner, LocalRanks)
    _same_signatures(RankRunner, DistRanks)
    local = LocalRanks(["cpu", "cpu"])
    assert isinstance(local, RankRunner)
    assert isinstance(local.exchange(Group(0, (0, 1), (0, 1)), None), Exchange)


def test_the_engine_does_not_ask_what_runs_its_ranks():
    source = inspect.getsource(engine_module)
    for probe in ("hasattr(", "dist is None", "self.dist", "is_remote", "isinstance(ex"):
        assert probe not in source, f"sequence/engine.py still probes with {probe!r}"


def test_the_cluster_host_offers_what_the_remote_ranks_use():
    """``DistRanks`` takes its sessions from a source it does not import (``ClusterHost``): every
    attribute it uses of the source and of a session exists on the real classes."""
    import re

    from sharddit.parallel.cluster.host import ClusterHost
    from sharddit.parallel.cluster.group import RaySession
    from sharddit.parallel.distributed import ranks

    text = inspect.getsource(ranks)
    used = set(re.findall(r"self\.source\.(\w+)", text)) | set(re.findall(r"\bsource\.(\w+)", text))
    assert used == {"session_for", "close_session", "session", "timeout_s"}, used
    for name in used - {"session", "timeout_s"}:
        assert callable(getattr(ClusterHost, name)), name
    init = inspect.getsource(ClusterHost.__init__)
    assert "self.session" in init and "self.timeout_s" in init
    session_used = set(re.findall(r"\bs(?:elf\.session)?\.(\w+)\(", text)) - {"pop", "append", "get", "wait_host"}
    for name in {"send", "receive", "request", "broadcast", "wait", "label", "forget"}:
        assert name in session_used and callable(getattr(RaySession, name)), name
