"""Several machines on Ray (preview, issue 32), the parts that need no Ray (pure):

- a cluster role is refused without Ray's token authentication, naming both fixes, unless
  ``SHARDDIT_CLUSTER_INSECURE=1``, which is said loudly;
- members ``NAME/DEVICE`` are read from live nodes' labels and resources, a node counting only
  resources under its own name, two live nodes of one name refused;
- ``worker --ray`` builds a labelled ``ray start`` from this Python, offering Ray no GPUs (a
  member's actor holds the member's resource and uses the very GPU named), and refuses without
  token auth before starting anything;
- importing the pack, the cluster package and the worker command imports no Ray.
"""
import json
import logging
import os
import subprocess
import sys
from types import SimpleNamespace

import pytest
from harness.server import REPO
from sharddit.loaders.cli import worker_command, worker_ray
from sharddit.parallel.cluster.driver import members_from_nodes
from sharddit.parallel.cluster.node import ray_start_command
from sharddit.parallel.cluster.settings import (
    ClusterInsecure,
    check_auth,
    member_resource,
    parse_member_resource,
    ray_address,
)

pytestmark = pytest.mark.no_blas  # no BLAS arithmetic: left out of the other-MKL_CBWR rerun in .ci/run


@pytest.mark.parametrize("mode", [None, "", "disabled", "tokens"])
def test_a_cluster_role_without_token_auth_is_refused_naming_both_fixes(mode):
    env = {} if mode is None else {"RAY_AUTH_MODE": mode}
    with pytest.raises(ClusterInsecure) as info:
        check_auth("worker 'box2'", env)
    msg = str(info.value)
    assert msg.startswith("[ShardDiT] worker 'box2' refused: RAY_AUTH_MODE is "), msg
    assert "ray get-auth-token --generate" in msg and "RAY_AUTH_MODE=token" in msg, msg
    assert "SHARDDIT_CLUSTER_INSECURE=1" in msg, msg


def test_token_auth_passes_and_insecure_is_said_loudly(caplog):
    assert check_auth("host", {"RAY_AUTH_MODE": "token"}) is True
    with caplog.at_level(logging.WARNING):
        assert check_auth("host", {"RAY_AUTH_MODE": "disabled", "SHARDDIT_CLUSTER_INSECURE": "1"}) is False
    said = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(said) == 1 and said[0].startswith("[ShardDiT] WARNING: host starts WITHOUT Ray token"), said
    assert "run code on every member" in said[0], said


def test_ray_address_is_none_when_unset_or_blank():
    assert ray_address({}) is None and ray_address({"SHARDDIT_RAY_ADDRESS": "  "}) is None
    assert ray_address({"SHARDDIT_RAY_ADDRESS": " 10.0.0.1:6379 "}) == "10.0.0.1:6379"


def test_member_resources_round_trip_and_foreign_ones_are_ignored():
    assert member_resource("box2", "CUDA:1") == "sharddit/box2/cuda:1"
    assert parse_member_resource("sharddit/box2/cuda:1") == ("box2", "cuda:1")
    for foreign in ["CPU", "GPU", "node:10.0.0.2", "sharddit/box2", "sharddit/a b/cpu", "sharddit/box2/gpu7",
                    "sharddit/box2/cuda:0:3", "other/box2/cpu"]:
        assert parse_member_resource(foreign) is None, foreign


def _node(node_id, name, *resources, alive=True):
    return {"NodeID": node_id, "Alive": alive, "NodeManagerAddress": "10.0.0.2",
            "Labels": {"ray.io/node-id": node_id, **({"sharddit/name": name} if name else {})},
            "Resources": {"CPU": 4.0, "GPU": 2.0, **{r: 1.0 for r in resources}}}


def test_members_come_from_live_labelled_nodes_and_their_own_resources_only():
    nodes = [_node("a" * 56, "box2", "sharddit/box2/cuda:0", "sharddit/box2/cuda:1", "sharddit/box3/cpu"),
             _node("b" * 56, "box3", "sharddit/box3/cpu", alive=False),
             _node("c" * 56, None, "sharddit/box4/cpu"),
             _node("d" * 56, "box5", "sharddit/box5/cpu")]
    members = members_from_nodes(nodes)
    assert list(members) == ["box2/cuda:0", "box2/cuda:1", "box5/cpu"]
    assert members["box2/cuda:1"].node_id == "a" * 56 and members["box2/cuda:1"].device == "cuda:1"


def test_two_live_nodes_with_one_name_are_refused():
    nodes = [_node("a" * 56, "box2", "sharddit/box2/cpu"), _node("b" * 56, "box2", "sharddit/box2/cpu")]
    with pytest.raises(RuntimeError, match=r"two Ray nodes call themselves 'box2' \(aaaaaaaaaaaa and bbbbbbbbbbbb\)"):
        members_from_nodes(nodes)
    nodes[0]["Alive"] = False  # a restarted worker: the dead entry stays in ray.nodes() for a while
    assert list(members_from_nodes(nodes)) == ["box2/cpu"]


def test_the_node_command_is_ray_start_from_this_python_labelled_with_one_resource_per_device():
    cmd = ray_start_command("10.0.0.1:6379", "box2", ["cuda:0", "cuda:1", "cpu"])
    assert cmd[:4] == [sys.executable, "-m", "ray.scripts.scripts", "start"] and cmd[-1] == "--block", cmd
    assert cmd[cmd.index("--address") + 1] == "10.0.0.1:6379"
    assert cmd[cmd.index("--labels") + 1] == "sharddit/name=box2"
    assert json.loads(cmd[cmd.index("--resources") + 1]) == {"sharddit/box2/cuda:0": 1, "sharddit/box2/cuda:1": 1,
                                                            "sharddit/box2/cpu": 1}
    with pytest.raises(ValueError, match=r"--name 'box2-': on a Ray cluster a worker's name must end with a letter"):
        ray_start_command("10.0.0.1:6379", "box2-", ["cpu"])


def test_the_node_offers_ray_no_gpus_so_ray_leaves_cuda_visible_devices_alone():
    """Ray sets CUDA_VISIBLE_DEVICES only for an actor it gives GPUs; with none on the node, the
    actor of box2/cuda:1 sees the GPUs the worker command saw, and cuda:1 is the GPU --devices named."""
    cmd = ray_start_command("10.0.0.1:6379", "box2", ["cuda:1"])
    assert cmd[cmd.index("--num-gpus") + 1] == "0", cmd


def _args(**kw):
    base = {"join": "127.0.0.1:6379", "name": "box2", "devices": "cpu", "ray": False, "wait": 5.0}
    return SimpleNamespace(**{**base, **kw})


def test_worker_ray_is_refused_without_token_auth_before_starting_anything(monkeypatch):
    monkeypatch.delenv("RAY_AUTH_MODE", raising=False)
    monkeypatch.delenv("SHARDDIT_CLUSTER_INSECURE", raising=False)
    monkeypatch.setattr(worker_ray.subprocess, "Popen", lambda *a, **k: pytest.fail("started ray"))
    with pytest.raises(ClusterInsecure, match=r"worker 'box2' \(a Ray node\) refused: RAY_AUTH_MODE is unset"):
        worker_command.run(_args())


@pytest.mark.parametrize("join,address", [("10.0.0.1", "10.0.0.1:6379"), ("box1:7000", "box1:7000"),
                                          ("[::1]", "[::1]:6379"), ("[fd00::1]:7000", "[fd00::1]:7000")])
def test_worker_ray_joins_port_6379_unless_told(join, address):
    assert worker_ray.ray_join_address(join) == address


def test_worker_ray_names_what_is_missing(monkeypatch):
    with pytest.raises(ValueError, match=r"--name is required \(python <pack-dir> worker --join HOST:6379"):
        worker_command.run(_args(name=None))
    with pytest.raises(ValueError, match=r"--join='box1:x' is not HOST:PORT"):
        worker_command.run(_args(join="box1:x"))


def test_importing_the_pack_the_cluster_package_and_the_worker_command_imports_no_ray():
    code = ("import sys; sys.path.insert(0, sys.argv[1]); from harness.pack import import_pack; import_pack(); "
            "import sharddit.parallel.cluster.driver, sharddit.parallel.cluster.group, sharddit.parallel.cluster.node; "
            "import sharddit.loaders.cli.worker_command; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] == 'ray'))")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run([sys.executable, "-c", code, str(REPO / "tests")], capture_output=True, text=True, env=env,
                          timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "[]", done.stdout + done.stderr


def test_the_host_joins_no_cluster_unless_told_and_refuses_one_without_token_auth(monkeypatch):
    from sharddit.parallel.cluster import driver
    from sharddit.parallel.cluster.host import cluster_host

    monkeypatch.delenv("SHARDDIT_RAY_ADDRESS", raising=False)
    assert cluster_host() is None
    monkeypatch.setenv("SHARDDIT_RAY_ADDRESS", "127.0.0.1:1")
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
    monkeypatch.delenv("SHARDDIT_CLUSTER_INSECURE", raising=False)
    monkeypatch.setattr(driver, "import_ray", lambda: pytest.fail("imported ray before checking token auth"))
    refused = r"the ComfyUI host \(a Ray driver\) refused: RAY_AUTH_MODE is 'disabled'"
    with pytest.raises(ClusterInsecure, match=refused):
        cluster_host()
