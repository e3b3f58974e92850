"""Issue 23's lobby experiments as regression tests: a stranger who reaches the host's store on
127.0.0.1 (its own client, no secret) tries each attack, and the lobby fails safely.

Every wait is bounded: reads are counted (a stranger's counters cannot make the host loop or
wait), stores time out in seconds. Workers here are ``dist_worker.Worker`` objects in this process
(their real registration and invitation code, without serving); one test runs a spawned worker
through a real session after all the attacks.
"""
import datetime
import logging
import subprocess
import sys
from collections import Counter

import pytest
import torch
import torch.distributed as dist
from conftest import REPO
from harness import dist_procs
from harness.numerics import assert_split_close
from sharddit.parallel.distributed.host import IDLE_CLOSE_S, IDLE_TIMEOUT_S
from sharddit.parallel.distributed.lobby import Lobby
from sharddit.parallel.distributed.lobby import read_workers
from sharddit.parallel.distributed.worker import Worker, WorkerRefused, check_lobby
from sharddit.parallel.distributed import entries
STRANGER_KEY = b"a-guess-at-the-secret-" + b"0" * 26


@pytest.fixture
def lobby():
    lob = Lobby("127.0.0.1", dist_procs.free_port(), 5.0)
    try:
        yield lob
    finally:
        lob.close()


def _client(lobby):
    return dist.TCPStore("127.0.0.1", lobby.port, None, False, datetime.timedelta(seconds=5), use_libuv=False)


def _put(store, key, value):
    """A stranger's write, done when this returns: ``set`` has no reply, so one round trip on the
    same connection (the server answers in order) before the host reads."""
    store.set(key, value)
    store.check([key])


def _worker(lobby, name="w1", key=None, said=None):
    return Worker(_client(lobby), name, "cpu", {"free": 2**30}, say=(said if said is not None else []).append,
                  key=key)


class Counted:
    """The real store, each call counted; ``get``/``wait``/``add`` refused (they block on a
    missing key, or fail on a stranger's non-number)."""

    def __init__(self, store):
        self.store, self.calls = store, Counter()

    def __getattr__(self, name):
        assert name not in ("get", "wait", "add", "multi_get"), f"the lobby called store.{name}"
        fn = getattr(self.store, name)

        def call(*args):
            self.calls[name] += 1
            return fn(*args)

        return call


def test_idle_and_control_timeouts_are_minutes():
    from sharddit.parallel.distributed.config import TIMEOUT_RANGE_S

    assert 60 <= IDLE_CLOSE_S < IDLE_TIMEOUT_S <= 3600 and TIMEOUT_RANGE_S[1] <= 3600


def test_a_forged_offer_is_ignored_and_logged_once(lobby, caplog):
    stranger = _client(lobby)
    forged = [
        entries.make_entry(STRANGER_KEY, "offer", lobby.id, "n1", entries.make_offer("evil", "cpu", 2**40)),
        entries.make_entry(lobby.key, "offer", "an-earlier-lobby", "n2", entries.make_offer("old", "cpu", 1)),
        entries.make_entry(lobby.key, "offer", lobby.id, "n3",
                           entries.make_offer("w1", "cpu", 1)).replace(b'"free": 1', b'"free": 9'),
    ]
    for i, raw in enumerate(forged):
        _put(stranger, entries.slot_key(i), raw)
    with caplog.at_level(logging.WARNING, logger="sharddit"):
        for _ in range(3):
            assert lobby.workers() == {}
    lines = [r.getMessage() for r in caplog.records if "was ignored, not enrolled" in r.getMessage()]
    assert len(lines) == 3, lines  # one line per forged entry, however often the lobby is read
    assert sum("signature does not verify" in line for line in lines) == 2 and "another lobby" in "".join(lines)
    assert "none joined yet" in lobby.describe()


def test_poisoned_counters_leave_the_lobby_working_and_bounded(lobby):
    """``set("sessions", b"abc")`` and ``set("workers", b"x")`` broke the old host's next ``add``
    (and its store connection); a counter raised by 200,000 made a read take seconds. The host
    now reads ``MAX_MEMBERS`` slots, one non-blocking call each, and counts sessions itself."""
    stranger = _client(lobby)
    stranger.add("workers", 200_000)
    stranger.add("sessions", 200_000)
    w1 = _worker(lobby)
    _put(stranger, "sessions", b"abc")
    _put(stranger, "workers", b"x")
    counted = Counted(_client(lobby))
    assert list(read_workers(counted, lobby.key, lobby.id)) == ["w1/cpu"]
    assert counted.calls == Counter(compare_set=entries.MAX_MEMBERS), counted.calls
    assert list(lobby.workers()) == ["w1/cpu"] and lobby.next_session()[0] == 1
    w1.leave_lobby()
    assert lobby.workers() == {}


def test_a_registration_without_an_offer_is_not_waited_on(lobby):
    stranger = _client(lobby)
    _put(stranger, entries.slot_key(0), b"w9/cpu")  # the old format: a name whose offer never comes
    _put(stranger, entries.slot_key(1), b"")
    _put(stranger, entries.slot_key(2), b"{")
    counted = Counted(_client(lobby))
    assert read_workers(counted, lobby.key, lobby.id) == {}
    assert counted.calls == Counter(compare_set=entries.MAX_MEMBERS), counted.calls
    stranger.delete_key(entries.LOBBY_KEY)  # the reader that takes the lobby id from the store is refused
    with pytest.raises(ValueError, match="missing"):
        read_workers(Counted(_client(lobby)), lobby.key)
    assert lobby.workers() == {}  # the host writes its entry again: workers can check it and join
    assert _worker(lobby).lobby == lobby.id and list(lobby.workers()) == ["w1/cpu"]


def test_a_bogus_name_with_huge_free_memory_is_refused_and_injects_no_device(lobby, monkeypatch):
    """Even signed with the host's own secret: ``evil/cpu,cuda:7`` with ``free=2**62`` once made
    ``devices=auto`` resolve to ``cpu,evil/cpu,cuda:7`` (a local cuda:7 injected by the comma)."""
    from sharddit.loaders.comfy import distributed

    stranger = _client(lobby)
    evil = {**entries.make_offer("evil", "cpu", 1), "member": "evil/cpu,cuda:7", "device": "cpu,cuda:7",
            "free": 2**62}
    rich = entries.make_offer("rich", "cpu", 1) | {"free": 2**62}
    for i, body in enumerate((evil, rich)):
        _put(stranger, entries.slot_key(i), entries.make_entry(lobby.key, "offer", lobby.id, f"n{i}", body))
    monkeypatch.setattr(distributed, "_LOBBY", [lobby])
    assert distributed.resolve_auto_devices("auto", "sequence", lambda: "cpu") == "auto"
    _worker(lobby)
    assert distributed.resolve_auto_devices("auto", "sequence", lambda: "cpu") == "cpu,w1/cpu"
    assert "GiB free" in lobby.describe() and "4294967296" not in lobby.describe()


def test_a_later_registration_cannot_replace_a_real_member(lobby):
    said = []
    w1 = _worker(lobby, said=said)
    stranger = _client(lobby)
    fake = entries.make_entry(STRANGER_KEY, "offer", lobby.id, "n9", entries.make_offer("w1", "cpu", 2**45))
    free_slot = 1 if w1.reg == 0 else 0
    _put(stranger, entries.slot_key(free_slot), fake)  # a second registration of the name
    assert lobby.workers()["w1/cpu"]["nonce"] == w1.nonce
    _put(stranger, entries.slot_key(w1.reg), fake)  # the real one overwritten: gone until the worker re-registers
    assert "w1/cpu" not in lobby.workers()
    w1.check_slot()  # what the waiting worker does every second
    assert lobby.workers()["w1/cpu"]["nonce"] == w1.nonce and any("registering again" in m for m in said), said
    w2 = _worker(lobby, "w2")  # another member never takes w1's slot
    assert w2.reg != w1.reg and sorted(lobby.workers()) == ["w1/cpu", "w2/cpu"]


def test_a_forged_or_replayed_invite_is_ignored(lobby):
    said = []
    w1 = _worker(lobby, said=said)
    stranger = _client(lobby)
    body = {"member": "w1/cpu", "rank": 1, "world": 2, "groups": [[0, 1]], "backend": "gloo", "timeout_s": 5.0}
    forged = entries.make_entry(STRANGER_KEY, "invite", f"{lobby.id}.1", w1.nonce, body)
    _put(stranger, entries.invite_key("w1/cpu"), forged)
    assert w1.take_invite() is None and w1.take_invite() is None
    assert [m for m in said if "ignored an invitation" in m] == [(
        "[ShardDiT] worker 'w1/cpu': ignored an invitation: its signature does not verify: it was made with another "
        "secret, or altered")], said
    _, sid = lobby.next_session()
    lobby.invite("w1/cpu", lobby.workers()["w1/cpu"], sid, {k: v for k, v in body.items() if k != "member"})
    invite = w1.take_invite()
    assert invite["id"] == sid and invite["rank"] == 1 and invite["world"] == 2
    assert w1.take_invite() is None  # taken: the same invitation again is stale
    again = _worker(lobby, said=said)  # the worker restarts (a new registration, a new nonce)
    assert again.reg == w1.reg and again.take_invite() is None
    assert any("answers an earlier registration" in m for m in said), said


def test_a_worker_with_the_wrong_secret_is_told_so_and_registers_nothing(lobby):
    with pytest.raises(WorkerRefused, match=r"worker 'w1/cpu' refused by .*SHARDDIT_DIST_SECRET is not the host's"):
        _worker(lobby, key=STRANGER_KEY)
    assert all(entries.read_key(lobby.store, entries.slot_key(i)) is None for i in range(entries.MAX_MEMBERS))
    stranger = _client(lobby)  # a host of another protocol is named with both numbers
    _put(stranger, entries.LOBBY_KEY, entries.make_entry(lobby.key, "lobby", lobby.id, lobby.id, {"protocol": 1}))
    with pytest.raises(WorkerRefused, match=f"protocol 1, this side {entries.PROTOCOL}"):
        check_lobby(_client(lobby), lobby.key, "w1/cpu")


def _worker_cli(port, secret):
    env = {k: v for k, v in __import__("os").environ.items() if k != "SHARDDIT_DIST_SECRET"}
    env.update({"SHARDDIT_DIST_SECRET": secret} if secret else {})
    return subprocess.run([sys.executable, str(REPO), "worker", "--join", f"127.0.0.1:{port}", "--name", "w1",
                           "--devices", "cpu", "--wait", "10"], capture_output=True, text=True, timeout=120,
                          check=False, env=env)


def test_the_worker_command_without_or_with_a_wrong_secret_is_told_so(lobby):
    done = _worker_cli(lobby.port, "")
    assert done.returncode == 2 and "needs the host's shared secret, and none is set" in done.stderr, done
    assert "worker --new-secret" in done.stderr, done.stderr
    done = _worker_cli(lobby.port, "f" * 64)  # before ComfyUI's import: this test needs none
    assert done.returncode == 2 and "SHARDDIT_DIST_SECRET is not the host's" in done.stderr, done
    assert lobby.workers() == {}


def test_the_host_without_a_secret_refuses_and_says_how(monkeypatch, caplog):
    from sharddit.loaders.comfy import distributed

    monkeypatch.delenv("SHARDDIT_DIST_SECRET")
    port = dist_procs.free_port()
    with pytest.raises(ValueError, match=r"needs a shared secret, and none is set: make one with `python "
                                         r"<pack-dir> worker --new-secret`"):
        Lobby("127.0.0.1", port, 5.0)
    monkeypatch.setattr(distributed, "_LOBBY", [])
    monkeypatch.setenv("SHARDDIT_DIST_ADDR", f"127.0.0.1:{port}")
    with caplog.at_level(logging.ERROR, logger="sharddit"):
        distributed.start_lobby_if_configured()  # the server starts; local use keeps working
    assert distributed._LOBBY == [] and distributed.describe_workers() == ""
    assert any("worker --new-secret" in r.getMessage() and "this machine's devices work" in r.getMessage()
               for r in caplog.records), caplog.records
    assert distributed.resolve_auto_devices("auto", "sequence", lambda: "cpu") == "auto"


def test_the_host_reconnects_its_store_client(lobby, caplog):
    _worker(lobby)
    lobby.store.set("poison", b"abc")
    with pytest.raises(Exception):  # noqa: B017 - torch's own error: the server closes this connection
        lobby.store.add("poison", 1)
    with caplog.at_level(logging.WARNING, logger="sharddit"):
        assert list(lobby.workers()) == ["w1/cpu"]
    assert any("reconnecting" in r.getMessage() for r in caplog.records)


def test_a_real_session_works_after_every_attack():
    """A spawned worker joins a lobby strangers have poisoned (counters, a forged invite to it, a
    forged offer of its name, a bogus member): the host's forward over it matches the unsharded model."""
    from sharddit.parallel.distributed.ranks import attach_remote_ranks
    from harness.seq_models import engine_for as _engine, run_sequence as _run, toy_copies as _copies, toy_inputs as _inputs

    with dist_procs.lobby_with_workers(8.0, ("w1",)) as lob:
        stranger = _client(lob)
        stranger.add("workers", 200_000)
        _put(stranger, "sessions", b"abc")
        body = {"member": "w1/cpu", "rank": 1, "world": 3, "groups": [[0, 1, 2]], "backend": "gloo", "timeout_s": 5}
        _put(stranger, entries.invite_key("w1/cpu"), entries.make_entry(STRANGER_KEY, "invite", f"{lob.id}.1", "x",
                                                                      body))
        _put(stranger, entries.slot_key(entries.MAX_MEMBERS - 1), entries.make_entry(
            STRANGER_KEY, "offer", lob.id, "n", entries.make_offer("w1", "cpu", 2**45)))
        model, ref_model = _copies(2)
        handle, engine = _engine(model, ["cpu", "cpu"])
        attach_remote_ranks(engine, lob, {1: "w1/cpu"}, {"w1/cpu": "cpu"})
        try:
            x = _inputs(1)
            with torch.no_grad():
                ref = ref_model(*x)
            assert_split_close(_run(handle, model, *x), ref, what="after the attacks")
            assert lob.session.sid == 1 and lob.session.id == f"{lob.id}.1"
            lob.session.used -= IDLE_CLOSE_S + 1  # idle for minutes: the host opens a fresh session
            assert_split_close(_run(handle, model, *x), ref, what="after an idle session")
            assert lob.session.sid == 2
        finally:
            engine.close()


def test_a_stranger_cannot_flood_the_log(lobby, caplog, monkeypatch):
    """Forged entries under ever new names are logged once each, up to ``MAX_LOGGED`` in all."""
    from sharddit.parallel.distributed import lobby as dist_lobby
    monkeypatch.setattr(dist_lobby, "_LOGGED", set())
    stranger = _client(lobby)
    with caplog.at_level(logging.WARNING, logger="sharddit"):
        for round_ in range(2):
            for i in range(entries.MAX_MEMBERS):
                _put(stranger, entries.slot_key(i), entries.make_entry(
                    STRANGER_KEY, "offer", lobby.id, "n", entries.make_offer(f"e{round_}x{i}", "cpu", 1)))
            assert lobby.workers() == {}
    lines = [r.getMessage() for r in caplog.records if "registration" in r.getMessage()]
    assert len(lines) == dist_lobby.MAX_LOGGED + 1 and "further ones are ignored" in lines[-1], len(lines)


def test_plan_workers_with_a_wrong_secret_is_told_so(lobby, monkeypatch):
    """``plan --workers`` reads the offers with this machine's secret: another one is named as such."""
    from sharddit.loaders.cli.plan_lobby import read_lobby

    _worker(lobby)
    assert list(read_lobby(f"127.0.0.1:{lobby.port}").offers) == ["w1/cpu"]
    monkeypatch.setenv("SHARDDIT_DIST_SECRET", "z" * 40)
    with pytest.raises(ValueError, match="signature does not verify.*give this machine the host's SHARDDIT_DIST_SECRET"):
        read_lobby(f"127.0.0.1:{lobby.port}")
    monkeypatch.delenv("SHARDDIT_DIST_SECRET")
    with pytest.raises(ValueError, match="needs a shared secret, and none is set"):
        read_lobby(f"127.0.0.1:{lobby.port}")
