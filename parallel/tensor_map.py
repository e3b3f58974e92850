"""One map over the tensors inside nested block arguments (pure PyTorch).

Block arguments arrive as tensors or as containers of them: Wan's ``freqs`` tensor, LTXV's
``pe = (cos, sin)``, ``transformer_options`` (a dict holding tensors), a namedtuple from another
pack. Routing, splitting, exchanging and sending them all walk that nesting the same way, so the
walk is written once here: ``map_tensors`` (a new structure with ``fn`` applied to every tensor),
``tensors_in`` (the tensors, in order) and ``rebuild`` (a container of the same type from new
items: list, tuple, namedtuple).

Rules every caller relies on:

- containers are ``dict``, ``list`` and ``tuple`` (namedtuples included, rebuilt with their
  fields); ``dicts=False`` leaves dicts alone as leaves;
- ``depth`` counts container levels entered (0: only a bare tensor is mapped; None: no limit);
- a plain data object with ``__slots__`` and no ``__dict__`` (LTX-2's ``CompressedTimestep``: a
  tensor plus its shape numbers) is a container of its slots: a shallow copy carries the mapped
  values (``slot_objects``);
- anything else (None, numbers, strings, modules, functions) is returned as it is;
- a container in which ``fn`` changed nothing is returned itself, not a copy, so a caller can test
  ``out is obj`` to learn whether anything changed (the router counts hops that way).

It lives at the top of ``parallel/`` because ``blocks/``, ``sequence/`` and ``distributed/`` all
use it and it depends on nothing of theirs (a leaf: no import of the pack).
"""
from __future__ import annotations

import copy
from collections.abc import Callable, Iterator

import torch

__all__ = ["is_container", "is_namedtuple", "map_tensors", "rebuild", "slot_values", "taken", "tensors_in"]


def is_container(x) -> bool:
    """An attention input held in ComfyUI's single-owner container (0.33+: ``take()`` hands the
    tensor over), not a tensor itself."""
    return not isinstance(x, torch.Tensor) and callable(getattr(x, "take", None))


def taken(x):
    """The tensor of an attention input: itself, or what its container hands over (consumed)."""
    return x.take() if is_container(x) else x


def is_namedtuple(obj) -> bool:
    return isinstance(obj, tuple) and hasattr(obj, "_fields")


def slot_values(obj) -> dict | None:
    """``{slot: value}`` of a plain slotted data object (no ``__dict__``, not a tensor or module),
    else None. Unset slots are left out."""
    if hasattr(obj, "__dict__") or isinstance(obj, (torch.Tensor, torch.nn.Module, tuple)):
        return None
    names = [n for c in type(obj).__mro__ for n in getattr(c, "__slots__", ()) if n != "__weakref__"]
    if not names:
        return None
    return {n: getattr(obj, n) for n in names if hasattr(obj, n)}


def rebuild(template, items):
    """A container of ``template``'s type (list, tuple, namedtuple) holding ``items``."""
    if is_namedtuple(template):
        return type(template)(*items)
    return type(template)(items)


def map_tensors(fn: Callable[[torch.Tensor], object], obj, depth: int | None = None, dicts: bool = True):
    """``obj`` with ``fn(t)`` in place of every tensor ``t`` (see the module docstring)."""
    if isinstance(obj, torch.Tensor):
        return fn(obj)
    if depth is not None and depth <= 0:
        return obj
    inner = None if depth is None else depth - 1
    if dicts and isinstance(obj, dict):
        new = None
        for k, v in obj.items():
            r = map_tensors(fn, v, inner, dicts)
            if r is not v:
                new = dict(obj) if new is None else new
                new[k] = r
        return obj if new is None else new
    if isinstance(obj, (list, tuple)):
        items = [map_tensors(fn, v, inner, dicts) for v in obj]
        if all(a is b for a, b in zip(items, obj, strict=True)):
            return obj
        return rebuild(obj, items)
    slots = slot_values(obj)
    if slots:
        changed = {k: r for k, v in slots.items() if (r := map_tensors(fn, v, inner, dicts)) is not v}
        if not changed:
            return obj
        new = copy.copy(obj)
        for k, v in changed.items():
            setattr(new, k, v)
        return new
    return obj


def tensors_in(obj, depth: int | None = None, dicts: bool = True) -> Iterator[torch.Tensor]:
    """Every tensor inside ``obj``, depth first, in container order."""
    if isinstance(obj, torch.Tensor):
        yield obj
        return
    if depth is not None and depth <= 0:
        return
    inner = None if depth is None else depth - 1
    if dicts and isinstance(obj, dict):
        values = obj.values()
    elif isinstance(obj, (list, tuple)):
        values = obj
    elif slot_values(obj):
        values = slot_values(obj).values()
    else:
        return
    for v in values:
        yield from tensors_in(v, inner, dicts)
