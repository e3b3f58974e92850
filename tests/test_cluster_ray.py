"""Several machines on Ray (preview, issue 32), on a real local Ray cluster with token auth on:
a head (``ray start --head``) and a second node started by the real ``python <pack-dir> worker
--ray --join ... --name box2 --devices cpu``; the test process is the host's Ray driver.

- the second node is listed as the member ``box2/cpu``;
- its rank actor joins a gloo group (and a subgroup) with the host driver through a one-session
  store that is closed once they are formed, and a tensor ``all_to_all`` round-trips bit-exact on each;
- a member that never joins is named within the timeout (the store's and gloo's waits bounded);
- a client with a wrong token can neither connect nor add a node;
- a killed node is reported, naming the member, within the timeout.
One module-scoped cluster (Ray starts slowly on two cores); the tests run in file order and the
last one kills the second node.
"""
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from datetime import timedelta

import pytest
import torch
from harness import dist_procs
from harness.ray_cluster import listening, start_group, stop_group, wait_for
from harness.server import REPO

pytestmark = [pytest.mark.cluster, pytest.mark.no_blas]

TIMEOUT_S = 20.0  # SHARDDIT_DIST_TIMEOUT of these tests
HEALTH = {"RAY_health_check_period_ms": "500", "RAY_health_check_failure_threshold": "4",
          "RAY_health_check_initial_delay_ms": "0"}  # a killed node is noticed in ~2 s, not Ray's default ~15 s


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("ray")
    token = secrets.token_hex(32)
    saved = dict(os.environ)
    os.environ.update({"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": token, "RAY_USAGE_STATS_ENABLED": "0",
                       "HOME": str(tmp), **HEALTH})  # HOME: no ~/.ray/auth_token of the user's is read or written
    os.environ.pop("SHARDDIT_CLUSTER_INSECURE", None)
    port = dist_procs.free_port()
    procs = []
    import ray

    from sharddit.parallel.cluster import driver

    try:
        head = [sys.executable, "-m", "ray.scripts.scripts", "start", "--head", "--port", str(port), "--num-cpus", "1",
                "--num-gpus", "0", "--include-dashboard=false", "--object-store-memory", str(80 << 20),
                "--temp-dir", str(tmp / "t"), "--disable-usage-stats", "--block"]
        procs.append(start_group(head, dict(os.environ), open(tmp / "head.log", "w")))
        wait_for("the Ray head's port", lambda: listening('127.0.0.1', port), 60)
        worker = [sys.executable, str(REPO), "worker", "--ray", "--join", f"127.0.0.1:{port}", "--name", "box2",
                  "--devices", "cpu"]
        # CUDA_VISIBLE_DEVICES: what the worker command's GPUs are numbered by, which its actors must see unchanged
        # its ranks also build the tests' toy blocks (SHARDDIT_WORKER_IMPORTS: the harness registers them)
        procs.append(start_group(worker, {**os.environ, "PYTHONUNBUFFERED": "1", "CUDA_VISIBLE_DEVICES": "7",
                                          "PYTHONPATH": str(REPO / "tests"),
                                          "SHARDDIT_WORKER_IMPORTS": "harness.dist_toys"},
                                 open(tmp / "box2.log", "w")))
        ray_mod = driver.connect(f"127.0.0.1:{port}", TIMEOUT_S)
        wait_for("member box2/cpu", lambda: "box2/cpu" in driver.list_members(ray_mod), 90)
        yield {"ray": ray_mod, "port": port, "token": token, "tmp": tmp, "worker": procs[1]}
    finally:
        if ray.is_initialized():
            ray.shutdown()
        for proc in reversed(procs):
            stop_group(proc)
        os.environ.clear()
        os.environ.update(saved)


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
    assert list(members) == ["box2/cpu"], members  # the head carries no sharddit label: not a member
    node = next(n for n in cluster["ray"].nodes() if n["NodeID"] == members["box2/cpu"].node_id)
    assert node["Alive"] and node["Labels"]["sharddit/name"] == "box2", node


def test_a_rank_on_the_second_node_round_trips_an_all_to_all_bit_exact(cluster):
    import torch.distributed as dist

    from sharddit.parallel.cluster.driver import list_members, start_rank
    from sharddit.parallel.cluster.group import form_group

    ray = cluster["ray"]
    member = list_members(ray)["box2/cpu"]
    actor = start_rank(ray, member, TIMEOUT_S)
    where = ray.get(actor.where.remote(), timeout=TIMEOUT_S)
    assert where["node_id"] == member.node_id and where["pid"] != os.getpid() and where["device"] == "cpu", where
    assert where["cuda_visible_devices"] == "7", where  # Ray did not renumber the node's GPUs
    group = form_group(ray, {"box2/cpu": actor}, ray.util.get_node_ip_address(), TIMEOUT_S, subgroups=[(0, 1)])
    try:
        assert group.ranks == {"box2/cpu": 1} and dist.get_world_size() == 2 and list(group.subgroups) == [(0, 1)]
        assert not listening(group.store_host, group.store_port), "the rendezvous store is still open"
        gen = torch.Generator().manual_seed(32)
        for sub in (None, (0, 1)):  # the session's group, then a subgroup made before the store closed
            _round_trip(ray, actor, group, sub, gen)
    finally:
        group.close()
    assert not dist.is_initialized()


def _round_trip(ray, actor, group, sub, gen):
    """The host and the actor all_to_all two random tensors (NaN, inf, -0.0 included) over the
    session's group (``sub`` None) or its subgroup ``sub``; each gets the other's rows bit-exact."""
    import torch.distributed as dist

    mine, theirs = (torch.randn(6, 5, generator=gen, dtype=torch.float32) for _ in range(2))
    mine[0, :3] = torch.tensor([float("nan"), float("inf"), -0.0])  # bytes, not values, must survive
    reply = actor.all_to_all.remote(theirs, sub)
    out = torch.empty_like(mine)
    dist.all_to_all_single(out, mine, group=group.subgroups[sub] if sub else None)
    got_theirs = ray.get(reply, timeout=TIMEOUT_S)
    bits = lambda t: t.view(torch.int32)  # noqa: E731
    assert torch.equal(bits(out), bits(torch.cat([mine[:3], theirs[:3]]))), sub
    assert torch.equal(bits(got_theirs), bits(torch.cat([mine[3:], theirs[3:]]))), sub


def test_a_stranger_at_the_rendezvous_store_neither_stalls_nor_redirects_the_group(cluster, monkeypatch):
    """Whoever finds the one-session store's port (here: told it) holds 100 idle connections and one
    that sent a single byte, and writes the keys gloo would use without the random prefix; the
    group still forms within the timeout and its exchange is bit-exact."""
    import torch.distributed as dist

    from sharddit.parallel.cluster import group as group_mod
    from sharddit.parallel.cluster.driver import list_members, start_rank

    ray, held = cluster["ray"], []
    real_open = group_mod.open_store

    def open_with_stranger(host, timeout_s):
        server, prefix = real_open(host, timeout_s)
        assert host == "127.0.0.1" or not listening("127.0.0.1", server.port), "the store listens on every interface"
        for i in range(101):
            held.append(socket.create_connection((host, server.port), timeout=5))
            if i == 0:
                held[0].sendall(b"\x01")  # the start of a request, never finished
        junk = dist.TCPStore(host, server.port, None, False, timedelta(seconds=5), use_libuv=True)
        for key in ["0//cpu//0/0", "0//cpu//0/1", "/0//cpu//0/0", "/0//cpu//0/1"]:  # gloo's rank addresses (torch
            junk.set(key, "[" * 3000)                                          # 2.13) with no or an empty prefix
        held.append(junk)
        return server, prefix

    monkeypatch.setattr(group_mod, "open_store", open_with_stranger)
    actor = start_rank(ray, list_members(ray)["box2/cpu"], TIMEOUT_S)
    t0 = time.monotonic()
    group = group_mod.form_group(ray, {"box2/cpu": actor}, ray.util.get_node_ip_address(), TIMEOUT_S)
    try:
        assert time.monotonic() - t0 < TIMEOUT_S and len(held) == 102
        _round_trip(ray, actor, group, None, torch.Generator().manual_seed(11))
    finally:
        group.close()
        for sock in held[:-1]:
            sock.close()
        ray.kill(actor)


def test_the_host_keeps_a_members_rank_across_sessions_and_names_an_unknown_member(cluster):
    from sharddit.parallel.cluster.host import ClusterHost
    from sharddit.parallel.cluster.settings import ClusterError

    ray, host = cluster["ray"], ClusterHost(f"127.0.0.1:{cluster['port']}", TIMEOUT_S)
    with pytest.raises(ClusterError, match=r"no member 'box3/cpu' in the Ray cluster at 127\.0\.0\.1:\d+ \(members: "
                                           r"box2/cpu\); start `python <pack-dir> worker --ray"):
        host.open_session(["box3/cpu"])
    gen, pids = torch.Generator().manual_seed(7), []
    for _ in range(2):
        group = host.open_session(["box2/cpu"])
        try:
            pids.append(ray.get(host.ranks["box2/cpu"].where.remote(), timeout=TIMEOUT_S)["pid"])
            _round_trip(ray, host.ranks["box2/cpu"], group, None, gen)
        finally:
            group.close()
    assert pids[0] == pids[1], pids  # one rank actor for both sessions: what it received stays


def test_a_member_that_never_joins_is_named_within_the_timeout(cluster):
    import torch.distributed as dist

    from sharddit.parallel.cluster.driver import list_members, start_rank
    from sharddit.parallel.cluster.group import form_group
    from sharddit.parallel.cluster.settings import ClusterError

    ray = cluster["ray"]
    actor = start_rank(ray, list_members(ray)["box2/cpu"], TIMEOUT_S)
    ray.kill(actor)  # its join never runs: the host's store wait (and gloo's) must end on the timeout
    t0 = time.monotonic()
    with pytest.raises(ClusterError, match=r"did not form \(member box2/cpu: (ActorDiedError|RayActorError)"):
        form_group(ray, {"box2/cpu": actor}, ray.util.get_node_ip_address(), 4.0)
    assert time.monotonic() - t0 < 4.0 + 6.0
    assert not dist.is_initialized()


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

    assert list(list_members(cluster["ray"])) == ["box2/cpu"]


def test_a_rank_on_the_second_node_samples_as_a_local_rank_does(cluster):
    """``cpu,box2/cpu`` with the host as the Ray driver: the member's rank runs its blocks with
    commands over Ray calls and weights and exchanges over the session's gloo groups; the forward
    equals the all-local ``cpu,cpu`` run bit for bit (the same split) and the unsharded one within
    the split bound; its own blocks cross once, again only when one changes; the session stays
    open across forwards, and a second model's blocks go to the same member."""
    from harness import dist_toys  # noqa: F401  (the toy blocks' describers)
    from harness.numerics import assert_same_shapes_equal, assert_split_close
    from harness.seq_models import engine_for, run_sequence, toy_copies, toy_inputs

    from sharddit.parallel.cluster.host import ClusterHost
    from sharddit.parallel.distributed.ranks import attach_remote_ranks
    from sharddit.parallel.distributed.weights import WeightLayout

    host = ClusterHost(f"127.0.0.1:{cluster['port']}", TIMEOUT_S)
    assert host.check_names(["box2/cpu"])["box2/cpu"]["device"] == "cpu"
    threads = torch.get_num_threads()  # bit-identical needs the same CPU threads (Ray sets OMP_NUM_THREADS)
    torch.set_num_threads(cluster["ray"].get(host.rank("box2/cpu").where.remote(), timeout=TIMEOUT_S)["threads"])
    model, local_model, ref_model = toy_copies(3)
    handle, engine = engine_for(model, ["cpu", "cpu"])
    ranks = attach_remote_ranks(engine, host, {1: "box2/cpu"}, {"box2/cpu": "cpu"})
    lhandle, lengine = engine_for(local_model, ["cpu", "cpu"])
    block = WeightLayout(ref_model.blocks[0]).nbytes
    try:
        for batch in (1, 2, 1):  # cfg = 1: tokens split, Ulysses across the nodes; cfg > 1: batch split
            x = toy_inputs(batch)
            with torch.no_grad():
                ref = ref_model(*x)
            out = run_sequence(handle, model, *x)
            assert_same_shapes_equal(out, run_sequence(lhandle, local_model, *x), what=f"Ray rank, batch {batch}")
            assert_split_close(out, ref, what=f"cpu,box2/cpu batch {batch}")
            assert engine.stats.blocks_run == [4, 4]
        session = host.session
        assert ranks.weight_bytes["box2/cpu"] == 2 * block  # only the host's two streamed: its own stayed
        with torch.no_grad():
            for b in (handle.proxies["blocks"][3].real_block, ref_model.blocks[3]):
                b.o.weight.add_(0.01)  # a LoRA-like change of one of its blocks
            ref = ref_model(*toy_inputs(2))
        assert_split_close(run_sequence(handle, model, *toy_inputs(2)), ref, what="block 3 changed")
        assert ranks.weight_bytes["box2/cpu"] == 3 * block and host.session is session
        assert ranks.held_bytes(1)["blocks"] == [2, 3]
    finally:
        engine.close()
        lengine.close()
        host.close_session()
        torch.set_num_threads(threads)


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
        host.open_session(["box2/cpu"])
    assert time.monotonic() - t0 < TIMEOUT_S + 6 and "box2/cpu" not in host.ranks
    wait_for("box2 leaving the member list", lambda: "box2/cpu" not in list_members(ray), TIMEOUT_S)
