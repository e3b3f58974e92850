"""The command line refuses a machine it cannot serve at once, with the fix (issue 31's fault run):
``--devices cuda:N`` on a machine without that GPU (the worker waited for its host first), and a
Python without torch (a bare ImportError traceback). The real command runs as a subprocess."""
import os
import subprocess
import sys
import time

import pytest
import torch
from harness import dist_procs
from harness.server import REPO

pytestmark = pytest.mark.no_blas  # no BLAS arithmetic: left out of the other-MKL_CBWR rerun in .ci/run

# runs the pack's command line in a Python where ``import torch`` fails, as it does where torch is absent
NO_TORCH = """
import runpy, sys
class NoTorch:
    def find_spec(self, name, path=None, target=None):
        if name == "torch" or name.startswith("torch."):
            raise ModuleNotFoundError("No module named 'torch'", name="torch")
sys.meta_path.insert(0, NoTorch())
sys.argv = [sys.argv[1]] + sys.argv[2:]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def _run(argv, timeout=60):
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    env.pop("PYTHONPATH", None)
    done = subprocess.run(argv, check=False, capture_output=True, text=True, env=env, timeout=timeout)
    return done.returncode, done.stdout + done.stderr


def test_worker_refuses_a_missing_gpu_before_waiting_for_the_host():
    """``--devices cuda:N`` past this machine's GPUs (cuda:0 on a CPU machine): exit 2 within
    seconds, naming the device and what torch sees, although nothing answers at --join."""
    missing = f"cuda:{torch.cuda.device_count() if torch.cuda.is_available() else 0}"
    port = dist_procs.free_port()
    start = time.monotonic()
    rc, out = _run([sys.executable, str(REPO), "worker", "--join", f"127.0.0.1:{port}", "--name", "w1",
                    "--devices", missing, "--wait", "8"])
    assert rc == 2, out
    assert f"--devices: {missing!r} does not exist" in out and "Traceback" not in out, out
    assert "waiting" not in out and time.monotonic() - start < 8, out


@pytest.mark.parametrize("command", [["plan", "--model", "wan2.1-t2v-1.3b"],
                                     ["worker", "--join", "127.0.0.1:1", "--name", "w1", "--devices", "cpu"]])
def test_commands_without_torch_say_how_to_install_it(command):
    rc, out = _run([sys.executable, "-c", NO_TORCH, str(REPO), *command])
    assert rc == 2, out
    assert "error: [ShardDiT] torch is not installed in" in out and "pip install torch" in out, out
    assert "Traceback" not in out, out


def test_plan_refuses_too_many_device_entries_at_once():
    """20,001 ``cpu`` entries: the limit and what to give, before ComfyUI is looked for (it ran
    172 s and ended in a contradictory "does not fit" before)."""
    start = time.monotonic()
    rc, out = _run([sys.executable, str(REPO), "plan", "--model", "wan2.1-t2v-1.3b", "--devices", ",".join(["cpu"] * 20001)])
    assert rc == 2, out
    assert "--devices lists 20001 entries" in out and "more than the 1024 ShardDiT takes" in out, out
    assert "Traceback" not in out and time.monotonic() - start < 30, out
