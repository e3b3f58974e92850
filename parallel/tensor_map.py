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
- anything else (None, numbers, strings, modules, functions) is returned as it is;
- a container in which ``fn`` changed nothing is returned itself, not a copy, so a caller can test
  ``out is obj`` to learn whether anything changed (the router counts hops that way).

It lives at the top of ``parallel/`` because ``blocks/``, ``sequence/`` and ``distributed/`` all
use it and it depends on nothing of theirs (a leaf: no import of the pack).
"""
from __future__ import annotations

from collections.abc import Callable, Iterator

import torch

__all__ = ["is_namedtuple", "map_tensors", "rebuild", "tensors_in"]


def is_namedtuple(obj) -> bool:
    return isinstance(obj, tuple) and hasattr(obj, "_fields")


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
    else:
        return
    for v in values:
        yield from tensors_in(v, inner, dicts)
