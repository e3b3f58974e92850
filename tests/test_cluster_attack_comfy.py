"""A stranger at every port a ComfyUI host on Ray and its member open (issue 32's attack tests).

A ComfyUI 0.33 server hosts a Ray session with the member ``box2/cpu`` (``harness.dist_server``),
both started under the common open-files soft limit of 1024 (hard limit above it). With the
session open, the test finds every TCP port the ComfyUI process and the member's rank actor process
listen on and, for each, writes junk, nested JSON, crafted 8-byte gloo sequence numbers (gloo's
listener reads one from each connection to match it to a pair), slow bytes, and holds 1100
connections at once. Left out, and why: ComfyUI's own HTTP port (ComfyUI's, not ours to harden)
and Ray's ports (the core workers' gRPC servers, in Ray's worker port range 10002-19999, and the
node's: Ray's token authenticates every call, ``test_cluster_ray.py`` checks a wrong token is
refused). With the rendezvous on Ray (``parallel/cluster/rendezvous.py``), what is left are gloo's
own listeners, one per process group in each process.

Throughout, ComfyUI's ``/system_stats`` answers within 1 s; afterwards both processes are the same
ones (nothing crashed, the member was not evicted) and a prompt on the member (another seed: ComfyUI
would answer the same prompt from its cache) is equal to core (nothing redirected).

What gloo does with a stranger, found here: its listener keeps every connection open until its
process group ends, even after the stranger closed it (1100 held connections cost the process 1100
open files, for good). So the host and each rank raise their open-files soft limit
(``settings.raise_fd_limit``: at 1024 the held connections alone would exhaust them), and the host
forms the session again when a process of it gained ``host.STRAY_FILES`` open files since the
session formed, naming the fault in the log; the test checks the files are given back.
"""
import os
import re
import resource
import socket
import struct
import threading
import time

import pytest
from harness.dist_server import Worker, dist_server_scope
from harness.numerics import COMFY_SPLIT_BOUND, assert_split_close
from test_cluster_comfy import _graph_for, _StatsWatch
from test_distributed_server_comfy import _run

pytestmark = [pytest.mark.comfy, pytest.mark.cluster]
TIMEOUT_S = 20
HELD = 1100
SOFT_LIMIT = 1024
RAY_WORKER_PORTS = range(10002, 20000)  # Ray's default --min-worker-port .. --max-worker-port


@pytest.fixture(scope="module")
def attacked_server(tiny_models, tmp_path_factory):
    """A ComfyUI host and its member box2, both started with 1024 open files (soft)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 4 * HELD:
        pytest.skip(f"the hard open-files limit here is {hard}: too low to hold {HELD} connections")
    resource.setrlimit(resource.RLIMIT_NOFILE, (SOFT_LIMIT, hard))  # what ComfyUI and the nodes inherit
    try:
        with dist_server_scope(tiny_models, tmp_path_factory.mktemp("ra"), TIMEOUT_S, weights="share") as server:
            server.worker = Worker(server, "box2").wait_joined()
            server.workers.append(server.worker)
            resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))  # the stranger (this process) holds many
            yield server
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def _listening(proc) -> set[int]:
    import psutil

    return {c.laddr.port for c in proc.net_connections("tcp") if c.status == psutil.CONN_LISTEN}


def _rank_actor(server):
    """The member's rank actor process (a child of box2's raylet, titled ``ray::RankWorker``)."""
    import psutil

    node = psutil.Process(server.worker.proc.pid)
    found = [p for p in node.children(recursive=True) if "RankWorker" in " ".join(p.cmdline())]
    assert len(found) == 1, [p.cmdline() for p in node.children(recursive=True)]
    return found[0]


def _connect(port: int) -> socket.socket:
    return socket.create_connection(("127.0.0.1", port), timeout=3)


def _attack(port: int, said: list, fds) -> None:
    """Every attack on one port, in turn; ``said`` gets a line each; ``fds()`` the targets' open files."""
    for what, data in (("junk", os.urandom(4096)), ("nested JSON", b"[" * 3000 + b'{"a":' * 1000)):
        try:
            with _connect(port) as s:
                s.sendall(data)
                time.sleep(0.2)
        except OSError as err:  # the peer closed on us: fine
            said.append(f"{port} {what}: {err}")
    for seq in (0, 1, 2, 3, 5, 1 << 32, 1 << 63, (1 << 64) - 1):  # gloo's pair sequence numbers, and absurd ones
        try:
            with _connect(port) as s:
                s.sendall(struct.pack("<Q", seq) + os.urandom(64))
                time.sleep(0.1)
        except OSError as err:
            said.append(f"{port} seq {seq}: {err}")
    try:
        with _connect(port) as s:  # slow bytes
            for _ in range(15):
                s.sendall(b"\x01")
                time.sleep(0.1)
    except OSError as err:
        said.append(f"{port} slow: {err}")
    held = []
    try:
        for _ in range(HELD):
            try:
                held.append(_connect(port))
            except OSError as err:
                said.append(f"{port} held {len(held)}, then {err}")
                break
        time.sleep(2.0)
        said.append(f"{port}: held {len(held)}, the targets' open files {fds()}")
    finally:
        for s in held:
            s.close()


def test_a_stranger_at_every_port_of_the_host_and_member_changes_nothing(attacked_server, tiny_models):
    import psutil

    server, names = attacked_server, tiny_models.names
    _run(server, _graph_for(names, "ours", "cpu,box2/cpu", 5, (80, 80), 1.0, 1.0, "attack/before"))  # the session

    host, rank = psutil.Process(server.proc.pid), _rank_actor(server)
    for proc in (host, rank):
        assert proc.rlimit(psutil.RLIMIT_NOFILE)[0] > 4 * HELD, (proc.pid, proc.rlimit(psutil.RLIMIT_NOFILE))
    ports = {}
    for who, proc in (("host", host), ("member", rank)):
        for port in sorted(_listening(proc)):
            if port == server.port or port in RAY_WORKER_PORTS:
                continue
            ports[port] = who
    print("attacking", ports)
    assert "host" in ports.values() and "member" in ports.values(), ports  # gloo's own, at least
    sessions = len(re.findall(r"session \d+ open on Ray", server.log_text()))
    files = (host.num_fds(), rank.num_fds())
    watch, said = _StatsWatch(server.url), []
    watch.start()
    try:
        workers = [threading.Thread(target=_attack, args=(p, said, lambda: (host.num_fds(), rank.num_fds())))
                   for p in ports]
        for t in workers:  # one port at a time: 1100 held connections each
            t.start()
            t.join(120)
            assert not t.is_alive(), f"an attack hung: {said}"
    finally:
        watch.done.set()
        watch.join()
    print("\n".join(said))
    assert watch.asked > 10 and watch.slowest < 1.0, (watch.asked, watch.slowest)
    assert host.is_running() and rank.is_running() and rank.pid == _rank_actor(server).pid
    after = _run(server, _graph_for(names, "ours", "cpu,box2/cpu", 6, (80, 80), 1.0, 1.0, "attack/after"))
    core = _run(server, _graph_for(names, "core", "", 6, (80, 80), 1.0, 1.0, "attack/core"))
    assert_split_close(after, core, COMFY_SPLIT_BOUND, "the member after the stranger vs core")
    log = server.log_text()
    assert len(re.findall(r"session \d+ open on Ray", log)) == sessions + 1, server.log_tail()
    assert re.search(r"gloo holds the host \d+, member box2/cpu \d+ connections nobody of the session opened", log), \
        server.log_tail()
    now = (host.num_fds(), rank.num_fds())
    assert now[0] < files[0] + 64 and now[1] < files[1] + 64, (files, now)  # the stranger's connections closed
