"""One rank runs one block: which attention call is the block's self-attention, and the block step,
shared by the engine's threads (``local.LocalRanks``) and by worker processes
(``distributed.worker``), so both run the same code (pure).

Inside a block, ComfyUI calls ``optimized_attention`` through
``transformer_options[ATTENTION_OVERRIDE]``. The block's **self-attention** runs as Ulysses attention
over the batch group's ``Exchange`` (pipelined by head chunks where the exchange offers it:
``ulysses``); every other call (cross-attention to the text) runs locally on
the rank's rows. A call is identified by the module that makes it, not by its place in the block:
while a rank runs a block, forward hooks of its own thread (``ModuleWatch``) on the block's
attention modules (its self-attention, and any module carrying ``comfy_attention``) say which of
them is running. (Reading the caller off the stack frames would need ``frame.f_locals``, whose
snapshot keeps every local tensor of that frame alive until it returns: measured +1.5 % peak on
gpu_check's toy, more on blocks that attend from their own ``forward``.)

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
module's ``comfy_attention.function`` (the watched module running the call), else ``func``.
"""
from __future__ import annotations

import functools
import threading

import torch

from ..tensor_map import is_container
from .ulysses import gathered_kv_attention, ulysses_attention
from ..errors import InputTypeError, RunError

__all__ = ["ATTENTION_OVERRIDE", "SELF_ATTENTION_NAMES", "BlockAttention", "ModuleWatch", "run_rank_block",
           "self_attention_module", "with_attention"]


ATTENTION_OVERRIDE = "optimized_attention_override"
"""ComfyUI's ``transformer_options`` key for an attention function that wraps ``optimized_attention``."""

SELF_ATTENTION_NAMES = ("self_attn", "attn1", "self_attention")
"""A block's self-attention submodule as ComfyUI names it (Wan's ``WanAttentionBlock.self_attn``;
LTXV's ``BasicTransformerBlock.attn1``, as core's SD ``BasicTransformerBlock`` names it; Kandinsky 5's
``TransformerDecoderBlock.self_attention``)."""



def self_attention_module(block: torch.nn.Module | None) -> torch.nn.Module | None:
    """``block``'s self-attention submodule by ComfyUI's names; None: the block has none."""
    for name in SELF_ATTENTION_NAMES:
        module = getattr(block, name, None) if block is not None else None
        if isinstance(module, torch.nn.Module):
            return module
    return None


class ModuleWatch:
    """Which of some modules is running on *this* thread, by forward hooks that act only for the
    thread that installed them (other rank threads may run the same module object at once).
    ``current`` is the innermost watched module running now, or None. Hooks are removed on exit."""

    def __init__(self, modules):
        self.modules = [m for m in dict.fromkeys(modules) if isinstance(m, torch.nn.Module)]
        self._thread = threading.get_ident()
        self._stack: list = []
        self._handles: list = []

    @property
    def current(self) -> torch.nn.Module | None:
        return self._stack[-1] if self._stack else None

    def _enter(self, module, *_):
        if threading.get_ident() == self._thread:
            self._stack.append(module)

    def _leave(self, module, *_):
        if threading.get_ident() == self._thread and self._stack and self._stack[-1] is module:
            self._stack.pop()

    def __enter__(self):
        for m in self.modules:
            self._handles.append(m.register_forward_pre_hook(self._enter))
            self._handles.append(m.register_forward_hook(self._leave, always_call=True))
        return self

    def __exit__(self, *exc):
        for h in self._handles:
            h.remove()
        self._handles, self._stack = [], []


def attention_modules(block: torch.nn.Module | None, gather_kv: tuple[str, ...] = ()) -> list:
    """The modules of ``block`` whose attention calls are told apart: its self-attention
    (``self_attention_module``), its ``gather_kv`` submodules (``TokenSpec.gather_kv``) and every
    submodule carrying a preferred attention (``comfy_attention``)."""
    if block is None:
        return []
    found = [self_attention_module(block)] + [getattr(block, n, None) for n in gather_kv]
    found += [m for m in block.modules() if getattr(m, "comfy_attention", None) is not None]
    return [m for m in found if isinstance(m, torch.nn.Module)]


def _taken(args: tuple) -> tuple:
    """``args`` with q, k, v taken out of their containers (each container is left consumed)."""
    held = [is_container(a) for a in args[:3]]
    if not any(held):
        return args
    if len(held) < 3 or not all(held):
        raise InputTypeError(f"sequence mode: q, k and v must be all tensors or all attention tensor "
                             f"containers, got {[type(a).__name__ for a in args[:3]]}")
    return tuple(a.take() for a in args[:3]) + tuple(args[3:])


class BlockAttention:
    """The attention override of one rank: Ulysses for the block's self-attention, the group's
    keys/values of every token, split by heads, for its ``gather_kv`` submodules; local otherwise.

    ``prev``: an override another pack installed before ours (called with ``func`` first, as
    ComfyUI calls an override); None: none."""

    def __init__(self, exchange, rs, main: int, text_first: bool, prev=None, gather_kv: tuple[str, ...] = ()):
        self.exchange, self.rs, self.main, self.text_first, self.prev = exchange, rs, main, text_first, prev
        self.gather_kv = tuple(gather_kv)
        self._gather_modules: tuple = ()
        self.calls = 0
        self._self_module: torch.nn.Module | None = None
        self._by_module = False
        self.watch: ModuleWatch | None = None
        """The running block's ``ModuleWatch`` (``run_rank_block`` sets it); None: no module is told apart."""

    def begin_block(self, block: torch.nn.Module | None = None, watch: ModuleWatch | None = None) -> None:
        """A new block (``block``: the module the rank runs, a streamed copy or the owner's own)."""
        self.calls = 0
        self._self_module = self_attention_module(block)
        self._gather_modules = tuple(getattr(block, n, None) for n in self.gather_kv) if block is not None else ()
        self._by_module = self._self_module is not None and watch is not None
        self.watch = watch

    restart = begin_block

    def __call__(self, func, *args, **kwargs):
        args = _taken(args)
        caller = self.watch.current if self.watch is not None else None
        is_self = self._is_self_attention(caller)
        self.calls += 1
        attend = self._attend(func, caller)
        if len(self.rs.group.ranks) == 1:
            return attend(*args, **kwargs)
        if caller is not None and any(caller is m for m in self._gather_modules):
            return gathered_kv_attention(self.exchange, self.rs, self.main, attend, args, kwargs)
        if not is_self:
            return attend(*args, **kwargs)
        return ulysses_attention(self.exchange, self.rs, self.main, attend, args, kwargs, self.text_first)

    def _is_self_attention(self, caller) -> bool:
        if self._by_module:
            return caller is self._self_module
        return self.calls == 0

    def _attend(self, func, caller):
        """What ComfyUI would call without our override (see the module docstring)."""
        if self.prev is not None:
            return functools.partial(self.prev, func)
        preferred = getattr(getattr(caller, "comfy_attention", None), "function", None)
        return preferred if callable(preferred) else func


def with_attention(options: dict, attention: BlockAttention) -> dict:
    """A copy of ``transformer_options`` whose attention override is ``attention``."""
    return {**options, ATTENTION_OVERRIDE: attention}


def run_rank_block(module: torch.nn.Module, args, kwargs: dict, attentions, stream_names, index: int) -> dict:
    """Call ``module`` (block ``index``) on one rank's arguments; its outputs by stream name."""
    gather = tuple(n for a in attentions for n in a.gather_kv)
    with ModuleWatch(attention_modules(module, gather) if attentions else ()) as watch:
        for attention in attentions:
            attention.begin_block(module, watch)
        out = module(*args, **kwargs)
    outs = out if isinstance(out, (tuple, list)) else (out,)
    if len(outs) != len(stream_names):
        raise RunError(f"block {index} returned {len(outs)} tensors for "
                       f"{len(stream_names)} stream arguments {tuple(stream_names)}")
    return dict(zip(stream_names, outs, strict=True))
