"""``python <pack-dir> worker`` checks every argument before it connects, names a host that does
not resolve as such, and says within seconds that it is waiting and for what (issue 19's fault
run: silent for 60 s, an IPv6 warning every second, ``--devices ""`` meaning cpu). Each case runs
the real command as a subprocess; none of them gets as far as importing ComfyUI."""
import os
import subprocess
import sys

import pytest
from harness import dist_procs
from harness.server import REPO
from sharddit.parallel.placement.devices import MEMBER_NAME_FORM
from sharddit.parallel.distributed.connect import PROGRESS_S, HostUnreachable, HostUnresolved
from sharddit.parallel.distributed.worker import connect

pytestmark = pytest.mark.no_blas  # no BLAS arithmetic: left out of the other-MKL_CBWR rerun in .ci/run

NO_FRAMES = ("frame #", "c10::", "Traceback", "IPv6", "TCPStore.cpp")


def _worker(*args, timeout=120):
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    env.pop("PYTHONPATH", None)
    done = subprocess.run([sys.executable, str(REPO), "worker", *args], capture_output=True, text=True, env=env,
                          timeout=timeout)
    out = done.stdout + done.stderr
    for bad in NO_FRAMES:
        assert bad not in out, out
    return done.returncode, out


def test_nothing_listening_is_said_within_seconds_then_the_worker_gives_up():
    port = dist_procs.free_port()
    rc, out = _worker("--join", f"127.0.0.1:{port}", "--name", "w1", "--devices", "cpu", "--wait", "6")
    assert rc == 1, out
    lines = out.splitlines()
    waiting = [i for i, x in enumerate(lines) if x.startswith(f"[ShardDiT] waiting for the host at 127.0.0.1:{port} "
                                                              "(no answer yet: Connection refused; is ComfyUI running "
                                                              f"there with SHARDDIT_DIST_ADDR=127.0.0.1:{port}?)")]
    gave_up = [i for i, x in enumerate(lines) if f"nothing answered at 127.0.0.1:{port} within 6 s" in x
               and "worker 'w1' gives up (--wait 6)" in x]
    # said after PROGRESS_S (2 s) of waiting, before the 6 s wait ended
    assert len(waiting) == 1 and len(gave_up) == 1 and waiting[0] < gave_up[0], out


def test_a_host_name_that_does_not_resolve_is_named_at_once():
    rc, out = _worker("--join", "nonexistent.invalid:29555", "--name", "w1", "--devices", "cpu")
    assert rc == 2, out
    assert "--join 'nonexistent.invalid:29555': the host name 'nonexistent.invalid' does not resolve" in out, out
    assert "waiting" not in out, out


@pytest.mark.parametrize("name", ["", "a/b", "a,b", "a b", "x" * 100])
def test_a_bad_name_is_refused_before_connecting(name):
    rc, out = _worker("--join", "127.0.0.1:1", "--name", name, "--devices", "cpu")
    assert rc == 2, out
    assert f"--name {name!r} is not {MEMBER_NAME_FORM}" in out, out
    assert "waiting" not in out, out


@pytest.mark.parametrize("devices,message", [("", "--devices '' names no device"), (" , ", "is not a device"),
                                             ("gpu", "'gpu' is not a device"), ("cpu,cpu", "lists 'cpu' 2 times")])
def test_bad_devices_are_refused_before_connecting(devices, message):
    rc, out = _worker("--join", "127.0.0.1:1", "--name", "w1", "--devices", devices)
    assert rc == 2, out
    assert message in out and "waiting" not in out, out


@pytest.mark.parametrize("join", ["127.0.0.1:99999", "127.0.0.1:notaport", ":29555"])
def test_a_bad_join_address_is_refused_before_connecting(join):
    rc, out = _worker("--join", join, "--name", "w1")
    assert rc == 2, out
    assert f"--join={join!r} is not HOST:PORT with a port 1-65535" in out, out


def test_connect_names_resolution_failures_and_says_it_is_waiting():
    """The function ``plan --workers`` can share (``dist_connect.connect_store`` under it)."""
    said = []
    with pytest.raises(HostUnresolved, match="'nonexistent.invalid' does not resolve"):
        connect("nonexistent.invalid", 29555, 5.0, wait_s=30, say=said.append)
    assert said == []
    port = dist_procs.free_port()
    with pytest.raises(HostUnreachable, match=rf"nothing answered at 127\.0\.0\.1:{port} within 3 s"):
        connect("127.0.0.1", port, 5.0, wait_s=PROGRESS_S + 1, say=said.append)
    assert len(said) == 1 and said[0].startswith(f"[ShardDiT] waiting for the host at 127.0.0.1:{port}"), said
