"""Find a ComfyUI tree and import it in this process, for code that runs outside a ComfyUI server:
the command line (``plan``, ``selftest``) and the test harness. One place, one way.

Only ComfyUI's own root goes on ``sys.path`` (first, so its ``nodes.py`` / ``utils`` win); the
pack's folder never does (its ``nodes/`` would shadow ComfyUI's ``nodes.py``). Imports no ComfyUI
at module level.
"""
from __future__ import annotations

import contextlib
import logging
import os
import sys
from pathlib import Path

__all__ = ["ComfyUINotFound", "find_comfyui", "import_comfyui"]

PACK_DIR = Path(__file__).resolve().parents[1]


class ComfyUINotFound(RuntimeError):
    """No ComfyUI tree: the message says how to set COMFYUI_PATH."""


def find_comfyui() -> Path:
    """COMFYUI_PATH, else the ComfyUI this pack sits in (``ComfyUI/custom_nodes/<pack>``)."""
    env = os.environ.get("COMFYUI_PATH")
    if env:
        root = Path(env).expanduser().resolve()
        if not (root / "comfy" / "model_detection.py").is_file():
            raise ComfyUINotFound(
                f"[ShardDiT] COMFYUI_PATH={env!r} is not a ComfyUI folder (no comfy/model_detection.py "
                "in it): set COMFYUI_PATH to the folder that holds ComfyUI's main.py and comfy/")
        return root
    if PACK_DIR.parent.name == "custom_nodes" and (PACK_DIR.parents[1] / "comfy").is_dir():
        return PACK_DIR.parents[1]
    raise ComfyUINotFound(
        f"[ShardDiT] cannot find ComfyUI: the pack at {PACK_DIR} is not inside ComfyUI/custom_nodes/ and "
        "COMFYUI_PATH is not set. Set it to your ComfyUI folder (the one with main.py and comfy/), e.g. "
        f"COMFYUI_PATH=/path/to/ComfyUI python {PACK_DIR} plan ...")


def import_comfyui(use_cuda: bool = False, quiet: bool = False) -> Path:
    """Put ComfyUI's root first on ``sys.path``, set its arguments and import its model code.

    ``use_cuda=False``: CPU mode, ``comfy.model_management`` never initialises CUDA (the simulator,
    the tests). ``use_cuda=True``: ComfyUI keeps CUDA when torch has it, CPU mode otherwise (also on
    MPS/XPU machines: the self-test compares CUDA and CPU only). Attention is PyTorch SDPA in both.
    ``quiet``: hide ComfyUI's import-time log lines (e.g. "torchaudio missing"). Idempotent as far
    as ComfyUI allows: arguments are read when ``comfy.model_management`` is first imported.
    """
    root = find_comfyui()
    if str(root) not in sys.path:
        sys.path.insert(0, str(root))
    try:
        return _import(root, use_cuda, quiet)
    except ModuleNotFoundError as err:
        if err.name and err.name.split(".")[0] in ("comfy", "comfy_api", "folder_paths"):
            raise
        raise ComfyUINotFound(
            f"[ShardDiT] ComfyUI at {root} needs the Python package {err.name!r}, which {sys.executable} "
            f"lacks: run with ComfyUI's own Python, or install its requirements into this one "
            f"(pip install -r {root / 'requirements.txt'})") from None


def _import(root: Path, use_cuda: bool, quiet: bool) -> Path:
    import comfy.options

    comfy.options.enable_args_parsing(False)
    from comfy.cli_args import args

    if use_cuda:
        import torch

        args.cpu = not torch.cuda.is_available()
    else:
        args.cpu = True
    args.use_pytorch_cross_attention = True
    with _quiet(quiet):
        import comfy.model_management  # noqa: F401  (after args are set)
        import comfy.model_detection  # noqa: F401
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
