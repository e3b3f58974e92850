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
from ..parallel.errors import RunError

__all__ = ["ComfyUINotFound", "dynamic_vram_status", "find_comfyui", "import_comfyui"]

PACK_DIR = Path(__file__).resolve().parents[1]


class ComfyUINotFound(RunError):
    """No ComfyUI tree: the message says how to set COMFYUI_PATH."""


def find_comfyui() -> Path:
    """COMFYUI_PATH, else the ComfyUI this pack sits in (``ComfyUI/custom_nodes/<pack>``)."""
    env = os.environ.get("COMFYUI_PATH")
    if env:
        root = Path(env).expanduser().resolve()
        if not (root / "comfy" / "model_detection.py").is_file():
            raise ComfyUINotFound(
                f"COMFYUI_PATH={env!r} is not a ComfyUI folder (no comfy/model_detection.py "
                "in it): set COMFYUI_PATH to the folder that holds ComfyUI's main.py and comfy/")
        return root
    if PACK_DIR.parent.name == "custom_nodes" and (PACK_DIR.parents[1] / "comfy").is_dir():
        return PACK_DIR.parents[1]
    raise ComfyUINotFound(
        f"cannot find ComfyUI: the pack at {PACK_DIR} is not inside ComfyUI/custom_nodes/ and "
        "COMFYUI_PATH is not set. Set it to your ComfyUI folder (the one with main.py and comfy/), e.g. "
        f"COMFYUI_PATH=/path/to/ComfyUI python {PACK_DIR} plan ...")


def import_comfyui(use_cuda: bool = False, quiet: bool = False, dynamic_vram: bool = False) -> Path:
    """Put ComfyUI's root first on ``sys.path``, set its arguments and import its model code.

    ``use_cuda=False``: CPU mode, ``comfy.model_management`` never initialises CUDA (the simulator,
    the tests). ``use_cuda=True``: ComfyUI keeps CUDA when torch has it, CPU mode otherwise (also on
    MPS/XPU machines: the self-test compares CUDA and CPU only). Attention is PyTorch SDPA in both.
    ``quiet``: hide ComfyUI's import-time log lines (e.g. "torchaudio missing"). ``dynamic_vram``:
    turn ComfyUI's dynamic VRAM on where its ``main.py`` would (``dynamic_vram_status`` says whether
    and why). Idempotent as far as ComfyUI allows: arguments are read when
    ``comfy.model_management`` is first imported.
    """
    root = find_comfyui()
    if str(root) not in sys.path:
        sys.path.insert(0, str(root))
    try:
        return _import(root, use_cuda, quiet, dynamic_vram)
    except ModuleNotFoundError as err:
        if err.name and err.name.split(".")[0] in ("comfy", "comfy_api", "folder_paths"):
            raise
        raise ComfyUINotFound(
            f"ComfyUI at {root} needs the Python package {err.name!r}, which {sys.executable} "
            f"lacks: run with ComfyUI's own Python, or install its requirements into this one "
            f"(pip install -r {root / 'requirements.txt'})") from None


def _import(root: Path, use_cuda: bool, quiet: bool, dynamic_vram: bool = False) -> Path:
    import comfy.options

    comfy.options.enable_args_parsing(False)
    from comfy.cli_args import args

    if use_cuda:
        import torch

        args.cpu = not torch.cuda.is_available()
    else:
        args.cpu = True
    args.use_pytorch_cross_attention = True
    aimdo = _load_aimdo(args) if dynamic_vram else None  # before any comfy module binds it, as main.py
    with _quiet(quiet):
        import comfy.model_management  # noqa: F401  (after args are set)
        import comfy.model_detection  # noqa: F401
        import comfy.sample  # noqa: F401
        import comfy.sd  # noqa: F401
    if dynamic_vram and not _DYNAMIC:
        _DYNAMIC.append(_enable_dynamic_vram(args, aimdo))
    return root


_DYNAMIC: list[str] = []  # the one import's dynamic VRAM status line


def dynamic_vram_status() -> str:
    """``on`` or ``off: why`` after ``import_comfyui(dynamic_vram=True)``; ``off: not requested`` else."""
    return _DYNAMIC[0] if _DYNAMIC else "off: not requested"


def _load_aimdo(args):
    """comfy-aimdo's native library, loaded where ComfyUI's ``main.py`` loads it (None otherwise)."""
    import comfy.cli_args

    enables = getattr(comfy.cli_args, "enables_dynamic_vram", None)  # core 0.16+
    if enables is None or not enables():
        return None
    try:
        import comfy_aimdo.control
    except ImportError:
        return None
    return comfy_aimdo.control if comfy_aimdo.control.init() else None


def _enable_dynamic_vram(args, aimdo) -> str:
    """What ComfyUI's ``main.py`` does to turn dynamic VRAM on (NVIDIA, not WSL, torch >= 2.8, or
    ``--enable-dynamic-vram``), through core's own functions; returns ``on`` or ``off: why``."""
    import comfy.model_management as mm
    import comfy.model_patcher

    if not hasattr(comfy.model_patcher, "ModelPatcherDynamic"):
        return "off: this ComfyUI has no dynamic VRAM (core before 0.16)"
    import comfy.memory_management
    if args.cpu:
        return "off: no CUDA GPU"
    if aimdo is None:
        return "off: comfy-aimdo is not installed or its native library did not load"
    forced = getattr(args, "enable_dynamic_vram", False)
    rocm = getattr(mm, "rocm_version", None)  # newer cores: AMD with ROCm >= 7.14 too
    supported = (mm.is_nvidia() and not mm.is_wsl()) or (mm.is_amd() and rocm is not None and rocm >= (7, 14))
    if not forced and (not supported or mm.torch_version_numeric < (2, 8)):
        return "off: ComfyUI turns it on for NVIDIA GPUs (outside WSL in 0.29) with torch >= 2.8 only"
    indices = [d.index for d in mm.get_all_torch_devices()]
    try:
        headroom = int(getattr(args, "vram_headroom", 0) * 1024 ** 3)
        ready = aimdo.init_devices((i, headroom) for i in indices)
    except TypeError:  # older comfy-aimdo: indices only
        ready = aimdo.init_devices(i for i in indices)
    if not ready:
        return "off: comfy-aimdo did not initialise the GPUs"
    comfy.model_patcher.CoreModelPatcher = comfy.model_patcher.ModelPatcherDynamic
    comfy.memory_management.aimdo_enabled = True
    return "on"


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
