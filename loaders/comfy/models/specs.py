"""Architecture specs: where a ComfyUI DiT keeps its blocks and which block arguments travel.

The specs are the ``ArchSpec`` groups of every family's ComfyUI entry (``comfy_families.py``, which
says what inter-block code each group runs); the block lists, stream arguments and `sequence`
token axes come from the family's pure entry (``parallel/families.py``). The stream arguments are
the block-to-block hidden state(s); every other tensor argument is routed as a per-forward
constant by the engine (``parallel/blocks/routing.py``).

`sequence` on HunyuanVideo needs the side its text tokens are on (after the image tokens before
ComfyUI 0.14, before them since): ``token_order`` reads it off the model (``token_order.py``);
``sequence_specs`` refuses `sequence` when it cannot.
"""
from __future__ import annotations

import torch

from ....parallel.blocks.routing import BlockLayout
from .comfy_families import COMFY_FAMILIES, ArchSpec, no_inter_block_code
from ....parallel.errors import InputError

__all__ = ["SPECS", "find_arch_spec", "get_arch_spec", "supported_architectures", "unshardable_reason"]

SPECS: tuple[ArchSpec, ...] = tuple(spec for fam in COMFY_FAMILIES.values() for spec in fam.specs)


def supported_architectures() -> list[str]:
    """``"Family (Class, ...)"`` for every spec."""
    return [f"{s.name} ({', '.join(s.class_names)})" for s in SPECS]


def find_arch_spec(class_name: str) -> ArchSpec:
    """The spec covering ComfyUI class ``class_name``; unknown names raise ``ValueError``."""
    for spec in SPECS:
        if class_name in spec.class_names:
            return spec
    for fam in COMFY_FAMILIES.values():
        if class_name in fam.refused:
            raise InputError(f"cannot shard diffusion model class {class_name!r}: {fam.refused[class_name]}")
    raise InputError(
        f"cannot shard diffusion model class {class_name!r}: supported architectures are "
        f"{'; '.join(supported_architectures())}. Use ComfyUI's core nodes for this model, or open "
        "an issue at https://github.com/sharddit/sharddit/issues with the model's name.")


def unshardable_reason(class_name: str) -> str | None:
    """Why ComfyUI class ``class_name`` cannot be sharded (``find_arch_spec``'s message), None when it can."""
    try:
        find_arch_spec(class_name)
    except ValueError as err:
        return str(err)
    return None


def get_arch_spec(diffusion_model: torch.nn.Module | str) -> BlockLayout:
    """The ``BlockLayout`` of a ComfyUI diffusion model (``model.diffusion_model``).

    A class name works too for families without instance-dependent inter-block code; VACE, S2V
    and Animate read their inter-block layers off the model and need the instance.
    """
    if isinstance(diffusion_model, str):
        spec = find_arch_spec(diffusion_model)
        if spec.home_after is not no_inter_block_code:
            raise InputError(f"the {spec.name} layout depends on the model's configuration: "
                             f"pass the {diffusion_model} instance (model.diffusion_model), not its class name")
        return spec.layout(None)
    return find_arch_spec(type(diffusion_model).__name__).layout(diffusion_model)
