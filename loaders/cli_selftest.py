"""``python <pack-dir> selftest``: run before downloading 30 GB of weights (see ``loaders/selftest.py``).

Imports ComfyUI in-process with CUDA when torch has it (``plan`` imports it CPU-only), builds tiny
random models from ComfyUI's own classes, downloads nothing. Exit codes: 0 all checks pass,
1 a check failed, 2 no ComfyUI.
"""
from __future__ import annotations

import contextlib
import logging
import sys
import time
from pathlib import Path

NAME = "selftest"
HELP = ("Check sharding on this machine with tiny random models (a few seconds, nothing downloaded): "
        "sharded vs unsharded sampling, GPU peer access and hop time, batched VAE decode vs core.")


def add_arguments(p) -> None:
    """No options: the self-test always uses every GPU torch sees (CUDA_VISIBLE_DEVICES narrows it)."""


def run(args) -> int:
    t0 = time.perf_counter()
    root = import_comfyui_with_cuda(verbose=getattr(args, "verbose", False))
    from .selftest import run_selftest

    return run_selftest(root, import_s=time.perf_counter() - t0)


def import_comfyui_with_cuda(verbose: bool = False) -> Path:
    """Like ``cli.import_comfyui``, but ComfyUI keeps CUDA when torch has it (CPU mode otherwise,
    also on MPS/XPU machines: the self-test compares CUDA and CPU only)."""
    from .cli import find_comfyui

    root = find_comfyui()
    if str(root) not in sys.path:
        sys.path.insert(0, str(root))  # as cli.import_comfyui: ComfyUI's modules win over same-named ones
    import torch
    import comfy.options

    comfy.options.enable_args_parsing(False)
    from comfy.cli_args import args

    args.cpu = not torch.cuda.is_available()
    args.use_pytorch_cross_attention = True
    with _quiet(not verbose):  # e.g. "torchaudio missing, ACE model will be broken": not about us
        import comfy.model_management  # noqa: F401  (after args are set)
        import comfy.sample  # noqa: F401
        import comfy.sd  # noqa: F401
    return root


@contextlib.contextmanager
def _quiet(enabled: bool):
    root = logging.getLogger()
    level = root.level
    if enabled:
        root.setLevel(logging.ERROR)
    try:
        yield
    finally:
        root.setLevel(level)
