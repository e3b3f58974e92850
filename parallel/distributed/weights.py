"""Block weights as bytes, for ranks in other processes (distributed `sequence` mode; pure PyTorch).

A block crosses in two parts: its *description* (``block_specs``), sent once per session, from
which the worker builds the *skeleton* (every tensor on ``meta``) with its own classes -- no module
is ever pickled; and its *weights*, one flat byte tensor (``pack_block``: every tensor's raw bytes
at an aligned offset, ``WeightLayout``). ComfyUI's on-the-fly patches (``weight_function`` /
``bias_function``: LoRAs in lowvram mode) are applied while packing, so the receiver computes
exactly what the owner's block computes.

``WeightRing`` receives: two buffer blocks per block shape on the rank's device (the block
computing, the next one arriving). ``weights_version`` tells whether a block's weights changed
since sent: per tensor the object (weakly held) and its in-place version counter.
"""
from __future__ import annotations

import copy
import datetime
import weakref

import torch

from ..sequence.ops import pinned_memory_allowed, real_cuda
from ..errors import RunError

__all__ = ["RingSlot", "WeightLayout", "WeightRing", "bind_flat", "block_tensors", "empty_block", "pack_block",
           "same_version", "skeleton", "unpack_into", "weights_version"]

_ALIGN = 64
_ON_THE_FLY = ("weight_function", "bias_function")


def block_tensors(block: torch.nn.Module) -> list[torch.Tensor]:
    """Parameters then buffers, in module order (the same order on every process)."""
    return [t for _, t in block.named_parameters()] + [t for _, t in block.named_buffers()]


class WeightLayout:
    """Where each tensor of a block lies in its flat byte form."""

    __slots__ = ("items", "key", "nbytes")

    def __init__(self, block: torch.nn.Module):
        items, offset = [], 0
        for t in block_tensors(block):
            n = t.numel() * t.element_size()
            items.append((offset, n, t.dtype, tuple(t.shape)))
            offset += -(-n // _ALIGN) * _ALIGN
        self.items, self.nbytes = tuple(items), offset
        self.key = (type(block).__qualname__, tuple((d, s) for _, _, d, s in items))
        """Blocks with equal keys share ring buffers."""


def skeleton(block: torch.nn.Module) -> torch.nn.Module:
    """``block`` with every tensor on ``meta`` and no on-the-fly patch functions (packing applies
    them); a local copy (tests, this process's own rings), never sent."""
    memo = {}
    for t in block_tensors(block):
        meta = torch.empty_like(t, device="meta")
        memo[id(t)] = torch.nn.Parameter(meta, requires_grad=False) if isinstance(t, torch.nn.Parameter) else meta
    for m in block.modules():  # the patch functions hold ComfyUI's whole patch dict: never copied
        for attr in _ON_THE_FLY:
            if attr in m.__dict__:
                memo[id(m.__dict__[attr])] = []
    return copy.deepcopy(block, memo)


def empty_block(skel: torch.nn.Module, device) -> torch.nn.Module:
    """A copy of a skeleton with fresh (uninitialised) tensors on ``device`` (its weights are bound
    or copied in afterwards; not to be confused with the engine's ``materialize``, which gathers rows)."""
    return copy.deepcopy(skel).to_empty(device=torch.device(device)).eval()


def _patched(module: torch.nn.Module, name: str, t: torch.Tensor) -> torch.Tensor:
    fns = module.__dict__.get(f"{name}_function") if name in ("weight", "bias") else None
    for fn in fns or ():
        t = fn(t)
    return t


def pack_block(block: torch.nn.Module, layout: WeightLayout, device="cpu") -> torch.Tensor:
    """The block's weights as one uint8 tensor on ``device`` (``layout.nbytes`` long)."""
    flat = torch.empty(layout.nbytes, dtype=torch.uint8, device=device)
    named = dict(block.named_modules())
    tensors = []
    for pname, t in block.named_parameters():
        owner, _, leaf = pname.rpartition(".")
        tensors.append(_patched(named[owner], leaf, t))
    tensors += [t for _, t in block.named_buffers()]
    with torch.no_grad():
        for (offset, n, dtype, shape), t in zip(layout.items, tensors, strict=True):
            if t.dtype != dtype or tuple(t.shape) != shape:
                raise RunError(f"a weight patch changed a tensor to {t.dtype} {tuple(t.shape)} "
                               f"(expected {dtype} {shape}); it cannot be sent to workers")
            if n:
                flat[offset:offset + n].copy_(t.detach().contiguous().reshape(-1).view(torch.uint8))
    return flat


def unpack_into(flat: torch.Tensor, layout: WeightLayout, module: torch.nn.Module, non_blocking: bool = False) -> None:
    """Copy the weights in ``flat`` into ``module``'s tensors (same layout)."""
    with torch.no_grad():
        for (offset, n, _, _), t in zip(layout.items, block_tensors(module), strict=True):
            if n:
                t.reshape(-1).view(torch.uint8).copy_(flat[offset:offset + n], non_blocking=non_blocking)


def bind_flat(module: torch.nn.Module, flat: torch.Tensor, layout: WeightLayout) -> None:
    """Make ``module``'s tensors views into ``flat`` (same device): bytes received into ``flat``
    are the module's weights, with no copy."""
    views = []
    for offset, n, dtype, shape in layout.items:
        views.append(flat[offset:offset + n].view(dtype).view(shape) if n else torch.empty(shape, dtype=dtype,
                                                                                           device=flat.device))
    named = dict(module.named_modules())
    entries = [(n, True) for n, _ in module.named_parameters()] + [(n, False) for n, _ in module.named_buffers()]
    for (name, is_param), view in zip(entries, views, strict=True):
        owner, _, leaf = name.rpartition(".")
        m = named[owner]
        if is_param:
            m._parameters[leaf] = torch.nn.Parameter(view, requires_grad=False)
        else:
            m._buffers[leaf] = view


class RingSlot:
    """One receive buffer of a ``WeightRing``: a block module bound to (or unpacked from) ``flat``."""

    __slots__ = ("copied", "flat", "index", "module", "work")

    def __init__(self, module, flat):
        self.module, self.flat = module, flat
        self.index = None
        self.work = self.copied = None
        """``copied``: event of the host->GPU copy that last read ``flat`` (``WeightRing.unpack``)."""


class WeightRing:
    """Receive buffers of one rank: ``slot_for(index, skel, layout)`` gives a buffer to receive a
    block into (the least recently used of two per block shape)."""

    def __init__(self, device, wire, ring: int = 2, timeout_s: float = 60.0):
        self.device, self.wire, self.ring = torch.device(device), torch.device(wire), ring
        self.timeout_s = timeout_s
        self._slots: dict = {}
        self.nbytes = 0

    def slot_for(self, index, skel: torch.nn.Module, layout: WeightLayout) -> RingSlot:
        slots = self._slots.setdefault(layout.key, [])
        if len(slots) < self.ring:
            module = empty_block(skel, self.device)
            # gloo receives on the host: pinned, so the copy to the GPU does not block the host thread
            flat = torch.empty(layout.nbytes, dtype=torch.uint8, device=self.wire, pin_memory=self._pinned())
            if self.wire == self.device:
                bind_flat(module, flat, layout)  # received bytes are the weights
            slot = RingSlot(module, flat)
            self.nbytes += layout.nbytes * (1 if self.wire == self.device else 2)
        else:
            slot = slots.pop(0)  # the least recently filled
        slots.append(slot)
        if slot.work is not None:  # never overwrite bytes still arriving
            slot.work.wait(datetime.timedelta(seconds=self.timeout_s))
        if slot.copied is not None:  # nor bytes the last unpack's copy to the GPU may still be reading
            slot.copied.synchronize()
        slot.index, slot.work, slot.copied = index, None, None
        return slot

    def unpack(self, slot: RingSlot, layout: WeightLayout) -> None:
        """Copy a received slot's bytes into its module on the device. From pinned memory the copy
        is queued on the current stream (the block's compute follows it in stream order) without
        blocking the host; ``slot_for`` waits for it before the slot receives again."""
        pinned = slot.flat.is_pinned()
        unpack_into(slot.flat, layout, slot.module, non_blocking=pinned)
        if pinned:
            slot.copied = torch.cuda.current_stream(self.device).record_event()

    def _pinned(self) -> bool:
        """Page-locked receive slots for a GPU rank on gloo, unless pinning is off (ComfyUI's
        ``--disable-pinned-memory``: ``sequence.ops.set_pinned_memory``)."""
        return self.wire.type == "cpu" and real_cuda(self.device) and pinned_memory_allowed()

    def release(self) -> None:
        for slots in self._slots.values():
            for slot in slots:
                if slot.copied is not None:  # the copy reading the pinned bytes is done before they go
                    slot.copied.synchronize()
        self._slots.clear()
        self.nbytes = 0


class _Ref:
    __slots__ = ("ref", "version")

    def __init__(self, t: torch.Tensor):
        self.ref = weakref.ref(t)
        try:
            self.version = t._version
        except RuntimeError:  # an inference tensor has no version counter
            self.version = -1

    def same(self, other: _Ref) -> bool:
        a = self.ref()
        return a is not None and a is other.ref() and self.version == other.version


def weights_version(block: torch.nn.Module) -> tuple:
    """Default version of a block's weights: each tensor object (weakly) and its in-place version."""
    return tuple(_Ref(t) for t in block_tensors(block))


def same_version(a, b) -> bool:
    """Whether two versions (``weights_version`` or a caller's hashable key) name the same weights."""
    if a is None or b is None:
        return False
    if isinstance(a, tuple) and a and isinstance(a[0], _Ref):
        return isinstance(b, tuple) and len(a) == len(b) and all(x.same(y) for x, y in zip(a, b, strict=True))
    return a == b
