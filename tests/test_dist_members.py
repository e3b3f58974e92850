"""Members ``NAME/DEVICE`` and the worker command's device list (pure; sampling over members is
``test_cluster_sequence``). The worker command refuses a device listed twice before Ray starts."""
import subprocess
import sys

import pytest
from conftest import REPO
from sharddit.parallel.distributed.members import check_member, member_key, split_member


def test_member_key_round_trip_and_check():
    assert member_key("box2", "cuda:1") == "box2/cuda:1"
    assert split_member("box2/cuda:1") == ("box2", "cuda:1")
    assert check_member("box2/cuda:1") == "box2/cuda:1"
    for bad in ("box2", "box2/gpu", "box 2/cpu", "box2/cuda:1024", 7):
        with pytest.raises(ValueError, match="is not NAME/DEVICE"):
            check_member(bad)


def _worker_cli(*args):
    return subprocess.run([sys.executable, str(REPO), "worker", "--join", "127.0.0.1:1", "--name", "w1", *args],
                          check=False, capture_output=True, text=True, timeout=120)


def test_worker_command_refuses_a_device_listed_twice():
    done = _worker_cli("--devices", "cpu, CPU")
    assert done.returncode == 2, done
    assert "'cpu' 2 times: a worker serves each device once" in done.stderr and "--devices cpu" in done.stderr, done
    done = _worker_cli("--devices", "cuda:0,cpu,cuda:0")
    assert done.returncode == 2 and "e.g. --devices cuda:0,cpu" in done.stderr, done


def test_parse_worker_devices():
    from sharddit.loaders.cli.worker_devices import parse_worker_devices
    assert parse_worker_devices("cuda:0, CUDA:1,cpu") == ["cuda:0", "cuda:1", "cpu"]
    with pytest.raises(ValueError, match="'gpu' is not a device"):
        parse_worker_devices("gpu")
