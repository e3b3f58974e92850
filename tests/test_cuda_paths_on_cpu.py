"""CUDA-only lines of the `sequence` ring and the distributed weight ring, checked on CPU (pure).

Each test stands in for a GPU where torch has none, by faking only what this machine lacks
(``torch.cuda`` streams, a tensor that says it lives on ``cuda:1``, an event), and asserts what our
code asks of CUDA: page-locked bounce buffers, a bounce for pageable owners, the main thread's
stream in every rank thread, a cross-GPU copy ordered after the ring's waits, a receive buffer
never refilled before the copy reading it finished. Issue 30: each of these lines could be
changed (mutated) without any test failing; ``tests/README.md`` lists the mutations and the test
that catches each. The lent GPU machine runs the real thing (``benchmarks/gpu_check.py``).
"""
import contextlib
import threading
from types import SimpleNamespace

import torch
from harness.toy_seq import SeqToyDiT

from sharddit.parallel.distributed.weights import WeightLayout, WeightRing, skeleton
from sharddit.parallel.sequence import ops as seq_ops
from sharddit.parallel.sequence.ops import TorchOps
from sharddit.parallel.sequence.threads import RankThreads


class _FakeCuda:
    """``torch.cuda``'s stream calls, per thread as CUDA's are, with a log."""

    def __init__(self):
        self.log, self._local, self._defaults = [], threading.local(), {}

    def default(self, device):
        device = torch.device(device)
        return self._defaults.setdefault(device, self.make_stream(device, f"default-{device}"))

    def current_stream(self, device=None):
        return getattr(self._local, "current", {}).get(torch.device(device)) or self.default(device)

    @contextlib.contextmanager
    def stream(self, s):
        current = self._local.__dict__.setdefault("current", {})
        before = current.get(s.device)
        current[s.device] = s
        self.log.append(("enter", s.name))
        try:
            yield
        finally:
            current[s.device] = before
            self.log.append(("exit", s.name))

    def make_stream(self, device, name):
        return SimpleNamespace(device=torch.device(device), name=name,
                               wait_stream=lambda other: self.log.append(("wait", name, other.name)))


def test_bounce_buffers_are_page_locked_and_exactly_the_bytes_held(monkeypatch):
    """A pageable bounce buffer would make every host->GPU copy block the host thread; one from
    the caching pinned allocator would be rounded up to a power of two (up to twice the pinned RAM
    ``BlockStream.held`` reports). So one flat buffer per bounce, registered with CUDA in place."""
    import torch.cuda._pin_memory_utils as pin_utils

    registered = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(pin_utils, "pin_memory", lambda ptr, size: registered.append((ptr, size)))
    monkeypatch.setattr(pin_utils, "unpin_memory", lambda ptr: registered.remove(next(r for r in registered
                                                                                      if r[0] == ptr)))
    tensors = [torch.ones(2, 3), torch.ones(5, dtype=torch.float16), torch.ones(0)]
    flat, views, unpin = TorchOps().pinned_like(tensors)
    assert flat.numel() == seq_ops.flat_size(tensors) == 64 + 64 and flat.dtype == torch.uint8
    assert registered == [(flat.data_ptr(), 4096)] and flat.data_ptr() % 4096 == 0  # whole pages of its own
    assert [(v.shape, v.dtype) for v in views] == [(t.shape, t.dtype) for t in tensors]
    assert views[0].data_ptr() == flat.data_ptr() and views[1].data_ptr() == flat.data_ptr() + 64
    unpin()
    unpin()  # once only
    assert registered == []


def test_a_pageable_owner_needs_a_bounce_to_a_gpu_and_nothing_else_does(monkeypatch):
    ops = TorchOps()
    monkeypatch.setattr(ops, "is_async", lambda place: torch.device(place).type == "cuda")  # as on a GPU machine
    assert ops.needs_bounce(torch.ones(3), "cuda:0")
    assert not ops.needs_bounce(torch.ones(3), "cpu")  # a CPU rank reads the RAM-held share directly


def test_rank_threads_run_on_the_main_threads_stream(monkeypatch):
    """Scatter, gather and the thread exchange pass tensors between threads with no event: right
    only while every thread queues on the stream the main thread uses (a non-default one here)."""
    fake = _FakeCuda()
    monkeypatch.setattr(torch.cuda, "current_stream", fake.current_stream)
    monkeypatch.setattr(torch.cuda, "stream", fake.stream)
    pool = RankThreads(["cpu", "cpu"], timeout_s=10)
    pool.cuda_devices = (torch.device("cuda:0"), torch.device("cuda:1"))  # what it finds on a 2-GPU machine
    main = {d: fake.make_stream(d, f"comfy-{d}") for d in pool.cuda_devices}
    try:
        with fake.stream(main[torch.device("cuda:0")]), fake.stream(main[torch.device("cuda:1")]):
            tasks = [pool.submit(r, lambda: {d: fake.current_stream(d) for d in pool.cuda_devices}) for r in (0, 1)]
            seen = [pool.wait(t, r) for r, t in enumerate(tasks)]
        after = pool.wait(pool.submit(0, lambda: fake.current_stream("cuda:0")), 0)
    finally:
        pool.close()
    assert seen == [main, main]
    assert after is fake.default("cuda:0")  # queued outside: the main thread's stream then


def test_a_copy_from_another_gpu_waits_for_the_rings_stream(monkeypatch):
    """PyTorch runs a GPU->GPU copy on the source device's current stream: the ring makes a side
    stream of the source current, and it must first wait for the ring's stream, which carries
    every wait the ring made (owner done writing, last reader of the buffer done)."""

    class OnGpu1(torch.Tensor):
        @property
        def device(self):
            return torch.device("cuda:1")

    fake = _FakeCuda()
    monkeypatch.setattr(torch.cuda, "stream", fake.stream)
    monkeypatch.setattr(torch.cuda, "Stream", lambda device: fake.make_stream(device, f"side-{device}"))
    monkeypatch.setattr(seq_ops, "real_cuda", lambda d: torch.device(d).type == "cuda")
    ring_stream = fake.make_stream("cuda:0", "ring")
    dst, src = torch.zeros(4), torch.arange(4.0).as_subclass(OnGpu1)
    TorchOps().copy([dst], [src], ring_stream, "copy 1")
    assert torch.equal(dst, torch.arange(4.0))
    assert fake.log == [("enter", "ring"), ("wait", "side-cuda:1", "ring"), ("enter", "side-cuda:1"),
                        ("exit", "side-cuda:1"), ("exit", "ring")]


class _Event:
    def __init__(self, log, name):
        self.log, self.name = log, name

    def synchronize(self):
        self.log.append(self.name)


def test_a_weight_ring_slot_is_refilled_only_after_the_copy_reading_it():
    """Gloo receives a worker's block into pinned host bytes, then an asynchronous copy moves them
    to the GPU: the slot may receive the next block only once that copy finished (its event), and
    is dropped only then."""
    torch.manual_seed(0)
    skel = skeleton(SeqToyDiT(dim=32, heads=4).eval().blocks[0])
    layout = WeightLayout(skel)
    ring, log = WeightRing("cpu", "cpu"), []
    first = ring.slot_for(0, skel, layout)
    first.copied = _Event(log, "copy 0")
    second = ring.slot_for(1, skel, layout)
    second.copied = _Event(log, "copy 1")
    assert log == []
    again = ring.slot_for(2, skel, layout)
    assert again is first and log == ["copy 0"] and again.copied is None
    ring.release()
    assert log == ["copy 0", "copy 1"]
