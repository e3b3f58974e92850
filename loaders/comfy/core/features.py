"""Which of core's own multi-GPU options the running ComfyUI has (feature-detected, never from a
version string), for the plan's and ``auto``'s baseline rows (``parallel/cost/baselines``).

- Core's CFG split: ``comfy/multigpu.py`` and ``comfy_extras/nodes_multigpu.py`` (core 0.23+,
  node ``MultiGPU_WorkUnits``, "MultiGPU CFG Split").
- Dynamic VRAM: ``comfy.model_patcher.ModelPatcherDynamic`` (core 0.16+). It is *on* in this
  process when ``main.py`` made it the ``CoreModelPatcher`` (NVIDIA, or ROCm >= 7.14 / forced on
  newer cores); otherwise (``plan`` without GPUs, ``--disable-dynamic-vram``, CPU) the rows name the
  condition instead.

- The Comfy Compiler (core 0.35+, read from 0.38.1's ``comfy/model_prefetch.py``): a model's block
  loop records its allocations in a comfy-aimdo *malloc graph* per thread
  (``MALLOC_GRAPHS[threading.get_ident()]``, active while ``_comfy_active``), and core keeps work that
  must stay out of it inside ``pause_malloc_graph()``; ``--disable-comfy-compiler`` turns the graphs
  off, ``--disable-cuda-graphs`` the CUDA graphs captured on top of them (0.33 has the CUDA graphs
  and that flag, not the malloc graphs).

ComfyUI is imported inside the functions: ``plan`` imports this module before ``import_comfyui``.
"""
from __future__ import annotations

import functools
import importlib
import importlib.util
import inspect
import sys
import threading

__all__ = ["COMPILER_FLAG", "CUDA_GRAPHS_FLAG", "DYNAMIC_CONDITION", "NONE_HERE", "core_cfg_split_available",
           "core_checks_v3_combos", "dynamic_vram_available", "dynamic_vram_condition", "malloc_graph_active",
           "malloc_graph_module"]

COMPILER_FLAG = "--disable-comfy-compiler"
CUDA_GRAPHS_FLAG = "--disable-cuda-graphs"

DYNAMIC_CONDITION = "on ComfyUI with dynamic VRAM (NVIDIA)"
NONE_HERE = ("core's own options: neither in this ComfyUI (one GPU with dynamic VRAM needs core 0.16+, "
             "core's MultiGPU CFG Split 0.23+)")


def _has_module(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def core_cfg_split_available() -> bool:
    return _has_module("comfy.multigpu") and _has_module("comfy_extras.nodes_multigpu")


def dynamic_vram_available() -> bool:
    import comfy.model_patcher

    return hasattr(comfy.model_patcher, "ModelPatcherDynamic")


def dynamic_vram_condition() -> str:
    """'' when dynamic VRAM is on in this process, else the condition under which core uses it."""
    import comfy.model_patcher

    dynamic = getattr(comfy.model_patcher, "ModelPatcherDynamic", None)
    on = dynamic is not None and getattr(comfy.model_patcher, "CoreModelPatcher", None) is dynamic
    return "" if on else DYNAMIC_CONDITION


@functools.cache
def core_checks_v3_combos() -> bool:
    """Whether ComfyUI's prompt validation checks a V3 combo ("COMBO" type) against its options.
    0.3.64 checks only V1 combos (whose type is the options list) and passes '' or 'ring' on to
    ``execute``; newer cores (0.29) check both, and there a list-typed V3 input breaks validation of
    linked inputs ("unhashable type: 'list'"). Read from core's own validation code; where that
    cannot be read, assume a newer core (the V3 form is then the one that works)."""
    try:
        import execution  # ComfyUI's execution.py

        return "Combo.io_type" in inspect.getsource(execution.validate_inputs)
    except (ImportError, AttributeError, OSError, TypeError):
        return True


def malloc_graph_module():
    """Core's ``comfy.model_prefetch`` when it has malloc graphs that work can be kept out of
    (``pause_malloc_graph`` and the per-thread ``MALLOC_GRAPHS``), else None (0.33 and older)."""
    prefetch = sys.modules.get("comfy.model_prefetch")
    if prefetch is None:
        if not _has_module("comfy.model_prefetch"):
            return None
        prefetch = importlib.import_module("comfy.model_prefetch")
    has = callable(getattr(prefetch, "pause_malloc_graph", None)) and \
        isinstance(getattr(prefetch, "MALLOC_GRAPHS", None), dict)
    return prefetch if has else None


def malloc_graph_active(prefetch) -> bool:
    """Whether ``prefetch`` (``malloc_graph_module()``) records a malloc graph on this thread now."""
    graph = prefetch.MALLOC_GRAPHS.get(threading.get_ident())
    return bool(getattr(graph, "_comfy_active", False))
