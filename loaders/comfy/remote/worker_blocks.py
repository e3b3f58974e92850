"""ComfyUI's own blocks on workers, built from the model config (no module crosses the wire).

The host describes a block of its diffusion model as ``{"module", "class", "unet_config", "ops",
"path"}`` (``describer``): the model class, ComfyUI's config of it (``model_config.unet_config``,
with its weight dtype), the ComfyUI operations its layers use, and the block's path in it
(``blocks.3``). The worker (``register``, called by ``python <pack-dir> worker``) builds the whole
model on ``meta`` with its own ComfyUI -- as ``plan`` builds models for its simulation -- and
takes that block; ``parallel.distributed.block_specs`` then checks every class and tensor against
the host's. Only model classes under ``comfy.ldm.`` and ComfyUI's plain operations
(``OPS_ALLOWED``) are built; other operations (GGUF's quantized layers, another pack's custom ops)
only with ``SHARDDIT_DIST_INSECURE_CLASSES=1`` on the worker.
"""
from __future__ import annotations

import copy
import importlib
import json
import logging

import torch

from ....parallel.distributed.block_specs import (
    INSECURE_ENV,
    BlockMismatch,
    insecure_classes,
    register,
)
from ....parallel.distributed.protocol import encode_value
from ..models.model_params import fit_params

__all__ = ["OPS_ALLOWED", "describer", "register_comfy"]

log = logging.getLogger("sharddit")
FAMILY = "comfy"
OPS_ALLOWED = ("disable_weight_init", "manual_cast", "fp8_ops")
"""ComfyUI's own operation sets (``comfy.ops``) a worker builds without the insecure opt-in."""
_MODELS: dict[str, torch.nn.Module] = {}
_KEEP = 2


def _ops_of(dit: torch.nn.Module) -> str:
    """``module:Outer`` of the operation set the model's layers come from (``comfy.ops:manual_cast``)."""
    for m in dit.modules():
        outer, dot, _ = type(m).__qualname__.rpartition(".")
        if dot and not type(m).__module__.startswith("torch."):
            return f"{type(m).__module__}:{outer}"
    return "comfy.ops:disable_weight_init"


def describer(dit: torch.nn.Module, unet_config: dict, paths: dict[int, str]):
    """``describe(index, block) -> (family, config)`` for ``distributed/ranks`` (``paths``: block index ->
    its path in ``dit``, ``blocks.3``)."""
    base = {"module": type(dit).__module__, "class": type(dit).__name__, "ops": _ops_of(dit),
            "unet_config": {k: v for k, v in unet_config.items() if not k.startswith("_") and _plain(k, v)}}

    def describe(index: int, block) -> tuple[str, dict]:
        return FAMILY, {**base, "path": paths[index]}

    return describe


def _plain(key: str, value) -> bool:
    """Whether a config value can be sent (numbers, strings, dtypes, lists...); others are left out
    (logged): the worker's layout check names any block they would have changed."""
    try:
        tensors: list = []
        encode_value(value, tensors)
        if not tensors:
            return True
    except TypeError:
        pass
    log.debug("[ShardDiT] unet_config[%r] (%s) is not sent to workers", key, type(value).__name__)
    return False


def _ops(name: str):
    module, _, outer = str(name).partition(":")
    if module == "comfy.ops" and outer in OPS_ALLOWED:
        return getattr(importlib.import_module(module), outer)
    if "<" in outer or not outer:
        raise BlockMismatch(f"the host's layers come from {name!r}, which a worker cannot build")
    if not insecure_classes():
        raise BlockMismatch(f"the host's model uses operations {name!r} (not ComfyUI's own: a quantized "
                            f"or custom format); workers build only {', '.join(OPS_ALLOWED)} unless {INSECURE_ENV}=1 "
                            "is set where the worker runs (then the host decides which module this worker imports)")
    obj = importlib.import_module(module)
    for part in outer.split("."):
        obj = getattr(obj, part)
    return obj


def _model(config: dict) -> torch.nn.Module:
    key = json.dumps({k: repr(v) for k, v in sorted(config.items()) if k != "path"})
    dit = _MODELS.get(key)
    if dit is not None:
        return dit
    module, name = str(config["module"]), str(config["class"])
    if not module.startswith("comfy.ldm."):
        raise BlockMismatch(f"the host's model class {module}.{name} is not one of ComfyUI's (comfy.ldm): "
                            "workers build ComfyUI's own models only")
    cls = getattr(importlib.import_module(module), name, None)
    if not (isinstance(cls, type) and issubclass(cls, torch.nn.Module)):
        raise BlockMismatch(f"this worker's ComfyUI has no model class {module}.{name}: install the same "
                            "ComfyUI version as the host")
    params = fit_params(cls, dict(config["unet_config"]))
    with torch.device("meta"):
        dit = cls(**params, device=torch.device("meta"), operations=_ops(config["ops"]))
    while len(_MODELS) >= _KEEP:
        _MODELS.pop(next(iter(_MODELS)))
    _MODELS[key] = dit
    return dit


def _build(config: dict) -> torch.nn.Module:
    dit = _model(config)
    try:
        block = dit.get_submodule(str(config["path"]))
    except AttributeError:
        raise BlockMismatch(f"this worker's {type(dit).__name__} has no block {config['path']!r}: install "
                            "the same ComfyUI version as the host") from None
    return copy.deepcopy(block)


def register_comfy() -> None:
    """Let this worker process build ComfyUI's blocks (``python <pack-dir> worker`` calls it)."""
    register(FAMILY, _build)
