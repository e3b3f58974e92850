"""Block weights for ranks that do not own a block: a two-slot ring of copies (pure PyTorch).

In `sequence` mode every rank runs every block. A rank whose device holds the block (its owner's
device) runs the real block; any other rank copies the block's tensors from the owner into a
*buffer* block on its own device: a structural copy of the block made once (its tensors fresh and
empty on the rank's device, never a second copy on the owner), refilled per use. Two buffers per
block shape: while block g computes from one, block g+1 is copied into the other (``prefetch``).

On CUDA the copies run on a side stream (current on both devices during the copy, so PyTorch's
cross-device copy synchronises the side streams, not the compute streams), ordered by events: the
compute stream waits for "copy of g done", the side stream waits for "compute that last used this
buffer done" before overwriting it. Elsewhere (CPU, fake devices) copies are plain and synchronous.
ComfyUI's per-layer cast attributes (``weight_function``, ``bias_function``: LoRA patches applied
on the fly in lowvram mode) are carried over with the tensors, so a buffer computes exactly what
the owner's block computes.
"""
from __future__ import annotations

import copy

import torch

__all__ = ["BlockStream"]

_CAST_ATTRS = ("weight_function", "bias_function", "comfy_cast_weights")


class _Buffer:
    __slots__ = ("module", "tensors", "index", "ready", "used")

    def __init__(self, module, tensors):
        self.module, self.tensors = module, tensors
        self.index = -1
        self.ready = self.used = None


def _block_tensors(block: torch.nn.Module) -> list[torch.Tensor]:
    return [t for _, t in block.named_parameters(recurse=True)] + [t for _, t in block.named_buffers(recurse=True)]


def _shape_key(block: torch.nn.Module):
    return type(block), tuple((tuple(t.shape), t.dtype) for t in _block_tensors(block))


def _real_cuda(device: torch.device) -> bool:
    """A CUDA device with a driver (fake ``cuda:N`` in dry runs copies like the CPU)."""
    return device.type == "cuda" and torch.cuda.is_available()


class BlockStream:
    """Per rank: ``module_for(index, block)`` gives a module with block ``index``'s weights on the
    rank's device; ``prefetch(index, block)`` starts that copy early."""

    def __init__(self, device, ring: int = 2):
        self.device = torch.device(device)
        self.ring = ring
        self._buffers: dict = {}
        self._side = None
        self._src_sides: dict = {}
        self.bytes_copied = 0
        self.copies = 0

    def owns(self, block: torch.nn.Module) -> bool:
        t = next(iter(_block_tensors(block)), None)
        return t is None or t.device == self.device

    def module_for(self, index: int, block: torch.nn.Module) -> torch.nn.Module:
        if self.owns(block):
            return block
        buf = self._find(index, block)
        if buf is None:
            buf = self._fill(index, block)
        if buf.ready is not None:
            torch.cuda.current_stream(self.device).wait_event(buf.ready)
        return buf.module

    def done_with(self, module: torch.nn.Module) -> None:
        """Mark the compute that used ``module`` (a buffer) so it is not overwritten too early."""
        if not _real_cuda(self.device):
            return
        for bufs in self._buffers.values():
            for b in bufs:
                if b.module is module:
                    b.used = torch.cuda.current_stream(self.device).record_event()

    def prefetch(self, index: int, block: torch.nn.Module) -> None:
        if not self.owns(block) and self._find(index, block) is None:
            self._fill(index, block)

    def release(self) -> None:
        self._buffers.clear()

    # ---- internals -----------------------------------------------------------------------------
    def _find(self, index, block):
        for b in self._buffers.get(_shape_key(block), ()):
            if b.index == index:
                return b
        return None

    def _fill(self, index: int, block: torch.nn.Module) -> _Buffer:
        key = _shape_key(block)
        bufs = self._buffers.setdefault(key, [])
        # a new buffer while the ring is not full, else the least recently filled one: popping the
        # oldest while the ring grows refilled the buffer the block before was about to read
        buf = self._make(block) if len(bufs) < self.ring else bufs.pop(0)
        bufs.append(buf)
        self._copy_into(buf, block)
        buf.index = index
        return buf

    def _make(self, block: torch.nn.Module) -> _Buffer:
        memo = {}
        for t in _block_tensors(block):
            empty = torch.empty_like(t, device=self.device)
            memo[id(t)] = torch.nn.Parameter(empty, requires_grad=False) if isinstance(t, torch.nn.Parameter) else empty
        module = copy.deepcopy(block, memo)
        return _Buffer(module, _block_tensors(module))

    def _copy_into(self, buf: _Buffer, block: torch.nn.Module) -> None:
        src = _block_tensors(block)
        nbytes = sum(t.numel() * t.element_size() for t in src)
        if _real_cuda(self.device):
            self._copy_cuda(buf, src)
        else:
            with torch.no_grad():
                for d, s in zip(buf.tensors, src, strict=True):
                    d.copy_(s)
        for (_, dm), (_, sm) in zip(buf.module.named_modules(), block.named_modules(), strict=True):
            for attr in _CAST_ATTRS:
                if attr in sm.__dict__:
                    dm.__dict__[attr] = sm.__dict__[attr]
        self.bytes_copied += nbytes
        self.copies += 1

    def _copy_cuda(self, buf: _Buffer, src) -> None:
        if self._side is None:
            self._side = torch.cuda.Stream(self.device)
        src_dev = src[0].device
        if buf.used is not None:
            self._side.wait_event(buf.used)
        src_side = None
        if _real_cuda(src_dev):  # the owner's weights are loaded before sampling: nothing to wait for
            src_side = self._src_sides.setdefault(src_dev, torch.cuda.Stream(src_dev))
        with torch.no_grad(), torch.cuda.stream(self._side):
            if src_side is not None:
                with torch.cuda.stream(src_side):
                    for d, s in zip(buf.tensors, src, strict=True):
                        d.copy_(s, non_blocking=True)
            else:
                for d, s in zip(buf.tensors, src, strict=True):
                    d.copy_(s, non_blocking=True)
            buf.ready = self._side.record_event()
