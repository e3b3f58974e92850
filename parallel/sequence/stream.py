"""Block weights for ranks that do not own a block: a two-slot ring of copies (pure PyTorch).

In `sequence` mode every rank runs every block. A rank whose device holds the block (its owner's
device) runs the real block; any other rank copies the block's tensors from the owner into a
*buffer* block on its own device: a structural copy of the block made once (its tensors fresh and
empty on the rank's device, never a second copy on the owner), refilled per use. Two buffers per
block shape (HunyuanVideo's double and single blocks: two each): block g computes from one while
block g+1 is copied into the other. The engine asks for that copy (``prefetch``) *after* block g's
kernels are launched, so the copy never delays the launch of the compute it should overlap.

Blocks held in RAM (a ``cpu`` entry of the device list) are copied through a *pinned bounce ring*
(two page-locked host buffers per block shape) rather than pinning the RAM-held share once: a
host->GPU ``copy_(non_blocking=True)`` from pageable memory blocks the host thread, but pinning the
whole share would lock up to tens of GiB of RAM, and ComfyUI replaces a block's CPU tensors by new
(unpinned) ones whenever it patches weights (LoRA), so pins made once would be lost silently. The
bounce costs two blocks of pinned RAM per shape and rank (each one flat buffer registered with
CUDA, exactly the bytes ``held`` reports); the host memcpy of block g+1 into it runs while the GPU
computes block g. The bounce is decided per tensor: tensors already pinned (ComfyUI's own pins)
are read directly, even in a block whose other tensors are staged.

On CUDA the copies run on a side stream. The waits, each named in ``ORDER_WAITS``:

- ``side_waits_owner``: once per forward the side stream waits for the owner device's current
  stream as the main thread left it, so weights ComfyUI loaded or patched asynchronously just
  before the forward are complete before they are copied;
- ``compute_waits_copy``: the compute stream waits for "copy of g done" before block g runs;
- ``copy_waits_reader``: the side stream waits for "the compute that last read this buffer done"
  before overwriting it;
- ``bounce_waits_copy``: the host waits for "the copy that last read this bounce buffer done"
  before writing the next block into it;
- ``owner_waits_copies``: at the end of each forward every owner's current stream waits for the
  rings' copies, so ComfyUI's next load or patch of the owner's weights never overwrites weights a
  copy of this forward is still reading;
- ``release_waits_copies``: ``release`` waits for every copy and reader of a buffer before
  dropping it, so freed memory is never still being written or read.

On CPU and fake devices every wait is a no-op and copies are synchronous (``sequence/ops.TorchOps``).
ComfyUI's per-layer cast attributes (``weight_function``, ``bias_function``: LoRA patches applied
on the fly in lowvram mode) are carried over with the tensors, and cleared where the block has none,
so a buffer computes exactly what the owner's block computes, whichever block it held before.
"""
from __future__ import annotations

import contextlib
import copy
import weakref

import torch

from .ops import TorchOps
from ..errors import InputError

__all__ = ["EXCHANGE_WAITS", "ORDER_WAITS", "BlockStream", "begin_forward", "end_forward", "without_wait"]

_CAST_ATTRS = ("weight_function", "bias_function", "comfy_cast_weights")

ORDER_WAITS = ("side_waits_owner", "compute_waits_copy", "copy_waits_reader", "bounce_waits_copy",
               "owner_waits_copies", "release_waits_copies")
"""The ring's waits (see the module docstring). Stable names: tests and ``benchmarks/gpu_check.py``
remove one with ``without_wait`` to show that something then flags the race."""

EXCHANGE_WAITS = ("exchange_waits_poster", "exchange_waits_alloc", "attention_waits_exchange",
                  "gather_waits_outputs", "reuse_waits_readers")
"""The waits of the pipelined Ulysses exchange (``threads.ThreadExchange.start``, ``ulysses``):
the exchange stream waits for the poster's compute stream (the q/k/v or output it reads are made)
and for the receiver's (its receive buffers are allocated there); a chunk's attention waits for
its q/k/v copies; putting the heads together waits for every output copy; and a rank's compute
stream waits for every rank's exchange stream before the memory of what it posted is reused."""

_disabled: set[str] = set()


@contextlib.contextmanager
def without_wait(name: str):
    """Testing hook: the ring (or the pipelined exchange) skips wait ``name`` (one of
    ``ORDER_WAITS`` or ``EXCHANGE_WAITS``) inside the block."""
    if name not in ORDER_WAITS + EXCHANGE_WAITS:
        raise InputError(f"unknown wait {name!r}; the waits are {ORDER_WAITS + EXCHANGE_WAITS}")
    _disabled.add(name)
    try:
        yield
    finally:
        _disabled.discard(name)


def wait_on(name: str) -> bool:
    """Whether the named order wait (``ORDER_WAITS``, ``EXCHANGE_WAITS``) is in force: ``without_wait``
    turns one off, so a test can show that the race check fails without it."""
    return name not in _disabled


class _Buffer:
    __slots__ = ("index", "module", "ready", "tensors", "used")

    def __init__(self, module, tensors):
        self.module, self.tensors = module, tensors
        self.index = -1
        self.ready = self.used = None
        """Events: the copy into it done; the compute that last read it done."""


class _Bounce:
    __slots__ = ("flat", "read", "tensors", "unpin")

    def __init__(self, flat, tensors, unpin):
        self.flat, self.tensors, self.unpin, self.read = flat, tensors, unpin, None
        """One pinned buffer (``flat``) viewed as the block's tensors; ``read``: event of the copy
        that last read it."""


def _block_tensors(block: torch.nn.Module) -> list[torch.Tensor]:
    return [t for _, t in block.named_parameters(recurse=True)] + [t for _, t in block.named_buffers(recurse=True)]


def _nbytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def _signature(block: torch.nn.Module) -> list:
    """What a resident copy of ``block`` was copied from: each tensor (a weak reference: a freed
    tensor never matches, even if a new one takes its address) and its in-place version. ComfyUI
    replaces a patched weight, or writes it in place; either makes the copy stale. Per-layer patch
    attributes are carried at every use instead (``_carry_patches``)."""
    return [(weakref.ref(t), t._version) for t in _block_tensors(block)]


def _same(signature, block: torch.nn.Module) -> bool:
    tensors = _block_tensors(block)
    return signature is not None and len(signature) == len(tensors) and all(
        ref() is t and version == t._version for (ref, version), t in zip(signature, tensors, strict=True))


def _shape_key(block: torch.nn.Module):
    return type(block), tuple((tuple(t.shape), t.dtype) for t in _block_tensors(block))


def _carry_patches(dst: torch.nn.Module, src: torch.nn.Module) -> None:
    """``dst`` (a buffer) takes ``src``'s per-layer patch attributes, and loses those ``src`` lacks:
    a buffer refilled with another block must not keep the last block's LoRA patch."""
    for (_, dm), (_, sm) in zip(dst.named_modules(), src.named_modules(), strict=True):
        for attr in _CAST_ATTRS:
            if attr in sm.__dict__:
                dm.__dict__[attr] = sm.__dict__[attr]
            else:
                dm.__dict__.pop(attr, None)


def _lru(ring: list, limit: int, make):
    """A new entry while ``ring`` has fewer than ``limit``, else its least recently used one; the
    entry returned is moved last (a new one must be returned: the first is still in use)."""
    item = make() if len(ring) < limit else ring.pop(0)
    ring.append(item)
    return item


def begin_forward(streams) -> None:
    """Main thread, at the start of each forward: mark every owner's current stream (the work
    ComfyUI queued on it so far) for the rings to wait on before their first copy from it."""
    marks = {}
    for s in streams:
        if s.place not in marks:
            marks[s.place] = s.ops.record(s.ops.current_stream(s.place))
    for s in streams:
        s.begin_forward(marks)


def end_forward(streams) -> None:
    """Main thread, once every rank queued its last block: each owner's current stream waits for
    every ring's copies of this forward (``owner_waits_copies``)."""
    done = [s.ops.record(s._side) for s in streams if s._side is not None]
    if not done or not wait_on("owner_waits_copies"):
        return
    for place in dict.fromkeys(s.place for s in streams):
        current = streams[0].ops.current_stream(place)
        for event in done:
            streams[0].ops.wait(current, event)


class BlockStream:
    """Per rank: ``module_for(index, block)`` gives a module with block ``index``'s weights on the
    rank's device; ``prefetch(index, block)`` starts that copy early; ``done_with`` marks the
    compute that read it."""

    def __init__(self, device, ring: int = 2, ops=None, place=None):
        self.ops = ops if ops is not None else TorchOps()
        self.device = torch.device(device)
        self.place = place if place is not None else self.ops.home(self.device)
        self.ring = ring
        self._buffers: dict = {}
        self._bounces: dict = {}
        self._by_module: dict[int, _Buffer] = {}
        self._side = None
        self._marks: dict = {}
        self._waited: set = set()
        self.bytes_copied = 0
        self.copies = 0
        self.resident_budget = 0
        """Bytes this rank may keep of other ranks' blocks beyond the ring (``keep_resident``)."""
        self._resident: dict[int, _Buffer] = {}
        self._signatures: dict[int, tuple] = {}
        self._checked: set[int] = set()

    def owns(self, block: torch.nn.Module) -> bool:
        t = next(iter(_block_tensors(block)), None)
        return t is None or self.ops.place(t) == self.place

    def begin_forward(self, marks: dict) -> None:
        """A new forward: owners' marks to wait on; ring buffers filled before are stale (the weights
        may have been patched since, and the wait on the owner is made again); resident copies are
        checked against their block once in the forward (``_resident_for``)."""
        self._marks, self._waited, self._checked = dict(marks), set(), set()
        for bufs in self._buffers.values():
            for b in bufs:
                b.index = -1

    def keep_resident(self, budget_bytes: int) -> None:
        """Keep up to ``budget_bytes`` of the blocks this rank streams as copies of their own, kept
        across forwards (in the order the forward first needs them) and copied again only when the
        owner's block changed (its tensors replaced or written in place, or its patches changed):
        a rank with room for them streams nothing. A smaller budget drops the copies beyond it."""
        self.resident_budget = max(0, int(budget_bytes))
        while self._resident and self.resident_bytes() > self.resident_budget:
            self._drop(next(reversed(self._resident)))

    def resident_bytes(self) -> int:
        return sum(_nbytes(b.tensors) for b in self._resident.values())

    def drop_resident(self) -> None:
        """Drop every resident copy (ComfyUI needs the memory: another model, the VAE)."""
        for index in list(self._resident):
            self._drop(index)

    def module_for(self, index: int, block: torch.nn.Module) -> torch.nn.Module:
        if self.owns(block):
            return block
        buf = self._resident_for(index, block) or self._find(index, block) or self._fill(index, block)
        if wait_on("compute_waits_copy"):  # block g's kernels must not read the buffer before its copy is done
            self.ops.wait(self.ops.current_stream(self.place), buf.ready)
        return buf.module

    def done_with(self, module: torch.nn.Module, index: int = -1) -> None:
        """Block ``index``'s compute that reads ``module`` was launched: mark it, so the buffer is
        not overwritten before it finished."""
        buf = self._by_module.get(id(module))
        if buf is None or buf.module is not module:
            return
        stream = self.ops.current_stream(self.place)
        self.ops.launched(stream, buf.tensors, f"compute {index}")
        buf.used = self.ops.record(stream)

    def prefetch(self, index: int, block: torch.nn.Module) -> None:
        if not self.owns(block) and self._resident_for(index, block) is None and self._find(index, block) is None:
            self._fill(index, block)

    def release(self) -> None:
        """Drop every buffer, once the copies into it and the computes reading it finished."""
        self.drop_resident()
        for bufs in self._buffers.values():
            for b in bufs:
                if wait_on("release_waits_copies"):
                    self.ops.host_wait(b.ready)
                    self.ops.host_wait(b.used)
                self.ops.freed(b.tensors, "release")
        for bounces in self._bounces.values():
            for b in bounces:
                if wait_on("release_waits_copies"):
                    self.ops.host_wait(b.read)
                self.ops.freed(b.tensors, "release bounce")
                b.unpin()
        self._buffers.clear()
        self._bounces.clear()
        self._by_module.clear()

    def held(self) -> dict:
        """Bytes the ring holds: ``device`` (buffers on the rank's device), ``pinned`` (host bounce
        buffers), per block shape: the memory plan counts both."""
        def size(ts):
            return sum(t.numel() * t.element_size() for t in ts)
        return {"device": sum(size(b.tensors) for bufs in self._buffers.values() for b in bufs),
                "pinned": sum(b.flat.numel() for bs in self._bounces.values() for b in bs),
                "resident": self.resident_bytes()}

    # ---- internals -----------------------------------------------------------------------------
    def _resident_for(self, index: int, block: torch.nn.Module) -> _Buffer | None:
        """Block ``index``'s resident copy, made when the budget has room and refreshed once per
        forward if the block changed; None: the block goes through the ring."""
        buf = self._resident.get(index)
        if buf is None:
            if self.resident_bytes() + _nbytes(_block_tensors(block)) > self.resident_budget:
                return None
            buf = self._resident[index] = self._make(block)
            self._signatures[index] = None
        if index not in self._checked:
            self._checked.add(index)
            if _same(self._signatures[index], block):
                _carry_patches(buf.module, block)  # LoRA patches applied at cast time may have changed
            else:
                self._copy_into(buf, block, index)
                self._signatures[index] = _signature(block)
        return buf

    def _drop(self, index: int) -> None:
        buf = self._resident.pop(index)
        self._signatures.pop(index, None)
        if wait_on("release_waits_copies"):
            self.ops.host_wait(buf.ready)
            self.ops.host_wait(buf.used)
        self.ops.freed(buf.tensors, "drop resident")
        self._by_module.pop(id(buf.module), None)

    def _find(self, index, block):
        for b in self._buffers.get(_shape_key(block), ()):
            if b.index == index:
                return b
        return None

    def _fill(self, index: int, block: torch.nn.Module) -> _Buffer:
        buf = _lru(self._buffers.setdefault(_shape_key(block), []), self.ring, lambda: self._make(block))
        buf.index = -1  # while it is refilled it holds no block
        self._copy_into(buf, block, index)
        buf.index = index
        return buf

    def _make(self, block: torch.nn.Module) -> _Buffer:
        memo = {}
        for t in _block_tensors(block):
            empty = self.ops.empty_like(t, self.place)
            memo[id(t)] = torch.nn.Parameter(empty, requires_grad=False) if isinstance(t, torch.nn.Parameter) else empty
        for m in block.modules():  # patches are shared, never copied (a LoRA patch holds every patch)
            for attr in _CAST_ATTRS:
                if attr in m.__dict__:
                    memo[id(m.__dict__[attr])] = m.__dict__[attr]
        module = copy.deepcopy(block, memo)
        buf = _Buffer(module, _block_tensors(module))
        # allocated on the compute stream: the caching allocator may hand back memory whose last
        # reader is a compute kernel still queued there, so the side stream's first copy into it
        # waits for this point like any later refill waits for its reader (copy_waits_reader)
        buf.used = self.ops.record(self.ops.current_stream(self.place))
        self._by_module[id(module)] = buf
        return buf

    def _copy_into(self, buf: _Buffer, block: torch.nn.Module, index: int) -> None:
        src = _block_tensors(block)
        if self._side is None:
            self._side = self.ops.side_stream(self.place)
        side = self._side
        if wait_on("copy_waits_reader"):  # the compute that last read this buffer must be done
            self.ops.wait(side, buf.used)
        owner = self.ops.place(src[0]) if src else None
        if owner not in self._waited:  # once per forward and owner: see begin_forward
            self._waited.add(owner)
            if wait_on("side_waits_owner"):
                self.ops.wait(side, self._marks.get(owner))
        staged = [self.ops.needs_bounce(t, self.place) for t in src]  # per tensor: a block may be partly pinned
        bounce = self._stage(block, src, staged) if any(staged) else None
        if bounce is not None:
            src = [b if s else t for t, b, s in zip(src, bounce.tensors, staged, strict=True)]
        self.ops.copy(buf.tensors, src, side, f"copy {index}")
        buf.ready = self.ops.record(side)
        if bounce is not None:
            bounce.read = buf.ready
        _carry_patches(buf.module, block)
        self.bytes_copied += sum(t.numel() * t.element_size() for t in src)
        self.copies += 1

    def _stage(self, block, src, staged) -> _Bounce:
        """Copy the pageable host tensors of ``src`` (``staged``) into the least recently used pinned
        bounce buffer; the others (pinned, or on a GPU) are read where they are."""
        ring = self._bounces.setdefault(_shape_key(block), [])
        bounce = _lru(ring, self.ring, lambda: _Bounce(*self.ops.pinned_like(src)))
        if wait_on("bounce_waits_copy"):  # the copy that last read this bounce buffer must be done
            self.ops.host_wait(bounce.read)
        pairs = [(b, t) for b, t, s in zip(bounce.tensors, src, staged, strict=True) if s]
        self.ops.host_copy([b for b, _ in pairs], [t for _, t in pairs])
        return bounce
