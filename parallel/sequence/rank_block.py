"""One rank runs one block: which attention call is the block's self-attention, and the block step,
shared by the engine's threads (``local.LocalRanks``) and by worker processes
(``distributed.worker``), so both run the same code (pure).

Inside a block, ComfyUI calls ``optimized_attention`` through
``transformer_options[ATTENTION_OVERRIDE]``. The block's **self-attention** runs as Ulysses attention
over the batch group's ``Exchange``; every other call (cross-attention to the text) runs locally on
the rank's rows. A call is identified by the module that makes it (``calling_module``: the
innermost ``nn.Module`` whose method is on the call stack), not by its place in the block:

- a block with a submodule ComfyUI names as its self-attention (``SELF_ATTENTION_NAMES``: Wan's
  ``self_attn``, LTXV's ``attn1``): the calls that module makes. Core's LTXV STG
  (``LTXVSpatioTemporalGuidance``; ``stg_skip_self_attn`` in the block's ``transformer_options``)
  makes a perturbed block's ``attn1`` pass its values through without calling attention: that
  block's only call is its cross-attention, which stays local;
- a block without one (HunyuanVideo's double and single blocks attend from their own ``forward``,
  once per block): the block's first call.

**Containers** (ComfyUI 0.33+): models may pass q, k, v in ``AttentionTensorContainer``s
(single-owner holders: ``peek()``, ``take()``). Core unwraps them for an override that has no
``container_function``; ``BlockAttention`` has none (Ulysses needs the tensors themselves) and
takes them itself when it is handed containers all the same.

**Preferred attention** (ComfyUI 0.35+): a module may carry ``comfy_attention`` (a checkpoint's
preferred attention, e.g. comfy-kitchen's int8), passed as ``preferred_attention=`` and dropped by
core once an override is installed, as ours always is in `sequence`. ``BlockAttention`` calls what
core would have called without it: another pack's override if one was installed, else the calling
module's ``comfy_attention.function``, else ``func``. When the calling module cannot be found it
says once that the preferred attention is not used.
"""
from __future__ import annotations

import functools
import logging
import sys

import torch

from .ulysses import ulysses_attention

__all__ = ["ATTENTION_OVERRIDE", "SELF_ATTENTION_NAMES", "BlockAttention", "calling_module", "run_rank_block",
           "self_attention_module", "with_attention"]

log = logging.getLogger("sharddit")

ATTENTION_OVERRIDE = "optimized_attention_override"
"""ComfyUI's ``transformer_options`` key for an attention function that wraps ``optimized_attention``."""

SELF_ATTENTION_NAMES = ("self_attn", "attn1", "self_attention")
"""A block's self-attention submodule as ComfyUI names it (Wan's ``WanAttentionBlock.self_attn``;
LTXV's ``BasicTransformerBlock.attn1``, as core's SD ``BasicTransformerBlock`` names it; Kandinsky 5's
``TransformerDecoderBlock.self_attention``)."""

_STACK_DEPTH = 16
_warned: set[str] = set()


def self_attention_module(block: torch.nn.Module | None) -> torch.nn.Module | None:
    """``block``'s self-attention submodule by ComfyUI's names; None: the block has none."""
    for name in SELF_ATTENTION_NAMES:
        module = getattr(block, name, None) if block is not None else None
        if isinstance(module, torch.nn.Module):
            return module
    return None


def calling_module(skip: int = 1, depth: int = _STACK_DEPTH) -> torch.nn.Module | None:
    """The innermost ``nn.Module`` whose method is on the stack above the caller (``skip`` frames
    up), within ``depth`` frames; None when there is none."""
    frame = sys._getframe(skip + 1)
    for _ in range(depth):
        if frame is None:
            return None
        code = frame.f_code
        if code.co_argcount and code.co_varnames[0] == "self":
            owner = frame.f_locals.get("self")
            if isinstance(owner, torch.nn.Module):
                return owner
        frame = frame.f_back
    return None


def _warn_once(key: str, message: str) -> None:
    if key not in _warned:
        _warned.add(key)
        log.warning(message)


def _is_container(x) -> bool:
    return not isinstance(x, torch.Tensor) and callable(getattr(x, "take", None))


def _taken(args: tuple) -> tuple:
    """``args`` with q, k, v taken out of their containers (each container is left consumed)."""
    held = [_is_container(a) for a in args[:3]]
    if not any(held):
        return args
    if len(held) < 3 or not all(held):
        raise TypeError(f"[ShardDiT] sequence mode: q, k and v must be all tensors or all attention tensor "
                        f"containers, got {[type(a).__name__ for a in args[:3]]}")
    return tuple(a.take() for a in args[:3]) + tuple(args[3:])


class BlockAttention:
    """The attention override of one rank: Ulysses for the block's self-attention, local otherwise.

    ``prev``: an override another pack installed before ours (called with ``func`` first, as
    ComfyUI calls an override); None: none."""

    def __init__(self, exchange, rs, main: int, text_first: bool, prev=None):
        self.exchange, self.rs, self.main, self.text_first, self.prev = exchange, rs, main, text_first, prev
        self.calls = 0
        self._self_module: torch.nn.Module | None = None
        self._by_module = False

    def begin_block(self, block: torch.nn.Module | None = None) -> None:
        """A new block (``block``: the module the rank runs, a streamed copy or the owner's own)."""
        self.calls = 0
        self._self_module = self_attention_module(block)
        self._by_module = self._self_module is not None

    restart = begin_block

    def __call__(self, func, *args, **kwargs):
        args = _taken(args)
        caller = calling_module()
        is_self = self._is_self_attention(caller)
        self.calls += 1
        attend = self._attend(func, caller)
        if not is_self or len(self.rs.group.ranks) == 1:
            return attend(*args, **kwargs)
        return ulysses_attention(self.exchange, self.rs, self.main, attend, args, kwargs, self.text_first)

    def _is_self_attention(self, caller) -> bool:
        if self._by_module and caller is not None:
            return caller is self._self_module
        if self._by_module:
            _warn_once("caller", "[ShardDiT] sequence mode: the module making an attention call could not be "
                                 "found; the block's first call is taken as its self-attention")
        return self.calls == 0

    def _attend(self, func, caller):
        """What ComfyUI would call without our override (see the module docstring)."""
        if self.prev is not None:
            return functools.partial(self.prev, func)
        preferred = getattr(getattr(caller, "comfy_attention", None), "function", None)
        if callable(preferred):
            return preferred
        if caller is None:
            _warn_once("preferred", "[ShardDiT] sequence mode: the calling module of an attention call could not "
                                    "be found, so a checkpoint's preferred attention (comfy_attention) is not "
                                    "used; ComfyUI's optimized attention runs instead")
        return func


def with_attention(options: dict, attention: BlockAttention) -> dict:
    """A copy of ``transformer_options`` whose attention override is ``attention``."""
    return {**options, ATTENTION_OVERRIDE: attention}


def run_rank_block(module: torch.nn.Module, args, kwargs: dict, attentions, stream_names, index: int) -> dict:
    """Call ``module`` (block ``index``) on one rank's arguments; its outputs by stream name."""
    for attention in attentions:
        attention.begin_block(module)
    out = module(*args, **kwargs)
    outs = out if isinstance(out, (tuple, list)) else (out,)
    if len(outs) != len(stream_names):
        raise RuntimeError(f"[ShardDiT] block {index} returned {len(outs)} tensors for "
                           f"{len(stream_names)} stream arguments {tuple(stream_names)}")
    return dict(zip(stream_names, outs, strict=True))
