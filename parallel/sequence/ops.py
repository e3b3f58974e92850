"""The stream, event, copy and pin operations of the block ring (``stream``), behind one small
interface (pure PyTorch).

``TorchOps`` is what runs: on a real CUDA device it uses ``torch.cuda`` streams and events; on CPU
and on fake ``cuda:N`` devices (dry runs) every stream is None, every wait a no-op and every copy
synchronous, so the ring's code is the same on every device. ``record.RecordingOps`` has the
same methods and records an ordered log on CPU, so tests can check the order rules without a GPU.

A *place* is where a tensor lives for the ring: ``TorchOps`` uses the tensor's device.
"""
from __future__ import annotations

import weakref

import torch

__all__ = ["TorchOps", "flat_size", "flat_views", "pinned_memory_allowed", "real_cuda", "set_pinned_memory"]

_PINNED = [True]
"""Whether the ring may page-lock host memory (its bounce buffers): ComfyUI's
``--disable-pinned-memory`` turns it off (``loaders/comfy/core/running_state.py`` sets it per sharding call)."""


def set_pinned_memory(allowed: bool) -> None:
    """Default of ``TorchOps(pin=None)``: False = copy from pageable host memory, never pin."""
    _PINNED[0] = bool(allowed)


def pinned_memory_allowed() -> bool:
    return _PINNED[0]

_ALIGN = 64
"""Byte alignment of each tensor in a flat buffer (any dtype's view; whole cache lines for DMA)."""


def flat_size(tensors) -> int:
    """Bytes of one flat buffer holding ``tensors`` one after the other, each ``_ALIGN``-aligned."""
    return sum(-(-t.numel() * t.element_size() // _ALIGN) * _ALIGN for t in tensors)


def flat_views(flat: torch.Tensor, tensors) -> list[torch.Tensor]:
    """Views of ``flat`` (uint8) with ``tensors``' shapes and dtypes, laid out as ``flat_size``."""
    out, offset = [], 0
    for t in tensors:
        n = t.numel() * t.element_size()
        out.append(flat[offset:offset + n].view(t.dtype).view(t.shape) if n else torch.empty(t.shape, dtype=t.dtype))
        offset += -(-n // _ALIGN) * _ALIGN
    return out


def _no_unpin() -> None:
    pass


_PAGE = 4096


def _register(nbytes: int):
    """``nbytes`` of host memory page-locked in place (``cudaHostRegister``) on whole pages of its
    own (two buffers never share a registered page), and the call that undoes it (also run when the
    buffer is collected); where registering fails, a pinned buffer of the caching allocator."""
    pages = -(-nbytes // _PAGE) * _PAGE
    raw = torch.empty(pages + _PAGE, dtype=torch.uint8)
    start = -raw.data_ptr() % _PAGE
    flat = raw[start:start + nbytes]
    try:
        from torch.cuda._pin_memory_utils import pin_memory, unpin_memory

        ptr = flat.data_ptr()
        pin_memory(ptr, pages)
    except (ImportError, RuntimeError):
        return torch.empty(nbytes, dtype=torch.uint8, pin_memory=True), _no_unpin
    return flat, weakref.finalize(flat, unpin_memory, ptr)


def real_cuda(device) -> bool:
    """A CUDA device with a driver (a fake ``cuda:N`` in a dry run copies like the CPU)."""
    device = torch.device(device)
    return device.type == "cuda" and torch.cuda.is_available() and (device.index or 0) < torch.cuda.device_count()


class TorchOps:
    """Streams and events of ``torch.cuda``; no-ops (None) where the device has none. ``pin``: may
    page-lock bounce buffers (None: ``pinned_memory_allowed()`` when made); without, host->GPU copies
    read pageable memory (the copy then blocks the host thread: slower, same bytes)."""

    def __init__(self, pin: bool | None = None):
        self.pin = pinned_memory_allowed() if pin is None else bool(pin)

    def home(self, device) -> torch.device:
        return torch.device(device)

    def place(self, t: torch.Tensor) -> torch.device:
        return t.device

    def is_async(self, place) -> bool:
        return real_cuda(place)

    def needs_bounce(self, t: torch.Tensor, dst_place) -> bool:
        """A host->GPU copy from pageable memory: ``copy_(non_blocking=True)`` from it blocks the
        host thread until the copy is done, so it is staged through pinned memory first."""
        return self.pin and self.is_async(dst_place) and t.device.type == "cpu" and not t.is_pinned()

    def empty_like(self, t: torch.Tensor, place) -> torch.Tensor:
        return torch.empty_like(t, device=place)

    def pinned_like(self, tensors):
        """One page-locked host buffer for ``tensors``' shapes: ``(flat, views, unpin)``. Exactly
        ``flat_size`` bytes (to the page): plain host memory registered with CUDA, since the caching
        pinned allocator rounds each block up to a power of two (up to twice what
        ``BlockStream.held`` reports). Plain host memory where there is no CUDA driver to pin it."""
        nbytes = flat_size(tensors)
        if torch.cuda.is_available() and nbytes:
            flat, unpin = _register(nbytes)
        else:
            flat, unpin = torch.empty(nbytes, dtype=torch.uint8), _no_unpin
        return flat, flat_views(flat, tensors), unpin

    def side_stream(self, place):
        return torch.cuda.Stream(place) if self.is_async(place) else None

    def current_stream(self, place):
        return torch.cuda.current_stream(place) if self.is_async(place) else None

    def record(self, stream):
        return None if stream is None else stream.record_event()

    def wait(self, stream, event) -> None:
        if stream is not None and event is not None:
            stream.wait_event(event)

    def host_wait(self, event) -> None:
        if event is not None:
            event.synchronize()

    def host_copy(self, dsts, srcs) -> None:
        with torch.no_grad():
            for d, s in zip(dsts, srcs, strict=True):
                d.copy_(s)

    def copy(self, dsts, srcs, stream, label: str = "") -> None:
        """``dsts[i] <- srcs[i]`` on ``stream`` (None: now, synchronously).

        From another GPU PyTorch runs the copy on the *source* device's current stream and makes
        the destination's current stream wait for it; so a side stream of the source device is made
        current and first waits for ``stream`` (which carries every wait the ring made: owner,
        last reader), and ``stream`` is current on the destination, so it waits for the copy."""
        with torch.no_grad():
            if stream is None:
                for d, s in zip(dsts, srcs, strict=True):
                    d.copy_(s)
                return
            src_dev = srcs[0].device if srcs else stream.device
            with torch.cuda.stream(stream):
                if real_cuda(src_dev) and src_dev != stream.device:
                    side = self._src_side(src_dev)
                    side.wait_stream(stream)
                    with torch.cuda.stream(side):
                        for d, s in zip(dsts, srcs, strict=True):
                            d.copy_(s, non_blocking=True)
                else:
                    for d, s in zip(dsts, srcs, strict=True):
                        d.copy_(s, non_blocking=True)

    def launched(self, stream, tensors, label: str = "") -> None:
        """Compute that reads ``tensors`` was queued on ``stream`` (recorded by tests only)."""

    def kernel(self, stream, reads=(), writes=(), label: str = "") -> None:
        """Compute that reads ``reads`` and writes ``writes`` was queued on ``stream`` (recorded by
        tests only: the pipelined exchange's q/k/v, attention and reuse of its buffers)."""

    def freed(self, tensors, label: str = "") -> None:
        """The ring drops ``tensors`` (recorded by tests only)."""

    def _src_side(self, device):
        sides = self.__dict__.setdefault("_sides", {})
        if device not in sides:
            sides[device] = torch.cuda.Stream(device)
        return sides[device]
