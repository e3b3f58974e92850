"""Run a module's layer list across devices (pure PyTorch): each layer's weights live on its own
device, its inputs are moved there when it is called and its outputs go back to the device the
inputs came from.

Why back and not on to the next layer: code around a layer list (a text encoder's forward)
collects hidden states between layers (LTX-2 reads all 49 of Gemma's; others one layer) and
concatenates them, so it must see them on one device. The cost is two copies of the hidden
states per layer on another device (a prompt's are megabytes: ~1 ms over PCIe); a layer on the
device its inputs come from costs nothing.

``place_layers`` installs the hooks once per layer (re-placing moves weights and updates the
device) and can be called again after something moved the whole module (ComfyUI's loader).
"""
from __future__ import annotations

from collections.abc import Sequence

import torch

from ..tensor_map import map_tensors, tensors_in
from ..errors import InputError

__all__ = ["LAYER_DEVICE_ATTR", "layer_device", "place_layers", "remove_layer_hooks"]

LAYER_DEVICE_ATTR = "_sharddit_layer_device"
_HOOKS_ATTR = "_sharddit_layer_hooks"
_SOURCES_ATTR = "_sharddit_layer_sources"


def layer_device(layer: torch.nn.Module) -> torch.device | None:
    """The device ``place_layers`` gave ``layer`` (None: not placed)."""
    return getattr(layer, LAYER_DEVICE_ATTR, None)


def place_layers(layers: Sequence[torch.nn.Module], devices: Sequence[str | torch.device]) -> None:
    """Move ``layers[i]`` to ``devices[i]`` and route its calls there (hooks installed once)."""
    if len(layers) != len(devices):
        raise InputError(f"{len(layers)} layers but {len(devices)} devices")
    for layer, device in zip(layers, devices):
        device = torch.device(device)
        setattr(layer, LAYER_DEVICE_ATTR, device)
        layer.to(device)
        if getattr(layer, _HOOKS_ATTR, None) is None:
            setattr(layer, _SOURCES_ATTR, [])
            setattr(layer, _HOOKS_ATTR, (layer.register_forward_pre_hook(_to_layer, with_kwargs=True),
                                         layer.register_forward_hook(_back_to_source)))


def remove_layer_hooks(layers: Sequence[torch.nn.Module]) -> None:
    """Undo the routing (the weights stay where they are)."""
    for layer in layers:
        for hook in getattr(layer, _HOOKS_ATTR, None) or ():
            hook.remove()
        for attr in (_HOOKS_ATTR, _SOURCES_ATTR, LAYER_DEVICE_ATTR):
            if hasattr(layer, attr):
                delattr(layer, attr)


def _source_device(args, kwargs) -> torch.device | None:
    for tensor in tensors_in((args, kwargs)):
        return tensor.device
    return None


def _to_layer(layer, args, kwargs):
    device = getattr(layer, LAYER_DEVICE_ATTR)
    source = _source_device(args, kwargs)
    getattr(layer, _SOURCES_ATTR).append(source)
    if source is None or all(t.device == device for t in tensors_in((args, kwargs))):
        return None
    def move(t):
        return t.to(device)

    return map_tensors(move, args), map_tensors(move, kwargs)


def _back_to_source(layer, args, output):
    source = getattr(layer, _SOURCES_ATTR).pop()
    if source is None or source == getattr(layer, LAYER_DEVICE_ATTR):
        return None
    return map_tensors(lambda t: t.to(source), output)
