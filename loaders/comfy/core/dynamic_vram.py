"""ShardDiT's patchers under ComfyUI's dynamic VRAM (core 0.16+): plain, non-dynamic patchers.

Since core 0.16, ``main.py`` sets ``comfy.model_patcher.CoreModelPatcher = ModelPatcherDynamic`` on
NVIDIA (and on ROCm >= 7.14 in 0.3x, or with ``--enable-dynamic-vram``): core's loaders then return a
patcher whose weights stay in (pinned) host memory and stream, per op, into one comfy-aimdo virtual
range ("vbar") per load device, kept on the BaseModel (``dynamic_vbars``/``dynamic_pins``).

Decision: the sharded MODEL (its main patcher and every shard) is built of *non-dynamic* patchers,
over the very same modules and weights (no reload, no second copy in RAM). Why not a
``ModelPatcherDynamic`` per GPU:

- ShardDiT plans each GPU's memory itself (the plan's blocks resident on their GPU, ``sequence`` mode
  streaming resident blocks from their owner GPU); dynamic VRAM would make residency lazy and
  per-op, which neither the plan nor the block streaming can see.
- A dynamic patcher binds each module to one vbar allocation (``module._v``, a bump allocation in
  the BaseModel's vbar for one device, never freed): blocks regrouped into per-GPU shard roots, or a
  main whose size is only the non-block part creating the vbar for the whole model, would clash with
  core's own dynamic clone of the same weights (core's sampler on the unsharded MODEL).
- Core does the same where it needs a patcher it controls: ``TorchCompileModel`` uses
  ``clone(disable_dynamic=True)``, ``Select*Device`` to cpu and hooked conds
  ``get_non_dynamic_delegate()``. Those reload the file from ``cached_patcher_init`` (a second read
  and a second copy of the weights in RAM); ShardDiT passes ``model_override`` with the patcher's
  own model instead, so the weights are read from disk once and host RAM holds one copy.

The text encoder and the VAE stay dynamic (core's loaders): ``load_models_gpu`` sees the shards as
ordinary loaded models on their devices (``loaded_size``), and free memory is read from CUDA.
Feature-detected (``is_dynamic``), never from a version string: ComfyUI 0.3.64 has no dynamic VRAM.
"""
from __future__ import annotations

import inspect
import logging

import comfy.model_patcher
from ....parallel.errors import RunError

log = logging.getLogger("sharddit")

__all__ = ["is_dynamic", "non_dynamic_clone", "new_shard_patcher"]


def is_dynamic(patcher) -> bool:
    """Whether ``patcher`` is a dynamic-VRAM patcher (False on cores without dynamic VRAM)."""
    check = getattr(patcher, "is_dynamic", None)
    return bool(check()) if callable(check) else False


def non_dynamic_clone(patcher):
    """A non-dynamic clone of ``patcher`` sharing its model, weights and backups (``clone()`` when
    ``patcher`` is not dynamic). Goes through ``patcher.clone`` so a pack's own patcher (e.g. a
    dynamic GGUF patcher) picks its own non-dynamic class."""
    if not is_dynamic(patcher):
        return patcher.clone()
    params = inspect.signature(patcher.clone).parameters
    if "disable_dynamic" not in params or "model_override" not in params:
        raise RunError(f"this ComfyUI's {type(patcher).__name__}.clone() takes neither disable_dynamic "
                       "nor model_override, so ShardDiT cannot shard a dynamic-VRAM MODEL: start ComfyUI with "
                       "--disable-dynamic-vram and report the ComfyUI version")
    clone = patcher.clone(disable_dynamic=True, model_override=patcher.get_clone_model_override())
    assert not is_dynamic(clone) and clone.model is patcher.model, "non-dynamic clone must share the weights"
    return clone


def new_shard_patcher(main, root, load_device, offload_device):
    """A shard patcher of ``main``'s own (non-dynamic) class, built by its constructor, with
    ``main``'s plain settings copied over (ComfyUI-GGUF's ``GGUFModelPatcher`` patches quantized
    weights at forward time: a plain ModelPatcher would add LoRA deltas to raw Q8_0 bytes)."""
    assert not is_dynamic(main), "shards are built from the non-dynamic main (see module docstring)"
    cls = type(main)
    if not issubclass(cls, comfy.model_patcher.ModelPatcher):
        cls = comfy.model_patcher.ModelPatcher
    patcher = cls(root, load_device=load_device, offload_device=offload_device)
    assert not is_dynamic(patcher), f"{cls.__name__} built a dynamic patcher for a shard"
    for name, value in vars(main).items():
        if name not in vars(patcher) and isinstance(value, (bool, int, float, str, type(None))):
            setattr(patcher, name, value)
    return patcher
