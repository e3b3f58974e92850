"""What every fake forward of one dry run shares (``SimContext``), built once (``build_context``):
ComfyUI's DiT class on ``meta`` in the simulated dtypes, its block layout and weight bytes, the
model's family entry and cost shape, the size, the devices."""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ...parallel.blocks.routing import BlockLayout
from ...parallel.placement.inventory import Inventory
from ...parallel.placement.plan_types import PlacementRequest
from ...parallel.placement.sizing import compute_block_bytes, compute_non_block_bytes
from ..comfy.models.specs import find_arch_spec
from ...parallel.errors import InputError
from ..comfy.models.model_params import fit_params_for
from .presets import ModelSpec

__all__ = ["SimContext", "build_context", "build_meta_model"]


@dataclass(frozen=True)
class SimContext:
    """Everything one simulation shares between its fake forwards."""

    spec: object  # presets.ModelSpec
    dit: torch.nn.Module  # ComfyUI's DiT class, built on meta
    layout: BlockLayout
    block_bytes: tuple[int, ...]  # weight bytes per block, global order
    home_bytes: int  # weight bytes of everything but the blocks
    dtype: str  # "bf16", "fp16", "fp8"
    compute_dtype: torch.dtype
    size: tuple[int, int, int]  # width, height, frames
    inventory: Inventory | None = None  # the setup's
    request: PlacementRequest | None = None
    family: object = None
    """The family's registry entry (``parallel/families.Family``)."""
    shape: object = None
    """The model's cost shape (``parallel/cost/inputs.ModelShape``)."""
    gpus: object = None
    """The GPUs' names and rates in the throughput table (``parallel/cost/inputs.GpuTable``)."""
    arch: object = None
    """The DiT's ``ArchSpec`` (``loaders/comfy/models/specs``), looked up once."""
    sequence: tuple = (None, "")
    """``arch.sequence_specs(dit)``: (token specs for `sequence`, '') or (None, why it runs blocks only)."""
    every_gpu: object = None
    """The devices `sequence` runs on: every GPU of the inventory, listed (``DevicePlan``)."""
    usable: dict = field(default_factory=dict)
    """Per inventory device: the bytes a plan may put there (``Inventory.usable_bytes``); a device
    it lacks (``.get`` gives None): no limit known."""


def build_context(spec, size: tuple, dtype: str, dtypes: tuple, family=None, shape=None, inventory=None,
                  request=None, gpus=None, usable=None, every_gpu=None) -> SimContext:
    """The meta DiT of ``spec`` in ``dtypes`` (weight, compute: ``setup.torch_dtypes``), its layout
    and sizes, at ``size`` (width, height, frames); the rest as given (``setup.SimulationSetup``'s)."""
    weight_dtype, compute_dtype = dtypes
    manual_cast = None if compute_dtype == weight_dtype else compute_dtype
    dit = build_meta_model(spec, weight_dtype, manual_cast).diffusion_model
    arch = find_arch_spec(type(dit).__name__)
    layout, sequence = arch.layout(dit), arch.sequence_specs(dit)
    return SimContext(spec=spec, dit=dit, layout=layout, block_bytes=tuple(compute_block_bytes(dit, layout)),
                      home_bytes=compute_non_block_bytes(dit, layout), dtype=dtype, compute_dtype=compute_dtype,
                      size=tuple(size), inventory=inventory, request=request, family=family, shape=shape,
                      gpus=gpus, arch=arch, sequence=sequence, every_gpu=every_gpu, usable=usable or {})


def build_meta_model(spec: ModelSpec, weight_dtype: torch.dtype, manual_cast_dtype: torch.dtype | None):
    """ComfyUI's own model (``comfy.model_base.BaseModel`` subclass) with weights on ``meta``.

    Mirrors ``comfy.sd.load_diffusion_model_state_dict``: ``set_inference_dtype`` then
    ``get_model``; the ops (plain or manual-cast for fp8) are ComfyUI's own choice. The config is
    fitted to the installed parameter dataclass first (``model_params.fit_params_for``).
    """
    import comfy.model_detection

    unet = fit_params_for(spec.unet_config)  # presets name the fields of every ComfyUI version
    model_config = comfy.model_detection.model_config_from_unet_config(unet, spec.state_dict or None)
    if model_config is None:
        raise InputError(f"ComfyUI has no model class for {spec.name!r} ({spec.unet_config})")
    model_config.set_inference_dtype(weight_dtype, manual_cast_dtype)
    return model_config.get_model(spec.state_dict, "", device=torch.device("meta"))
