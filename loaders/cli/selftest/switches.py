"""What ``selftest``'s checks run under, said before them and in the verdict: ComfyUI's version,
dynamic VRAM, the Comfy Compiler and CUDA graphs (feature-detected: "not in this ComfyUI" where the
running core has no such switch), pinned memory, and the GPUs torch sees against those NVML sees
(ComfyUI on Windows shows one GPU of several unless started with ``--cuda-device all``).

``--disable-comfy-compiler`` / ``--disable-cuda-graphs`` of the selftest set core's own switches
(read by core when a model runs), so a user can compare a run with each off, as ComfyUI started
with that flag would run.
"""
from __future__ import annotations

from ....parallel.placement.inventory import read_inventory, read_nvml_gpu_count
from ...comfy.core.running_state import NOT_HERE, compiler_state, cuda_graphs_state, sync_pinned_memory

__all__ = ["SWITCHES", "apply_switches", "comfyui_version", "gpu_lines", "settings_line", "settings_summary"]

SWITCHES = {"disable_comfy_compiler": "the Comfy Compiler (comfy-aimdo malloc graphs)",
            "disable_cuda_graphs": "CUDA graphs"}
"""Core switches the selftest takes as its own flags (argument name -> what it turns off)."""


def comfyui_version() -> str:
    try:
        import comfyui_version

        return comfyui_version.__version__
    except ImportError:
        return "(version unknown)"


def apply_switches(chosen: dict) -> list[str]:
    """Set core's ``args`` switches the user gave the selftest; one line per switch this ComfyUI lacks."""
    from comfy.cli_args import args

    lines = []
    for name, wanted in chosen.items():
        if not wanted:
            continue
        if hasattr(args, name):
            setattr(args, name, True)
        else:
            lines.append(f"--{name.replace('_', '-')}: {SWITCHES[name]} is {NOT_HERE}; nothing to turn off")
    return lines


def settings_summary(dynamic_vram: str) -> str:
    """``dynamic VRAM on, Comfy Compiler ..., CUDA graphs ..., pinned memory ...``."""
    pinned = "on" if sync_pinned_memory() else "off (--disable-pinned-memory)"
    return (f"dynamic VRAM {dynamic_vram}, Comfy Compiler {compiler_state()}, CUDA graphs {cuda_graphs_state()}, "
            f"pinned memory {pinned}")


def settings_line(dynamic_vram: str) -> str:
    return f"settings: {settings_summary(dynamic_vram)}"


def gpu_lines() -> list[str]:
    """Torch's GPUs against NVML's, and the hidden-GPU note (with its fix) when they differ."""
    import torch

    n_torch = torch.cuda.device_count() if torch.cuda.is_available() else 0
    n_nvml, why = read_nvml_gpu_count()
    nvml = f"NVML sees {n_nvml}" if n_nvml is not None else f"NVML unreadable ({why})"
    lines = [f"GPUs: torch sees {n_torch}, {nvml}"]
    note = read_inventory().hidden_note
    if note:
        lines.append(note)
    return lines
