"""``RecordingOps``: the block ring's stream operations recorded on CPU, with a race check (pure).

Same methods as ``sequence/ops.TorchOps``. Copies run at once on CPU (results are right), and every
operation is logged with a vector clock, modelling CUDA's order rules: work queued on a stream
runs in queue order after everything the host did before queueing it; ``wait(stream, event)``
orders the stream after the event; ``host_wait(event)`` orders the host after it; nothing else is
ordered. All host threads count as one actor: host work is synchronous, so log order is real time.

``violations()`` lists every pair of accesses to one tensor (at least one a write: a copy into
it, a free, its allocation on a GPU place: ``empty_like``) that this model does not order, and
every host->GPU copy that reads pageable memory.
Places are names the test gives (``"cuda:1"``, ``"cpu"``: pageable host memory,
``"cpu-pinned"``); ``put(module, place)`` says where a module's tensors live.

A stand-in for tests that ships in the product on purpose: the engine never uses it at run time, but
``benchmarks/resident_bytes.py`` (run from a user's install, without the tests) counts the ring's
copies with it, as ``tests/test_stream_order.py`` and ``tests/test_sequence_pipeline.py`` check the
order rules with it.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass, field

import torch

from .ops import flat_size, flat_views

__all__ = ["RecordingOps", "Op"]

_HOST = "host"
PAGEABLE, PINNED = "cpu", "cpu-pinned"


@dataclass
class Op:
    kind: str
    actor: str
    label: str
    reads: tuple = ()
    writes: tuple = ()
    clock: dict = field(default_factory=dict)
    src_place: str = ""
    dst_place: str = ""


class _Stream:
    def __init__(self, name):
        self.name = name

    def __repr__(self):
        return f"<stream {self.name}>"


class _Event:
    def __init__(self, clock):
        self.clock = dict(clock)


def _key(t: torch.Tensor):
    """The memory a tensor views (a Parameter and the tensor it wraps are one)."""
    return (t.untyped_storage().data_ptr(), t.storage_offset()) if t.numel() else ("empty", id(t))


def _join(a: dict, b: dict) -> None:
    for k, v in b.items():
        if a.get(k, 0) < v:
            a[k] = v


class RecordingOps:
    def __init__(self):
        self.log: list[Op] = []
        self._places: dict[int, str] = {}
        self._keep: list = []
        self._clocks: dict[str, dict] = {_HOST: {}}
        self._current: dict[str, _Stream] = {}
        self._sides = 0
        self._lock = threading.RLock()

    # ---- test side ---------------------------------------------------------------------------
    def put(self, module: torch.nn.Module, place: str) -> None:
        for t in list(module.parameters()) + list(module.buffers()):
            self._tag(t, place)

    def kernel(self, stream, reads=(), writes=(), label="kernel") -> None:
        """Other work on a stream (ComfyUI patching an owner's weights, the pipelined exchange's
        attention, say). A tensor seen here for the first time lives where the stream runs."""
        with self._lock:
            for t in (*reads, *writes):
                if _key(t) not in self._places:
                    self._tag(t, stream.name.split("/")[0])
            self._stream_op("kernel", stream, label, reads, writes)

    def ops_of(self, kind: str, label: str | None = None) -> list[int]:
        return [i for i, o in enumerate(self.log) if o.kind == kind and (label is None or o.label == label)]

    def violations(self) -> list[str]:
        out = [f"#{i} {o.label}: host->GPU copy from pageable memory" for i, o in enumerate(self.log)
               if o.kind == "copy" and o.src_place == PAGEABLE and not o.dst_place.startswith("cpu")]
        seen: dict[int, list[tuple[int, bool]]] = {}
        for i, o in enumerate(self.log):
            for tid, write in [(t, False) for t in o.reads] + [(t, True) for t in o.writes]:
                for j, w in seen.get(tid, ()):
                    if (w or write) and not self._before(self.log[j], o):
                        out.append(f"#{j} {self.log[j].kind} {self.log[j].label!r} on {self.log[j].actor} and "
                                   f"#{i} {o.kind} {o.label!r} on {o.actor} touch one tensor unordered")
                seen.setdefault(tid, []).append((i, write))
        return out

    # ---- the TorchOps interface --------------------------------------------------------------
    def home(self, device):
        return str(device)

    def place(self, t):
        return self._places.get(_key(t), PAGEABLE)

    def is_async(self, place) -> bool:
        return not str(place).startswith("cpu")

    def needs_bounce(self, t, dst_place) -> bool:
        return self.is_async(dst_place) and self.place(t) == PAGEABLE

    def empty_like(self, t, place):
        """Memory on ``place``, modelled as CUDA's caching allocator hands it out: it may be memory
        a kernel queued on the place's current stream still reads (freed there, reused at once in
        that stream's order), so the allocation is a write on that stream."""
        out = self._tag(torch.empty_like(t, device="cpu"), place)
        if self.is_async(place):
            self._stream_op("alloc", self.current_stream(place), "alloc", (), (out,))
        return out

    def pinned_like(self, tensors):
        with self._lock:
            flat = torch.empty(flat_size(tensors), dtype=torch.uint8)
            views = [self._tag(v, PINNED) for v in flat_views(flat, tensors)]
            self.log.append(Op("pin", _HOST, "pin", clock=dict(self._clocks[_HOST])))
            return flat, views, lambda: self.log.append(Op("unpin", _HOST, "unpin", clock=dict(self._clocks[_HOST])))

    def side_stream(self, place):
        with self._lock:
            self._sides += 1
            return self._new(f"{place}/side{self._sides}")

    def current_stream(self, place):
        with self._lock:
            if place not in self._current:
                self._current[place] = self._new(f"{place}/current")
            return self._current[place]

    def record(self, stream):
        with self._lock:
            return _Event(self._clocks[stream.name])

    def wait(self, stream, event) -> None:
        if stream is not None and event is not None:
            with self._lock:
                _join(self._clocks[stream.name], event.clock)

    def host_wait(self, event) -> None:
        if event is not None:
            with self._lock:
                _join(self._clocks[_HOST], event.clock)

    def host_copy(self, dsts, srcs) -> None:
        with self._lock:
            self._host_op("host_copy", "bounce", srcs, dsts)
            with torch.no_grad():
                for d, s in zip(dsts, srcs, strict=True):
                    d.copy_(s)

    def copy(self, dsts, srcs, stream, label="copy") -> None:
        with self._lock:
            op = self._stream_op("copy", stream, label, srcs, dsts)
            places = [self.place(t) for t in srcs]  # pageable if any tensor is
            op.src_place = PAGEABLE if PAGEABLE in places else (places[0] if places else "")
            op.dst_place = self.place(dsts[0]) if dsts else ""
            with torch.no_grad():
                for d, s in zip(dsts, srcs, strict=True):
                    d.copy_(s)

    def launched(self, stream, tensors, label="compute") -> None:
        self._stream_op("compute", stream, label, tensors, ())

    def freed(self, tensors, label="free") -> None:
        with self._lock:
            self._host_op("free", label, (), tensors)

    # ---- internals -----------------------------------------------------------------------------
    def _tag(self, t, place):
        self._places[_key(t)] = place
        self._keep.append(t)  # memory stays unique while the log refers to it
        return t

    def _new(self, name):
        self._clocks[name] = {}
        return _Stream(name)

    def _host_op(self, kind, label, reads, writes) -> Op:
        clock = self._clocks[_HOST]
        clock[_HOST] = clock.get(_HOST, 0) + 1
        op = Op(kind, _HOST, label, tuple(map(_key, reads)), tuple(map(_key, writes)), dict(clock))
        self.log.append(op)
        return op

    def _stream_op(self, kind, stream, label, reads, writes) -> Op:
        with self._lock:
            clock = self._clocks[stream.name]
            _join(clock, self._clocks[_HOST])  # queued after everything the host did so far
            clock[stream.name] = clock.get(stream.name, 0) + 1
            op = Op(kind, stream.name, label, tuple(map(_key, reads)), tuple(map(_key, writes)), dict(clock))
            self.log.append(op)
            return op

    @staticmethod
    def _before(a: Op, b: Op) -> bool:
        return a.clock.get(a.actor, 0) <= b.clock.get(a.actor, 0)
