"""``python <pack-dir> worker`` checks every argument before Ray starts (or is even needed) and
names a host that does not resolve as such (issue 19's fault run: silent for 60 s, ``--devices ""``
meaning cpu). Each case runs the real command as a subprocess; none of them gets as far as Ray or
ComfyUI. That it says within seconds that it is waiting, and for what: test_cluster_ray.py."""
import os
import subprocess
import sys

import pytest
from harness import dist_procs
from harness.server import REPO
from sharddit.parallel.placement.devices import MEMBER_NAME_FORM
from sharddit.parallel.distributed.config import PROGRESS_S, HostUnreachable, HostUnresolved, wait_for_port

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


def test_a_host_name_that_does_not_resolve_is_named_at_once():
    rc, out = _worker("--join", "nonexistent.invalid:6379", "--name", "w1", "--devices", "cpu")
    assert rc == 2, out
    assert "--join 'nonexistent.invalid:6379': the host name 'nonexistent.invalid' does not resolve" in out, out
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


@pytest.mark.parametrize("join", ["127.0.0.1:99999", "127.0.0.1:notaport", ":6379"])
def test_a_bad_join_address_is_refused_before_connecting(join):
    rc, out = _worker("--join", join, "--name", "w1")
    assert rc == 2, out
    assert f"--join={join!r} is not HOST:PORT with a port 1-65535" in out, out


def test_waiting_for_a_port_names_resolution_failures_and_says_it_is_waiting():
    """What ``worker`` and the host's Ray driver run before Ray's own silent wait."""
    said = []
    with pytest.raises(HostUnresolved, match="'nonexistent.invalid' does not resolve"):
        wait_for_port("nonexistent.invalid", 6379, 30, say=said.append)
    assert said == []
    port = dist_procs.free_port()
    with pytest.raises(HostUnreachable, match=rf"nothing answered at 127\.0\.0\.1:{port} within 3 s"):
        wait_for_port("127.0.0.1", port, PROGRESS_S + 1, say=said.append)
    assert len(said) == 1 and said[0].startswith(f"[ShardDiT] waiting for the host at 127.0.0.1:{port}"), said
