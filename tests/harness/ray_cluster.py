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


HEALTH = {"RAY_health_check_period_ms": "500", "RAY_health_check_failure_threshold": "4",
          "RAY_health_check_initial_delay_ms": "0"}  # a dead node is noticed in ~2 s, not Ray's default ~15 s


class LocalRayCluster:
    """A Ray head and worker nodes on 127.0.0.1, token auth on, each node started by the real
    ``python <pack-dir> worker --ray --join ... --name NAME --devices cpu``; this process is the
    host's Ray driver (``parallel.cluster.driver.connect``). Nodes' ranks also build the tests' toy
    blocks (``SHARDDIT_WORKER_IMPORTS=harness.dist_toys``) and, where ``COMFYUI_PATH`` is set,
    ComfyUI's. ``node_env``: the environment of every node (tokens, HOME) for other processes."""

    def __init__(self, tmp, repo, timeout_s: float, driver: bool = True):
        import secrets
        import sys

        tmp.mkdir(parents=True, exist_ok=True)
        self.driver = driver
        """Whether this process joins as the Ray driver (False: another process is the host, e.g.
        a ComfyUI server; one Ray driver per process, and a test run may hold another cluster's)."""
        self.tmp, self.repo, self.timeout_s, self.python = tmp, repo, timeout_s, sys.executable
        self.token = secrets.token_hex(32)
        self.port = _free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.node_env = {**os.environ, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": self.token, "HOME": str(tmp),
                         "RAY_USAGE_STATS_ENABLED": "0", "PYTHONUNBUFFERED": "1", **HEALTH}
        self.node_env.pop("SHARDDIT_CLUSTER_INSECURE", None)
        self.node_env.pop("COMFYUI_PATH", None)  # toys only, unless a node is given it (add_node's env)
        self.procs: dict[str, subprocess.Popen] = {}
        self.ray = None
        import tempfile

        self.ray_tmp = tempfile.mkdtemp(prefix="sr", dir="/tmp")
        """Ray's own files: a short path (its socket paths must fit 107 bytes), removed by ``stop``."""
        self.record_dir = tmp / "rec"
        """Where each rank actor records its collectives, ``<pid>.jsonl`` (``harness.dist_order``)."""

    def start(self, names=()):
        head = [self.python, "-m", "ray.scripts.scripts", "start", "--head", "--port", str(self.port), "--num-cpus",
                "1", "--num-gpus", "0", "--include-dashboard=false", "--object-store-memory", str(100 << 20),
                "--temp-dir", self.ray_tmp, "--disable-usage-stats", "--block"]
        self.procs["head"] = start_group(head, self.node_env, open(self.tmp / "head.log", "w"))
        wait_for("the Ray head's port", lambda: listening("127.0.0.1", self.port), 60)
        for name in names:  # one at a time: two raylets starting at once on two busy cores time out
            self.add_node(name)
        if not self.driver:
            return self
        from sharddit.parallel.cluster.driver import connect

        self._saved = dict(os.environ)  # the driver keeps the token while it is connected (restored by stop)
        os.environ.update({k: self.node_env[k] for k in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN", *HEALTH)})
        self.ray = connect(self.address, self.timeout_s)
        for name in names:
            self.wait_node(name)
        return self

    def add_node(self, name: str, wait: bool = True, env: dict | None = None):
        cmd = [self.python, str(self.repo), "worker", "--join", self.address, "--name", name, "--devices", "cpu"]
        self.record_dir.mkdir(exist_ok=True)
        env = {**self.node_env, "PYTHONPATH": str(self.repo / "tests"), "SHARDDIT_WORKER_IMPORTS": "harness.dist_toys",
               "SHARDDIT_TEST_RECORD_DIR": str(self.record_dir), **(env or {})}
        self.procs[name] = start_group(cmd, env, open(self.tmp / f"{name}.log", "w"))
        if wait:
            self.wait_node(name)

    def wait_node(self, name: str, timeout_s: float = 180):
        """Until ``ray start --block`` says the node runs (then Ray lists it within a second)."""
        log, proc = self.tmp / f"{name}.log", self.procs[name]

        def started():
            text = log.read_text(errors="replace")
            if proc.poll() is not None:
                pytest.fail(f"the Ray node {name} exited with {proc.returncode}:\n{text[-3000:]}")
            return "Ray runtime started" in text

        wait_for(f"the Ray node {name}", started, timeout_s)
        if self.ray is not None:
            from sharddit.parallel.cluster.driver import list_members

            wait_for(f"member {name}/cpu", lambda: f"{name}/cpu" in list_members(self.ray), 30)

    def stop_node(self, name: str):
        stop_group(self.procs.pop(name))

    def kill_node(self, name: str):
        """SIGKILL the node's whole process group (its raylet and rank actors): a machine gone."""
        import signal

        proc = self.procs.pop(name)
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait(15)

    def status(self) -> str:
        """``ray status`` of this cluster (its nodes and their resources), with the token."""
        done = subprocess.run([self.python, "-m", "ray.scripts.scripts", "status", "--address", self.address],
                              capture_output=True, text=True, env=self.node_env, timeout=60)
        return done.stdout + done.stderr

    def stop(self):
        if self.ray is not None and self.ray.is_initialized():
            self.ray.shutdown()
        if getattr(self, "_saved", None) is not None:
            os.environ.clear()
            os.environ.update(self._saved)
        import shutil

        shutil.rmtree(self.ray_tmp, ignore_errors=True)
        for name in [n for n in self.procs if n != "head"] + ["head"]:
            if name in self.procs:
                stop_group(self.procs.pop(name))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
