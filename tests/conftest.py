"""Test harness: imports the pack as the package ``sharddit`` by path.

The repo root is never put on ``sys.path`` (its ``nodes/`` would shadow ComfyUI's ``nodes.py``);
pytest runs in ``--import-mode=importlib`` (pyproject) for the same reason.
"""
import os
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
COMFYUI_PATH = os.environ.get("COMFYUI_PATH")
# SHARDDIT_REQUIRE_COMFY=1 (CI's ComfyUI run, .ci/run): a skipped test fails the session unless it
# was skipped for want of a GPU, or for a model class that ComfyUI 0.3.x does not have (said only
# when the tree's comfyui_version.py reads 0.3.x: test_families_comfy.py); so a missing ComfyUI or
# tool cannot pass as "skipped".
REQUIRE_COMFY = os.environ.get("SHARDDIT_REQUIRE_COMFY") == "1"
EXPECTED_SKIPS = ("needs a CUDA GPU", "needs >= 2 CUDA GPUs", "needs two GPUs", "(added after ComfyUI 0.3.64)")
_unexpected_skips: list[str] = []
# `cluster` tests (parallel/cluster/, issue 32) need Ray, which only CI's cluster run installs
# (requirements-cluster.txt): elsewhere they skip with RAY_MISSING. SHARDDIT_REQUIRE_CLUSTER=1 (that
# run) fails the session on such a skip, so a missing Ray cannot pass there as "skipped".
RAY_MISSING = "ray is not installed"
REQUIRE_CLUSTER = os.environ.get("SHARDDIT_REQUIRE_CLUSTER") == "1"


# Shared helpers live in tests/harness (imported as `harness`). tests/ holds no package named
# nodes/loaders/parallel, so this cannot shadow ComfyUI's modules; the repo root stays off sys.path.
if str(REPO / "tests") not in sys.path:
    sys.path.insert(0, str(REPO / "tests"))

from harness.pack import import_pack  # noqa: E402

import_pack()


def pytest_collection_modifyitems(config, items):
    import torch

    n_cuda = torch.cuda.device_count() if torch.cuda.is_available() else 0
    skip_gpu = pytest.mark.skip(reason="needs a CUDA GPU (torch.cuda.is_available() is False)")
    skip_multi = pytest.mark.skip(reason=f"needs >= 2 CUDA GPUs, found {n_cuda}")
    skip_comfy = pytest.mark.skip(
        reason="needs ComfyUI: set COMFYUI_PATH to a ComfyUI >= 0.3.64 folder (see tests/README.md)"
    )
    import importlib.util

    skip_ray = pytest.mark.skip(reason=f"{RAY_MISSING} (pip install -r requirements-cluster.txt to run the cluster "
                                       "tests)")
    has_ray = importlib.util.find_spec("ray") is not None
    for item in items:
        if "cluster" in item.keywords and not has_ray:
            item.add_marker(skip_ray)
        if "gpu" in item.keywords and n_cuda < 1:
            item.add_marker(skip_gpu)
        if "multi_gpu" in item.keywords and n_cuda < 2:
            item.add_marker(skip_multi)
        if "comfy" in item.keywords and not COMFYUI_PATH:
            item.add_marker(skip_comfy)

def pytest_runtest_logreport(report):
    if REQUIRE_COMFY and report.skipped and not hasattr(report, "wasxfail"):
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        if not any(expected in reason for expected in EXPECTED_SKIPS):
            _unexpected_skips.append(f"{report.nodeid}: {reason}")
    if REQUIRE_CLUSTER and report.skipped and "cluster" in report.keywords:
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        _unexpected_skips.append(f"{report.nodeid}: {reason} (SHARDDIT_REQUIRE_CLUSTER=1)")


def pytest_sessionfinish(session, exitstatus):
    if _unexpected_skips:
        session.exitstatus = 1


def pytest_terminal_summary(terminalreporter):
    if _unexpected_skips:
        terminalreporter.write_line("[ShardDiT] unexpected skips (SHARDDIT_REQUIRE_COMFY=1 allows only GPU "
                                    "skips, SHARDDIT_REQUIRE_CLUSTER=1 no cluster skip), failing the run:\n  "
                                    + "\n  ".join(_unexpected_skips), red=True)


# Fixtures for `comfy` tests: comfy_env, tiny_models, comfy_server (tests/harness/fixtures.py).
pytest_plugins = ["harness.fixtures"]


@pytest.fixture(scope="session")
def ray_members(tmp_path_factory):
    """A local Ray cluster (token auth on) with worker nodes w1 and w2 (members ``w1/cpu``,
    ``w2/cpu``), shared by the `cluster` tests that sample through members; this process is its
    driver. Started on first use, stopped at the end of the run."""
    from harness.ray_cluster import LocalRayCluster
    from harness.server import REPO

    cluster = LocalRayCluster(tmp_path_factory.mktemp("rm"), REPO, 8.0)  # short: Ray's socket paths fit 107 bytes
    try:
        yield cluster.start(("w1", "w2"))
    finally:
        cluster.stop()
