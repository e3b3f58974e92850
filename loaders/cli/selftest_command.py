"""``python <pack-dir> selftest``: run before downloading 30 GB of weights (see ``loaders/cli/selftest/suite.py``).

Imports ComfyUI in-process with CUDA when torch has it (``plan`` imports it CPU-only), builds tiny
random models from ComfyUI's own classes, downloads nothing. Exit codes: 0 all checks pass,
1 a check failed, 2 no ComfyUI.
"""
from __future__ import annotations

import time

from ..comfyui_import import import_comfyui

NAME = "selftest"
HELP = ("Check sharding on this machine with tiny random models (a few seconds, nothing downloaded): "
        "sharded vs unsharded sampling, GPU peer access and hop time, batched VAE decode vs core.")


def add_arguments(p) -> None:
    """The self-test always uses every GPU torch sees (CUDA_VISIBLE_DEVICES narrows it)."""
    p.add_argument("--disable-dynamic-vram", action="store_true",
                   help="run as ComfyUI started with --disable-dynamic-vram (by default ComfyUI's dynamic VRAM is "
                        "on where its main.py turns it on: NVIDIA GPUs, ComfyUI 0.16+)")
    p.add_argument("--disable-comfy-compiler", action="store_true",
                   help="run as ComfyUI started with --disable-comfy-compiler (ComfyUI 0.34+; said when absent)")
    p.add_argument("--disable-cuda-graphs", action="store_true",
                   help="run as ComfyUI started with --disable-cuda-graphs (said when this ComfyUI has no such switch)")


def run(args) -> int:
    t0 = time.perf_counter()
    root = import_comfyui(use_cuda=True, quiet=not getattr(args, "verbose", False),
                          dynamic_vram=not getattr(args, "disable_dynamic_vram", False))
    from .selftest.suite import (  # imports ComfyUI: after import_comfyui
        PREFIX,
        run_selftest,
    )
    from .selftest.switches import SWITCHES, apply_switches

    for line in apply_switches({name: getattr(args, name, False) for name in SWITCHES}):
        print(f"{PREFIX} {line}", flush=True)
    return run_selftest(root, import_s=time.perf_counter() - t0)

