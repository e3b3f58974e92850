"""Several machines on Ray (issue 32), on a real local Ray cluster with token auth on (the shared
``ray_members``: a head and nodes started by the real ``python <pack-dir> worker --join ... --name
NAME --devices cpu``, here one more, ``box2``); the test process is the host's Ray driver.

- box2 is listed as the member ``box2/cpu``;
- its rank actor joins a session's groups with the host driver through the host's rendezvous
  actor, and answers commands over Ray; the same actor serves the next session; forming a group
  opens no listening socket of ours (gloo's own only), its keys live in the actor and go with the
  session;
- a member that never joins is named within the timeout (the rendezvous' and gloo's waits bounded);
- a client with a wrong token can neither connect nor add a node;
- a killed node is reported, naming the member, within the timeout.
Ray starts slowly on two cores: one cluster for every cluster test; the tests here run in file
order and the last one kills box2.
"""
import os
import secrets
import signal
import subprocess
import sys
import time

import pytest
from harness import dist_procs
from harness.ray_cluster import wait_for
from harness.server import REPO

pytestmark = [pytest.mark.cluster, pytest.mark.no_blas]

TIMEOUT_S = 20.0  # SHARDDIT_DIST_TIMEOUT of these tests
HEALTH = {"RAY_health_check_period_ms": "500", "RAY_health_check_failure_threshold": "4",
          "RAY_health_check_initial_delay_ms": "0"}  # a killed node is noticed in ~2 s, not Ray's default ~15 s


@pytest.fixture(scope="module")
def cluster(ray_members):
    """The shared local cluster (``ray_members``) with one more node, ``box2``, started by the real
    worker command with ``CUDA_VISIBLE_DEVICES=7`` (what its ``--devices`` are numbered by, which
    its actors must see unchanged); the last test kills it."""
    ray_members.add_node("box2", env={"CUDA_VISIBLE_DEVICES": "7"})
    yield {"ray": ray_members.ray, "port": ray_members.port, "token": ray_members.token,
           "worker": ray_members.procs["box2"]}


def test_worker_ray_says_it_is_waiting_then_gives_up_when_nothing_answers():
    port = dist_procs.free_port()
    env = {**os.environ, "RAY_AUTH_MODE": "token", "PYTHONUNBUFFERED": "1"}
    env.pop("PYTHONPATH", None)
    done = subprocess.run([sys.executable, str(REPO), "worker", "--ray", "--join", f"127.0.0.1:{port}", "--name",
                           "box2", "--devices", "cpu", "--wait", "4"], capture_output=True, text=True, env=env,
                          timeout=60)
    out = done.stdout + done.stderr
    assert done.returncode == 1 and "Traceback" not in out, out
    assert f"is `ray start --head --port {port}` running there?" in out, out
    assert "worker 'box2' gives up (--wait 4)" in out and "joining the Ray cluster" not in out, out


def test_a_host_that_cannot_reach_the_cluster_is_told_within_its_timeout():
    port = dist_procs.free_port()
    code = ("import sys, time; sys.path.insert(0, sys.argv[1]); from harness.pack import import_pack; import_pack()\n"
            "from sharddit.parallel.cluster.driver import connect\nt0 = time.monotonic()\n"
            "try:\n    connect(sys.argv[2], 3.0)\nexcept RuntimeError as e:\n"
            "    print(f'{time.monotonic() - t0:.1f}', e)")
    env = {**os.environ, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": secrets.token_hex(32)}
    env.pop("PYTHONPATH", None)
    done = subprocess.run([sys.executable, "-c", code, str(REPO / "tests"), f"127.0.0.1:{port}"], capture_output=True,
                          text=True, env=env, timeout=90)
    took, _, said = done.stdout.strip().partition(" ")
    assert said.startswith(f"[ShardDiT] nothing answered at 127.0.0.1:{port} within 3 s"), done.stdout + done.stderr
    assert f"is `ray start --head --port {port}` running there?" in said and float(took) < 3.0 + 3, done.stdout


def test_the_second_node_is_listed_as_its_member(cluster):
    from sharddit.parallel.cluster.driver import list_members

    members = list_members(cluster["ray"])
    assert set(members) == {"box2/cpu", "w1/cpu", "w2/cpu"}, members  # the head has no sharddit label: no member
    node = next(n for n in cluster["ray"].nodes() if n["NodeID"] == members["box2/cpu"].node_id)
    assert node["Alive"] and node["Labels"]["sharddit/name"] == "box2", node


def _open(host):
    """A sampling session of the host and box2/cpu (one exchange group of both)."""
    return host.session_for(("box2/cpu",), ((0, 1),), "gloo", {"box2/cpu": "cpu"})


def _check(session):
    """The member answers a command over Ray, from inside the session's groups."""
    _, answer = session.request("box2/cpu", {"op": "held"}, "a test")
    assert answer == {"op": "holding", "owned": 0, "ring": 0, "blocks": []}, answer


def test_a_rank_on_the_second_node_joins_a_session_through_the_rendezvous_actor(cluster):
    """(The data plane itself: bit-identical forwards over members, test_cluster_sequence.py.)"""
    import torch.distributed as dist
    from sharddit.parallel.cluster.driver import list_members
    from sharddit.parallel.cluster.host import ClusterHost

    ray, host = cluster["ray"], ClusterHost(f"127.0.0.1:{cluster['port']}", TIMEOUT_S)
    member = list_members(ray)["box2/cpu"]
    where = ray.get(host.rank("box2/cpu").where.remote(), timeout=TIMEOUT_S)
    assert where["node_id"] == member.node_id and where["pid"] != os.getpid() and where["device"] == "cpu", where
    assert where["cuda_visible_devices"] == "7", where  # Ray did not renumber the node's GPUs
    session = _open(host)
    try:
        assert session.group.ranks == {"box2/cpu": 1} and dist.get_world_size() == 2
        assert list(session.groups) == [(0, 1)] and list(session.weight_groups) == ["all"]
        _check(session)
    finally:
        host.close_session()
        ray.kill(host.ranks["box2/cpu"])
    assert not dist.is_initialized()


def _listening(pid) -> set[int]:
    """The TCP ports process ``pid`` listens on now."""
    import psutil

    return {c.laddr.port for c in psutil.Process(pid).net_connections("tcp") if c.status == psutil.CONN_LISTEN}


def test_forming_a_group_opens_no_listening_socket_but_gloos_and_its_keys_live_in_the_rendezvous_actor(
        cluster, monkeypatch):
    """While the host forms a session's group (sampled at each of its rendezvous reads), every port
    its process listens on that it did not before is gloo's own: its address is among the values the
    host published in the rendezvous actor (gloo's pair addresses carry the port). Those keys live
    in the actor only, in the session's space, and go when the session closes (a late write is
    refused)."""
    import struct

    import torch.distributed as dist
    from sharddit.parallel.cluster import group as rendezvous
    from sharddit.parallel.cluster.host import ClusterHost

    ray, host = cluster["ray"], ClusterHost(f"127.0.0.1:{cluster['port']}", TIMEOUT_S)
    before, seen, spaces = _listening(os.getpid()), set(), []
    real_get = rendezvous.RayStore.get

    def get_and_look(store, key):
        seen.update(_listening(os.getpid()))
        spaces.append(store.space)
        return real_get(store, key)

    monkeypatch.setattr(rendezvous.RayStore, "get", get_and_look)
    try:
        session = _open(host)
        try:
            board, space = session.group.board, session.group.space
            held = ray.get(board.items.remote(space), timeout=TIMEOUT_S)
            assert spaces and set(spaces) == {space} and len(held) >= 4, (spaces, sorted(held))  # gloo's keys
            opened = seen - before
            assert opened, "no listening port seen during formation: gloo's own listener should be"
            values = b"".join(held.values())
            strange = sorted(p for p in opened if struct.pack(">H", p) not in values)
            assert not strange, f"ports listening during formation that gloo did not publish: {strange}"
            _check(session)
        finally:
            host.close_session()
        gone = wait_for("the session's space dropped", lambda: space not in ray.get(board.open_spaces.remote(),
                                                                                       timeout=TIMEOUT_S), 10)
        assert gone
        late = rendezvous.RayStore(ray, board, space, 2.0)
        with pytest.raises(dist.DistStoreError, match=r"rendezvous on Ray failed in set .*is closed"):
            late.set("0//cpu//0/0", b"[" * 3000)
    finally:
        for actor in host.ranks.values():
            ray.kill(actor)


def test_the_host_keeps_a_members_rank_across_sessions_and_names_an_unknown_member(cluster):
    from sharddit.parallel.cluster.host import ClusterHost
    from sharddit.parallel.cluster.settings import ClusterError

    ray, host = cluster["ray"], ClusterHost(f"127.0.0.1:{cluster['port']}", TIMEOUT_S)
    with pytest.raises(ClusterError, match=r"no member 'box3/cpu' in the Ray cluster at 127\.0\.0\.1:\d+ \(members: "
                                           r"box2/cpu, w1/cpu, w2/cpu\); start `python <pack-dir> worker --ray"):
        host.session_for(("box3/cpu",), ((0, 1),), "gloo", {"box3/cpu": "cpu"})
    pids = []
    try:
        for _ in range(2):
            session = _open(host)
            pids.append(ray.get(host.ranks["box2/cpu"].where.remote(), timeout=TIMEOUT_S)["pid"])
            _check(session)
            host.close_session()
    finally:
        host.close_session()
        ray.kill(host.ranks["box2/cpu"])
    assert pids[0] == pids[1], pids  # one rank actor for both sessions: what it received stays


def test_a_member_that_never_joins_is_named_within_the_timeout(cluster):
    import torch.distributed as dist
    from sharddit.parallel.cluster.driver import list_members, start_board, start_rank
    from sharddit.parallel.cluster.group import form_group
    from sharddit.parallel.cluster.settings import ClusterError

    ray = cluster["ray"]
    board = start_board(ray, TIMEOUT_S)
    actor = start_rank(ray, list_members(ray)["box2/cpu"], TIMEOUT_S)
    ray.kill(actor)  # its join never runs: the host's rendezvous wait (and gloo's) must end on the timeout
    t0 = time.monotonic()
    with pytest.raises(ClusterError, match=r"did not form \(member box2/cpu: (ActorDiedError|RayActorError)"):
        form_group(ray, {"box2/cpu": actor}, board, 4.0, "gloo", [(0, 1)])
    assert time.monotonic() - t0 < 4.0 + 6.0
    assert not dist.is_initialized()
    wait_for("the failed session's keys dropped", lambda: ray.get(board.open_spaces.remote(), timeout=TIMEOUT_S) == [],
             10)
    ray.kill(board)


def test_a_client_with_a_wrong_token_can_neither_connect_nor_add_a_node(cluster):
    env = {**os.environ, "RAY_AUTH_TOKEN": secrets.token_hex(32), "RAY_gcs_server_port_wait_time_s": "2"}
    env.pop("PYTHONPATH", None)
    address = f"127.0.0.1:{cluster['port']}"
    code = ("import ray, sys\ntry:\n    ray.init(address=sys.argv[1], logging_level='ERROR')\n"
            "except ConnectionError as e:\n    print('REFUSED', e)\nelse:\n    print('CONNECTED')")
    done = subprocess.run([sys.executable, "-c", code, address], capture_output=True, text=True, env=env, timeout=60)
    assert "REFUSED Failed to connect to Ray cluster" in done.stdout, done.stdout + done.stderr
    assert "InvalidAuthToken" in done.stderr, done.stderr
    stranger = [sys.executable, "-m", "ray.scripts.scripts", "start", "--address", address, "--num-cpus", "1",
                "--labels", "sharddit/name=box9", "--resources", '{"sharddit/box9/cpu": 1}', "--disable-usage-stats"]
    joined = subprocess.run(stranger, capture_output=True, text=True, env=env, timeout=90)
    assert joined.returncode != 0 and "InvalidAuthToken" in joined.stdout + joined.stderr, joined.stdout + joined.stderr
    from sharddit.parallel.cluster.driver import list_members

    assert "box9/cpu" not in list_members(cluster["ray"])


def test_a_killed_node_is_reported_naming_the_member_within_the_timeout(cluster):
    from sharddit.parallel.cluster.driver import check_alive, list_members, start_rank
    from sharddit.parallel.cluster.settings import ClusterError

    ray = cluster["ray"]
    actor = start_rank(ray, list_members(ray)["box2/cpu"], TIMEOUT_S)
    check_alive(ray, {"box2/cpu": actor}, TIMEOUT_S)  # alive: no error
    os.killpg(cluster["worker"].pid, signal.SIGKILL)  # the worker command, its raylet and its actors
    t0 = time.monotonic()
    with pytest.raises(ClusterError, match=r"lost member box2/cpu \(") as info:
        while time.monotonic() - t0 < TIMEOUT_S:  # a call just after the kill may still find the actor
            check_alive(ray, {"box2/cpu": actor}, TIMEOUT_S)
            time.sleep(0.2)
    print(f"reported after {time.monotonic() - t0:.1f} s: {info.value}")
    assert time.monotonic() - t0 < TIMEOUT_S + 2
    from sharddit.parallel.cluster.host import ClusterHost

    host = ClusterHost(f"127.0.0.1:{cluster['port']}", TIMEOUT_S)
    host.ranks["box2/cpu"] = actor  # the host's next session with the lost member: named, then dropped
    t0 = time.monotonic()
    with pytest.raises(ClusterError, match=r"lost member box2/cpu \("):
        _open(host)
    assert time.monotonic() - t0 < TIMEOUT_S + 6 and "box2/cpu" not in host.ranks
    wait_for("box2 leaving the member list", lambda: "box2/cpu" not in list_members(ray), TIMEOUT_S)
