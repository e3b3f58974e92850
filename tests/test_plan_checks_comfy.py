"""`plan` checks every argument before it simulates or contacts a cluster, and contacts the cluster
(``--workers``) before it simulates: a careless argument or an absent cluster gets exit 2 and one
clear message, never a plan on stdout first, never C++ frames.

Each run is a real ``python <pack> plan`` with ComfyUI present (``COMFYUI_PATH``), so a check that
only happens after ComfyUI's import or after the simulation shows as a plan on stdout or a late
message. The model is the small preset at a small size (a few seconds of simulation when it gets
that far). Runs are bounded by ``timeout=``; none asserts a duration.
"""
import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.comfy

REPO = Path(__file__).resolve().parents[1]
SMALL = ("--model", "wan2.1-t2v-1.3b", "--size", "256x256", "--frames", "5")
CPP = ("frame #", "c10::", "c10d", "TCPStore.cpp", "socket.cpp")


def _plan(*args, timeout=300):
    env = {k: v for k, v in os.environ.items() if k != "SHARDDIT_DIST_WEIGHTS"}
    return subprocess.run([sys.executable, str(REPO), "plan", *SMALL, *args], capture_output=True, text=True,
                          env=env, cwd=str(REPO), timeout=timeout)


def _refused(out, *words):
    """Exit 2, nothing on stdout (no plan printed first), the words in stderr, no C++ frames."""
    assert out.returncode == 2, out.stdout + out.stderr
    assert out.stdout == "", out.stdout
    for w in words:
        assert w in out.stderr, out.stderr
    for w in CPP + ("Traceback",):
        assert w not in out.stderr, out.stderr


@pytest.mark.parametrize("addr", ["127.0.0.1:0", "127.0.0.1:70000", "127.0.0.1:abc", "", ":6379"])
def test_bad_workers_address_refused_before_the_simulation(addr):
    _refused(_plan("--devices", "cuda:0=24GiB,box2/cuda:0=24GiB", "--workers", addr),
             f"--workers={addr!r}", "HOST:PORT", "e.g. 192.168.1.10:6379")


@pytest.mark.parametrize("devices,words", [
    ("", ["devices ''", "'auto'"]),
    ("  ", ["devices ''", "'auto'"]),
    ("box/cuda:0,box/cuda:0", ["'box/cuda:0'", "2 times", "list it once"]),
    ("cuda:0=24GiB,box/cuda:0,box/cuda:0", ["'box/cuda:0'", "2 times", "list it once"]),
    ("cuda:0=24GiB,cuda:0=12GiB", ["'cuda:0' twice"]),
])
def test_bad_devices_refused_before_the_simulation(devices, words):
    _refused(_plan("--devices", devices), *words)


@pytest.mark.parametrize("devices", ["box/cuda:0", "box/cuda:0,box/cuda:1", "box/cuda:0,box/cuda:0"])
def test_the_fix_a_devices_error_suggests_is_itself_accepted(devices):
    """The suggestion ("e.g. '...'") passes the devices check: with it, the next argument checked
    (a bad --workers address) is the one refused."""
    out = _plan("--devices", devices)
    assert out.returncode == 2, out.stdout + out.stderr
    for fix in re.findall(r"e\.g\. '([^']+)'", out.stderr):
        again = _plan("--devices", fix, "--workers", "127.0.0.1:0")
        _refused(again, "--workers='127.0.0.1:0'")


@pytest.mark.parametrize("args,words", [
    (("--devices", "cuda:0=24GiB", "--reserve-vram-gb", "nan"), ["--reserve-vram-gb nan", "a number >= 0"]),
    (("--devices", "cuda:0=24GiB", "--png", "/nonexistent-dir/plan.png"), ["--png", "'/nonexistent-dir'"]),
    (("--devices", "cuda:0=24GiB", "--frames", "0"), ["--frames 0", "at least 1 frame"]),
    (("--devices", "cuda:0=24GiB,box2/cuda:0=24GiB", "--parallel", "blocks", "--workers", "127.0.0.1:1"),
     ["parallel 'sequence' only"]),
])
def test_other_bad_arguments_refused_before_contacting_or_simulating(args, words):
    _refused(_plan(*args), *words)


def test_a_model_that_cannot_take_the_size_is_refused_before_contacting_the_host():
    """4x4 pixels is under Wan's VAE stride (no latent cell at all): refused before --workers is
    contacted (the host here would never answer)."""
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(1)
        out = _plan("--devices", "cuda:0=24GiB,box2/cuda:0", "--size", "4x4",
                    "--workers", f"127.0.0.1:{silent.getsockname()[1]}")
    _refused(out, "size 4x4x", "is too small", ">= 8 pixels")
    assert "waiting" not in out.stderr


def test_workers_at_a_closed_port_say_so_before_any_plan():
    from harness.dist_procs import free_port

    port = free_port()  # bound and closed again: nothing listens there
    out = _plan("--devices", "cuda:0=24GiB,box2/cuda:0", "--workers", f"127.0.0.1:{port}")
    _refused(out, f"127.0.0.1:{port}", "Connection refused", f"is `ray start --head --port {port}` running there?")


def test_an_unresolvable_host_is_named_as_such_not_as_a_timeout():
    out = _plan("--devices", "cuda:0=24GiB", "--workers", "nosuchhost.invalid:6379")
    _refused(out, "'nosuchhost.invalid'", "does not resolve")
    assert "timed out" not in out.stderr


def test_a_cluster_without_token_auth_is_refused_before_any_plan(monkeypatch):
    """Something answers at the address, but this machine has no RAY_AUTH_MODE=token: refused,
    naming both fixes, before Ray is imported or any plan is printed."""
    monkeypatch.delenv("RAY_AUTH_MODE", raising=False)
    monkeypatch.delenv("SHARDDIT_CLUSTER_INSECURE", raising=False)
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(4)
        addr = f"127.0.0.1:{silent.getsockname()[1]}"
        out = _plan("--devices", "cuda:0=24GiB", "--workers", addr, timeout=300)
    _refused(out, f"--workers {addr}", "RAY_AUTH_MODE is unset, not 'token'", "ray get-auth-token --generate")
