"""Constructor arguments that fit the installed ComfyUI's model parameter dataclass.

ComfyUI's MMDiT classes take their configuration as ``**kwargs`` and pass it to a parameter
dataclass (``HunyuanVideo`` -> ``HunyuanVideoParams``, ``Flux`` -> ``FluxParams``). Those gain
required fields between ComfyUI versions (0.29.0: HunyuanVideo ``use_cond_type_embedding``,
``vision_in_dim``, ``meanflow_sum``; Flux ``txt_ids_dims``), so one config dict cannot build the
same model on every version. ``fit_params`` reads the installed dataclass (``dataclasses.fields``):
keys it does not have are dropped, new required fields get the value that means "the model as
it was before the field existed" (what ComfyUI's own detection gives a checkpoint without the new
weights), and any other missing required field is an error that names it.
"""
from __future__ import annotations

import copy
import dataclasses
import importlib
import inspect
import logging
import sys

from .comfy_families import COMFY_FAMILIES, family_of_image_model
from ....parallel.errors import InputError

__all__ = ["NEW_FIELD_DEFAULTS", "fit_params", "fit_params_for", "params_dataclass"]

log = logging.getLogger("sharddit")

NEW_FIELD_DEFAULTS = {
    "use_cond_type_embedding": False,  # HunyuanVideo 1.5 only (no cond_type_embedding weights)
    "vision_in_dim": None,             # HunyuanVideo 1.5 i2v only (no vision_in weights)
    "meanflow_sum": False,             # set together with vision_in by ComfyUI's detection
    "txt_ids_dims": [],                # Flux 1: text position ids stay zero (Flux 2 sets [3])
}
"""Required fields newer ComfyUI added to a parameter dataclass -> their "as before" value."""

def params_dataclass(model_cls: type) -> type | None:
    """The ``<Class>Params`` dataclass beside ``model_cls`` (or a base class), None if there is none."""
    for cls in model_cls.__mro__:
        module = sys.modules.get(cls.__module__)
        dc = getattr(module, f"{cls.__name__}Params", None)
        if dc is not None and dataclasses.is_dataclass(dc):
            return dc
    return None


def fit_params(model_cls: type, config: dict) -> dict:
    """``config`` cut to what ``model_cls(**config)`` accepts on this ComfyUI (see the module docstring)."""
    dc = params_dataclass(model_cls)
    if dc is None:
        return dict(config)
    fields = {f.name: f for f in dataclasses.fields(dc)}
    named = {n for n, p in inspect.signature(model_cls.__init__).parameters.items() if p.kind is not p.VAR_KEYWORD}
    out = {k: v for k, v in config.items() if k in fields or k in named}
    dropped = sorted(set(config) - set(out))
    if dropped:
        log.debug("[ShardDiT] %s on this ComfyUI has no parameters %s: left out", model_cls.__name__, dropped)
    for name, f in fields.items():
        if name in out or f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING:
            continue
        if name not in NEW_FIELD_DEFAULTS:
            raise InputError(f"{model_cls.__name__} on this ComfyUI needs the parameter {name!r}, "
                             f"which the config {sorted(config)} lacks and ShardDiT has no default for: "
                             "plan from the model file instead of a preset, or update ShardDiT")
        out[name] = copy.deepcopy(NEW_FIELD_DEFAULTS[name])
    return out


def fit_params_for(unet_config: dict) -> dict:
    """``unet_config`` fitted to its model class's dataclass (the family's ``params_class``, found by
    ``image_model``), else unchanged."""
    family = family_of_image_model(unet_config.get("image_model"))
    path = COMFY_FAMILIES[family].params_class if family in COMFY_FAMILIES else None
    if path is None:
        return dict(unet_config)
    module, _, name = path.rpartition(".")
    return fit_params(getattr(importlib.import_module(module), name), unet_config)
