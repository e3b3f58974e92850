"""Blocks described by the host and built by the worker from that description (pure).

A worker never receives a module object: the host sends a description (``describe_block``: model
family and configuration, every submodule's class, their plain attributes such as ComfyUI's cast
flags, every tensor's name, dtype and shape) and the worker builds the block on ``meta`` with its
own classes (``build_block``) through the builder registered for that family (``register``: a
describer per block class on the host, a builder per family on the worker). A class, attribute or
tensor that differs is refused naming it: the two sides run different code. A family needing
classes outside the builder's allow-list (GGUF layers, other packs' ops) is built only with
``SHARDDIT_DIST_INSECURE_CLASSES=1`` where the worker runs (``insecure_classes``), logged loudly.
"""
from __future__ import annotations

import logging
import os

import torch

from .protocol import dtype_name, encode_value
from ..errors import InputError

__all__ = ["INSECURE_ENV", "BlockMismatch", "build_block", "describe_block", "insecure_classes", "register"]

log = logging.getLogger("sharddit")
INSECURE_ENV = "SHARDDIT_DIST_INSECURE_CLASSES"
_DESCRIBERS: dict[type, tuple[str, object]] = {}
_BUILDERS: dict[str, object] = {}
_PLAIN = (type(None), bool, int, float, str)


class BlockMismatch(InputError):
    """The worker's block class differs from the host's (another version of ComfyUI or of a model pack)."""


def register(family: str, builder=None, classes: tuple = (), describer=None) -> None:
    """``builder(config) -> module on meta`` for ``family`` (worker side); ``describer(block) ->
    config`` for blocks of ``classes`` (host side)."""
    if builder is not None:
        _BUILDERS[family] = builder
    for cls in classes:
        _DESCRIBERS[cls] = (family, describer)


def insecure_classes() -> bool:
    """Whether the user allowed classes outside the builders' allow-lists on this worker (logged)."""
    on = os.environ.get(INSECURE_ENV, "").strip() == "1"
    if on:
        log.warning("[ShardDiT] %s=1: this worker builds block classes the host names outside the allow-list "
                    "(custom ops, quantized layers); whoever holds the cluster's token can make it import any module",
                    INSECURE_ENV)
    return on


def _class_name(m: torch.nn.Module) -> str:
    return f"{type(m).__module__}:{type(m).__qualname__}"


def _attrs(m: torch.nn.Module) -> list:
    return [[k, v] for k, v in sorted(m.__dict__.items())
            if not k.startswith("_") and k != "training" and isinstance(v, _PLAIN)]


def _layout(block: torch.nn.Module) -> list:
    """Every tensor as [name, dtype, shape]: parameters, then buffers, in module order."""
    return [[n, dtype_name(t.dtype), list(t.shape)] for n, t in [*block.named_parameters(), *block.named_buffers()]]


def describe_block(block: torch.nn.Module, describe=None) -> dict:
    """The description of ``block`` the worker builds it from; ``describe(block) -> (family,
    config)`` or the describer registered for its class. ValueError when there is none."""
    if describe is not None:
        family, config = describe(block)
    else:
        hit = next(((f, d) for cls, (f, d) in _DESCRIBERS.items() if type(block) is cls), None)
        if hit is None:
            raise InputError(f"block class {_class_name(block)} has no worker description: it cannot "
                             "run on workers (register its family in parallel.distributed.block_specs)")
        family, config = hit[0], hit[1](block)
    tensors: list = []
    encode_value(config, tensors)
    if tensors:
        raise InputError(f"the {family} description of a block holds tensors; configs are plain values")
    return {"family": family, "config": config,
            "modules": [[n, _class_name(m), _attrs(m)] for n, m in block.named_modules()], "tensors": _layout(block)}


def build_block(desc: dict) -> torch.nn.Module:
    """The block a description names, built here on ``meta`` by its family's builder, its module
    classes and tensor layout checked against the host's (BlockMismatch naming the first difference)."""
    if not (isinstance(desc, dict) and set(desc) == {"family", "config", "modules", "tensors"}):
        raise BlockMismatch("a block description of another ShardDiT version: update both sides")
    family = desc["family"]
    builder = _BUILDERS.get(family)
    if builder is None:
        raise BlockMismatch(f"this worker cannot build {str(family)[:40]!r} blocks (known: "
                            f"{', '.join(sorted(_BUILDERS)) or 'none'}): start it with `python <pack-dir> worker` "
                            "from the same ShardDiT version and ComfyUI as the host")
    with torch.device("meta"):
        block = builder(desc["config"])
    _check(block, desc)
    return block.eval()


def _check(block: torch.nn.Module, desc: dict) -> None:
    mods = dict(block.named_modules())
    for entry in desc["modules"]:
        name, cls, attrs = entry
        m = mods.get(name)
        if m is None or _class_name(m) != cls:
            here = "missing" if m is None else _class_name(m)
            raise BlockMismatch(f"block submodule {name!r} is {cls} on the host, {here} on this worker: "
                                "install the same ComfyUI (and model packs) on both")
        for k, v in attrs:
            on_class = getattr(type(m), k, None)
            if isinstance(k, str) and not k.startswith("_") and isinstance(v, _PLAIN) and not callable(on_class) \
                    and not isinstance(on_class, property):
                setattr(m, k, v)
    if len(mods) != len(desc["modules"]):
        raise BlockMismatch(f"the block has {len(mods)} submodules on this worker, "
                            f"{len(desc['modules'])} on the host: install the same ComfyUI on both")
    here = _layout(block)
    for a, b in zip(desc["tensors"], here):
        if list(a) != b:
            raise BlockMismatch(f"block tensor {a[0]!r} is {a[1]} {a[2]} on the host, {b[0]!r} {b[1]} "
                                f"{b[2]} on this worker: install the same ComfyUI version on both")
    if len(here) != len(desc["tensors"]):
        raise BlockMismatch(f"the block has {len(here)} tensors on this worker, {len(desc['tensors'])} on "
                            "the host: install the same ComfyUI version on both")
