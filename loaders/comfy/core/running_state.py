"""What the running ComfyUI was started with and holds, read by feature detection (never from a
version string): pinned memory, the memory comfy-aimdo and torch keep for ComfyUI on each GPU, the
Comfy Compiler and CUDA graphs. ``features.py`` (another owner) says which core options exist;
this module reads their state in this process.

- ``--disable-pinned-memory`` (``comfy.cli_args.args.disable_pinned_memory``; absent in older cores:
  pinned memory allowed): ShardDiT's block ring then bounces nothing through page-locked RAM
  (``parallel/sequence/ops.set_pinned_memory``). Core's Windows warning asks for it whenever
  several NVIDIA GPUs are visible.
- Free memory: with dynamic VRAM, comfy-aimdo keeps VRAM for ComfyUI (model pages it can drop on
  demand); NVML counts it as used. Core's own ``ModelPatcher.get_free_memory`` counts it back with
  ``comfy_aimdo.model_vbar.vbars_analyze(index)`` when ``comfy.memory_management.aimdo_enabled``,
  on top of torch's cached-but-unused blocks (``comfy.model_management.get_free_memory``'s
  reserved - active); ``releasable_bytes`` reads the same two numbers, so placement sees what
  ComfyUI could make free.
- The Comfy Compiler (aimdo malloc graphs: ``args.disable_comfy_compiler``, on with dynamic VRAM
  on CUDA) and CUDA graphs (``args.disable_cuda_graphs``, over dynamic VRAM's blocks): "not in this
  ComfyUI" where the flag does not exist.
"""
from __future__ import annotations

import logging

__all__ = ["NOT_HERE", "compiler_state", "cuda_graphs_state", "pinned_memory_disabled", "releasable_bytes",
           "sync_pinned_memory", "with_releasable"]

log = logging.getLogger("sharddit")
NOT_HERE = "not in this ComfyUI"


def _args():
    try:
        from comfy.cli_args import args
    except ImportError:
        return None
    return args


def pinned_memory_disabled() -> bool:
    """ComfyUI was started with ``--disable-pinned-memory`` (False where the flag does not exist)."""
    return bool(getattr(_args(), "disable_pinned_memory", False))


def sync_pinned_memory() -> bool:
    """Make the ring's pinned bounce buffers follow core's setting; returns whether pinning is allowed."""
    from ....parallel.sequence.ops import pinned_memory_allowed, set_pinned_memory

    allowed = not pinned_memory_disabled()
    if allowed != pinned_memory_allowed():
        log.info("[ShardDiT] pinned memory %s (ComfyUI %s --disable-pinned-memory): the block ring %s",
                 "on" if allowed else "off", "without" if allowed else "started with",
                 "bounces host copies through page-locked RAM" if allowed else "copies from pageable RAM")
    set_pinned_memory(allowed)
    return allowed


def aimdo_on() -> bool:
    """comfy-aimdo's dynamic VRAM is running in this process (core set ``aimdo_enabled``)."""
    try:
        import comfy.memory_management as cmm
    except ImportError:
        return False
    return bool(getattr(cmm, "aimdo_enabled", False))


def _aimdo_bytes(index: int) -> int:
    if not aimdo_on():
        return 0
    try:
        from comfy_aimdo import model_vbar
        return max(0, int(model_vbar.vbars_analyze(index)))
    except (ImportError, AttributeError, RuntimeError, TypeError) as err:  # device not initialised, other API
        log.info("[ShardDiT] comfy-aimdo's reclaimable VRAM on cuda:%d unreadable (%s: %s); counting 0",
                 index, type(err).__name__, err)
        return 0


def _torch_cached_bytes(index: int) -> int:
    """torch's reserved-but-inactive blocks on ``cuda:index`` (0 without a real CUDA device there;
    0 before this process used CUDA at all: nothing is cached then, and no context is made to ask)."""
    import torch

    if not torch.cuda.is_available() or not torch.cuda.is_initialized() or index >= torch.cuda.device_count():
        return 0
    stats = torch.cuda.memory_stats(index)
    return max(0, int(stats.get("reserved_bytes.all.current", 0)) - int(stats.get("active_bytes.all.current", 0)))


def releasable_bytes(device: str) -> int:
    """Bytes ComfyUI's memory manager holds on ``device`` (``cuda:N``) and can give back."""
    if not str(device).startswith("cuda:"):
        return 0
    index = int(str(device).split(":")[1])
    return _aimdo_bytes(index) + _torch_cached_bytes(index)


def with_releasable(inventory):
    """``inventory`` with each GPU's ``releasable_bytes`` (placement's input: free = NVML free + that)."""
    found = {g.device: b for g in inventory.gpus if (b := releasable_bytes(g.device))}
    return inventory.with_releasable_bytes(found) if found else inventory


def compiler_state() -> str:
    """The Comfy Compiler (aimdo malloc graphs) in this process: on, off (why), or not in this ComfyUI."""
    args = _args()
    if args is None or not hasattr(args, "disable_comfy_compiler"):
        return NOT_HERE
    if args.disable_comfy_compiler:
        return "off (--disable-comfy-compiler)"
    return "on (dynamic VRAM on CUDA)" if aimdo_on() else "off (needs dynamic VRAM on a CUDA GPU)"


def cuda_graphs_state() -> str:
    """CUDA graphs over dynamic VRAM's blocks: on, off (why), or not in this ComfyUI."""
    args = _args()
    if args is None or not hasattr(args, "disable_cuda_graphs"):
        return NOT_HERE
    if args.disable_cuda_graphs:
        return "off (--disable-cuda-graphs)"
    if getattr(args, "disable_comfy_compiler", False):
        return "off (the Comfy Compiler is off)"
    return "on (dynamic VRAM on CUDA)" if aimdo_on() else "off (needs dynamic VRAM on a CUDA GPU)"
