"""Processes of the Ray cluster tests (tests/test_cluster_ray.py): each started in its own process
group and ended by that group's id, never by name."""
import os
import signal
import socket
import subprocess
import time

import pytest


def start_group(cmd, env, log):
    """``cmd`` in a new session (its own process group), output to ``log``."""
    return subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)


def stop_group(proc):
    """End a process group this test started: SIGTERM, then SIGKILL after 15 s."""
    for sig, wait in ((signal.SIGTERM, 15), (signal.SIGKILL, 15)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(wait)
            return
        except subprocess.TimeoutExpired:
            continue


def wait_for(what, check, timeout_s):
    """``check()``'s first truthy value, polled every 0.5 s; the test fails after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.5)
    pytest.fail(f"{what} not within {timeout_s:g} s")


def listening(host, port):
    """Whether ``host:port`` accepts a TCP connection now."""
    try:
        socket.create_connection((host, port), timeout=1).close()
        return True
    except OSError:
        return False
