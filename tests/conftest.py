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
        reason="needs ComfyUI: set COMFYUI_PATH to an exported ComfyUI >= 0.3.64 tree (see tests/README.md)"
    )
    for item in items:
        if "gpu" in item.keywords and n_cuda < 1:
            item.add_marker(skip_gpu)
        if "multi_gpu" in item.keywords and n_cuda < 2:
            item.add_marker(skip_multi)
        if "comfy" in item.keywords and not COMFYUI_PATH:
            item.add_marker(skip_comfy)

# Fixtures for `comfy` tests: comfy_env, tiny_models, comfy_server (tests/harness/fixtures.py).
pytest_plugins = ["harness.fixtures"]
