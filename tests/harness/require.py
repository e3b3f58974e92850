"""A test that needs a tool skips on a developer's machine and fails in CI.

CI (``CI=true``, as GitHub Actions and most runners set it) and ``.ci/run``'s ComfyUI part
(``SHARDDIT_REQUIRE_COMFY=1``) install every tool the tests need (tests/requirements.txt), so a
missing one there is a broken environment, not a reason to pass quietly. conftest fails a run with
an unexpected skip under SHARDDIT_REQUIRE_COMFY=1 only for skips seen while tests run; these
helpers also cover skips at import time (``importorskip`` at module level) and ``CI=true``.
"""
from __future__ import annotations

import importlib
import os

import pytest

STRICT = os.environ.get("SHARDDIT_REQUIRE_COMFY") == "1" or os.environ.get("CI", "").strip().lower() == "true"


def skip_or_fail(reason: str) -> None:
    """Skip with ``reason``; under CI=true or SHARDDIT_REQUIRE_COMFY=1 fail with it."""
    if STRICT:
        pytest.fail(f"{reason} (CI=true / SHARDDIT_REQUIRE_COMFY=1: a missing tool fails the run, "
                    "install tests/requirements.txt)", pytrace=False)
    pytest.skip(reason, allow_module_level=True)


def import_or_skip(module: str, reason: str):
    """``importlib.import_module(module)``, or ``skip_or_fail(reason)`` when it is not installed."""
    try:
        return importlib.import_module(module)
    except ImportError:
        skip_or_fail(reason)
