"""Worker members (pure torch, gloo on 127.0.0.1): every serving process joins the lobby as the
member ``NAME/DEVICE``. Two spawned workers (``w1/cpu``, ``w2/cpu``; this machine has one ``cpu``,
so two names stand for two members) register real offers; the lobby lists, describes and checks
members; a 3-rank forward over the host and both members matches the unsharded model (equal or
within the split bound of tests/harness/numerics.py: the split gives GEMMs fewer rows).
The worker command refuses a device listed twice (one process per device) before importing ComfyUI.
Several devices per worker start one child each; that path needs two devices (a GPU) and is run
on a GPU machine; the one-device path is ``test_distributed_server_comfy``'s worker."""
import re
import subprocess
import sys

import pytest
import torch
from conftest import REPO
from harness import dist_procs
from harness.numerics import assert_split_close
from sharddit.parallel.distributed.entries import member_key, split_member
from sharddit.parallel.distributed.ranks import attach_remote_ranks
from harness.seq_models import engine_for as _engine, run_sequence as _run, toy_copies as _copies, toy_inputs as _inputs

TIMEOUT_S = 8.0


@pytest.fixture
def lobby():
    with dist_procs.lobby_with_workers(TIMEOUT_S, ("w1", "w2")) as lob:
        yield lob


def test_member_key_round_trip():
    assert member_key("box2", "cuda:1") == "box2/cuda:1"
    assert split_member("box2/cuda:1") == ("box2", "cuda:1")


def test_members_register_offers_and_are_described_by_name(lobby):
    joined = lobby.workers()
    assert sorted(joined) == ["w1/cpu", "w2/cpu"]
    for (member, offer), proc in zip(sorted(joined.items()), lobby.procs, strict=True):
        assert offer["pid"] == proc.pid and offer["device"] == "cpu" and offer["name"] == split_member(member)[0]
        assert offer["host"] and offer["free"] > 0
    lines = lobby.describe().splitlines()
    assert lines[0].startswith("Workers at 127.0.0.1:") and len(lines) == 3, lines
    assert re.fullmatch(r"  w1 on \S+: w1/cpu \d+\.\d GiB free", lines[1]), lines
    assert re.fullmatch(r"  w2 on \S+: w2/cpu \d+\.\d GiB free", lines[2]), lines


def test_check_names_names_the_member_and_the_command(lobby):
    lobby.check_names(["w1/cpu", "w2/cpu"])
    missing_device = (r"worker 'w1' has joined .* without device 'cuda:1' \(it serves w1/cpu; joined: w1/cpu, "
                      r"w2/cpu\); restart it with: .*--name w1 --devices cpu,cuda:1")
    with pytest.raises(ValueError, match=missing_device):
        lobby.check_names(["w1/cpu", "w1/cuda:1"])
    missing_name = (r"no worker named 'w3' .* 'w3/cuda:0' \(joined: w1/cpu, w2/cpu\); start it with: "
                    r"python <pack-dir> worker --join 127.0.0.1:\d+ --name w3 --devices cuda:0")
    with pytest.raises(ValueError, match=missing_name):
        lobby.check_names(["w3/cuda:0"])


def test_two_members_in_one_session_match_unsharded(lobby):
    model, ref_model = _copies(2)
    handle, engine = _engine(model, ["cpu", "cpu", "cpu"])
    ranks = attach_remote_ranks(engine, lobby, {1: "w1/cpu", 2: "w2/cpu"}, {"w1/cpu": "cpu", "w2/cpu": "cpu"})
    try:
        for batch in (1, 3):  # one group of 3 ranks (Ulysses across 3 processes); 3 groups of one rank
            x = _inputs(batch)
            with torch.no_grad():
                ref = ref_model(*x)
            out = _run(handle, model, *x)
            assert_split_close(out, ref, what=f"cpu,w1/cpu,w2/cpu batch {batch}")
        assert lobby.session.names == ("w1/cpu", "w2/cpu") and lobby.session.sid == 1
        assert ranks.bytes_sent["w1/cpu"] > 0 and ranks.bytes_sent["w2/cpu"] > 0
        assert lobby.session.label("w2/cpu") == "worker 'w2' (rank 2, cpu)"
    finally:
        engine.close()


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
    from sharddit.loaders.cli.worker_command import parse_worker_devices
    assert parse_worker_devices("cuda:0, CUDA:1,cpu") == ["cuda:0", "cuda:1", "cpu"]
    with pytest.raises(ValueError, match="'gpu' is not a device"):
        parse_worker_devices("gpu")


def test_a_stopped_member_leaves_the_lobby(lobby):
    """A worker that stops cleanly (Ctrl+C, or its sessions done) takes its registration out, so
    ``devices=auto`` does not count it; a killed one stays until it re-joins."""
    from sharddit.parallel.distributed.worker import Worker, connect
    store = connect("127.0.0.1", lobby.port, 5.0, wait_s=0)
    w = Worker(store, "w3", "cpu", None, say=lambda m: None)
    assert "w3/cpu" in lobby.workers()
    w.leave_lobby()
    assert sorted(lobby.workers()) == ["w1/cpu", "w2/cpu"]
