"""Clones of ModelPatcher subclasses whose ``__init__`` lacks a keyword core's ``clone()`` passes.

Newer cores (read in 0.38.1) give ``ModelPatcher.__init__`` a ``fast_disk`` keyword and
``clone()`` builds the copy as ``self.__class__(model, ..., weight_inplace_update=..., fast_disk=...)``.
A pack's subclass that defines its own ``__init__`` without that keyword (and without ``**kwargs``)
then cannot be cloned at all: ``TypeError: __init__() got an unexpected keyword argument``, and
sharding clones the incoming MODEL several times.

Detected from the signatures (never a version string): the keywords some base class's ``__init__``
takes that the subclass's own ``__init__`` does not. Such a MODEL is cloned once through a subclass
of its class made here, whose ``__init__`` takes those keywords, hands the rest to the pack's
``__init__`` and stores each as core's does (``self.fast_disk``); the clone keeps that class, so
every later clone (ShardDiT's, a LoRA loader's after the Shard node) works. The incoming MODEL's
class is swapped only for the one ``clone()`` call and always put back (as ComfyUI-GGUF's own clone
does), so the MODEL given to the node is unchanged afterwards.
"""
from __future__ import annotations

import functools
import inspect
import logging
from ....parallel.errors import InputError

__all__ = ["clonable", "missing_init_keywords"]

log = logging.getLogger("sharddit")


def _keywords(init) -> set[str] | None:
    """Keyword names ``init`` takes; None when it takes ``**kwargs`` (any keyword) or cannot be read."""
    try:
        params = inspect.signature(init).parameters.values()
    except (TypeError, ValueError):
        return None
    if any(p.kind is p.VAR_KEYWORD for p in params):
        return None
    return {p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}


def missing_init_keywords(cls: type) -> tuple[str, ...]:
    """Keywords a base class's ``__init__`` takes that ``cls.__init__`` does not (sorted; () when none)."""
    own = _keywords(cls.__init__)
    if own is None:
        return ()
    missing: set[str] = set()
    for base in cls.__mro__[1:]:
        if base is object or "__init__" not in vars(base):
            continue
        missing |= (_keywords(vars(base)["__init__"]) or set()) - own
    return tuple(sorted(missing))


@functools.cache
def _taking(cls: type, keywords: tuple[str, ...]) -> type:
    """A subclass of ``cls`` whose ``__init__`` also takes ``keywords`` (same name and module)."""
    def __init__(self, *args, **kwargs):
        given = {k: kwargs.pop(k) for k in keywords if k in kwargs}
        cls.__init__(self, *args, **kwargs)
        for name, value in given.items():
            setattr(self, name, value)  # as core's __init__ keeps them (``self.fast_disk = fast_disk``)

    return type(cls.__name__, (cls,), {"__init__": __init__, "__module__": cls.__module__,
                                       "__qualname__": cls.__qualname__, "sharddit_takes": keywords})


def clonable(model):
    """``model`` when core's ``clone()`` can clone it; else one clone of it whose class takes every
    keyword core's clone passes (see the module docstring). ValueError naming the class when even
    that fails (a subclass whose own ``clone()`` rebuilds it with its original class)."""
    cls = type(model)
    missing = missing_init_keywords(cls)
    if not missing:
        return model
    model.__class__ = _taking(cls, missing)
    try:
        clone = model.clone()
    except TypeError as err:
        if not any(k in str(err) for k in missing):
            raise
        raise InputError(f"the MODEL's patcher {cls.__module__}.{cls.__qualname__} cannot be cloned by "
                         f"this ComfyUI: its __init__ does not take {', '.join(missing)}, which core's clone() passes "
                         f"({err}). Update the custom node pack that made it (its loader).") from None
    finally:
        model.__class__ = cls
    log.info("[ShardDiT] %s.__init__ lacks %s (core's clone() passes it): cloned through a subclass that takes it",
             cls.__qualname__, ", ".join(missing))
    return clone
