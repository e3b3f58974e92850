"""Process-wide torch settings a test may change, and a context manager that puts them back.

Why: a GPU test that turns TF32 off (to compare fp32 results with a CPU reference) or turns on
``torch.cuda.set_sync_debug_mode`` changes every later test in the same pytest process: a comfy
test run after it would then measure other kernels than a user gets. Tests that change one of
these wrap themselves in ``restored()`` (an autouse fixture in the module, e.g.
``tests/test_sharding_gpu.py``), and ``tests/test_global_flags.py`` proves on CPU that every
setting listed here comes back.

TF32 has two linked APIs in torch >= 2.9: ``allow_tf32`` / ``set_float32_matmul_precision`` and the
newer ``fp32_precision`` attributes; setting one changes the other, so both are read and restored
(the old API first, then the new one, whose values are the finer ones).
"""
from __future__ import annotations

import contextlib

import torch

__all__ = ["read_flags", "restored"]

_BOOL_ATTRS = (
    ("backends.cuda.matmul", "allow_tf32"),
    ("backends.cuda.matmul", "allow_fp16_reduced_precision_reduction"),
    ("backends.cuda.matmul", "allow_bf16_reduced_precision_reduction"),
    ("backends.cudnn", "allow_tf32"),
    ("backends.cudnn", "benchmark"),
    ("backends.cudnn", "deterministic"),
    ("backends.cudnn", "enabled"),
    ("backends.mkldnn", "enabled"),
)
_PRECISION_OWNERS = ("backends", "backends.cuda.matmul", "backends.cudnn", "backends.cudnn.conv",
                     "backends.cudnn.rnn", "backends.mkldnn", "backends.mkldnn.matmul", "backends.mkldnn.conv",
                     "backends.mkldnn.rnn")
_SDP = ("flash", "mem_efficient", "math", "cudnn")


def _obj(path: str):
    obj = torch
    for part in path.split("."):
        obj = getattr(obj, part, None)
        if obj is None:
            return None
    return obj


def read_flags() -> dict:
    """Every setting this module restores, by name (settings this torch lacks are left out)."""
    flags = {"float32_matmul_precision": torch.get_float32_matmul_precision(),
             "deterministic_algorithms": (torch.are_deterministic_algorithms_enabled(),
                                          torch.is_deterministic_algorithms_warn_only_enabled()),
             "num_threads": torch.get_num_threads(),
             "default_dtype": torch.get_default_dtype(),
             "grad_enabled": torch.is_grad_enabled()}
    for path, attr in _BOOL_ATTRS:
        obj = _obj(path)
        if obj is not None and hasattr(obj, attr):
            flags[f"{path}.{attr}"] = getattr(obj, attr)
    for path in _PRECISION_OWNERS:
        obj = _obj(path)
        if obj is not None and hasattr(obj, "fp32_precision"):
            flags[f"{path}.fp32_precision"] = obj.fp32_precision
    for kind in _SDP:
        getter = getattr(torch.backends.cuda, f"{kind}_sdp_enabled", None)
        if getter is not None:
            flags[f"sdp.{kind}"] = getter()
    if torch.cuda.is_available():  # needs a CUDA build with a device
        flags["sync_debug_mode"] = torch.cuda.get_sync_debug_mode()
    return flags


def _write(flags: dict) -> None:
    """Set every setting back (a setter whose value did not change is not called:
    ``use_deterministic_algorithms`` imports torch._dynamo's config, seconds on first use)."""
    torch.set_float32_matmul_precision(flags["float32_matmul_precision"])
    if (torch.are_deterministic_algorithms_enabled(),
            torch.is_deterministic_algorithms_warn_only_enabled()) != flags["deterministic_algorithms"]:
        on, warn_only = flags["deterministic_algorithms"]
        torch.use_deterministic_algorithms(on, warn_only=warn_only)
    torch.set_num_threads(flags["num_threads"])
    torch.set_default_dtype(flags["default_dtype"])
    torch.set_grad_enabled(flags["grad_enabled"])
    for key, value in flags.items():
        path, _, attr = key.rpartition(".")
        if key.startswith("backends.") and attr != "fp32_precision":
            setattr(_obj(path), attr, value)
    for key, value in flags.items():  # the new TF32 API last: it holds the finer values
        path, _, attr = key.rpartition(".")
        if attr == "fp32_precision":
            setattr(_obj(path), attr, value)
    for kind in _SDP:
        if f"sdp.{kind}" in flags:
            getattr(torch.backends.cuda, f"enable_{kind}_sdp")(flags[f"sdp.{kind}"])
    if "sync_debug_mode" in flags:
        torch.cuda.set_sync_debug_mode(flags["sync_debug_mode"])


@contextlib.contextmanager
def restored():
    """Run the body, then put back every setting ``read_flags`` lists (also after an exception)."""
    before = read_flags()
    try:
        yield before
    finally:
        _write(before)
