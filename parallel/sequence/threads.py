"""Persistent rank threads for `sequence` mode (``RankThreads``), and the in-process exchange
between them (pure). Not to be confused with worker *processes* (``distributed.worker``).

One thread per rank (device entry), as torch's ``parallel_apply`` uses one per device: it sets its
CUDA device once, then runs the tasks the main thread queues for it, in order, under the per-thread
state the main thread had when it queued them: grad / inference mode, autocast (ComfyUI may sample
under ``torch.autocast``) and, on every CUDA device of the pool, the current stream. So every
thread queues its kernels on the stream the main thread uses for that device: scatter, gather and
the thread exchange hand tensors between threads with no event because producer and consumer are
on one stream (``ThreadExchange`` checks this), and a cross-device ``.to()`` makes PyTorch order
those same streams. Kernels launch asynchronously, so on GPUs
the devices compute at the same time; on CPU with one intra-op thread per op, two workers use two
cores (ops release the GIL).

Failure rules: the first exception in any rank thread *aborts* the pool: every other thread skips its
queued tasks, every exchange wait raises ``RanksAborted``, and the main thread gets the original
error with the rank and device named. Every wait has a timeout. After an abort the pool is closed
(threads joined) and a new one is made for the next forward.
"""
from __future__ import annotations

import contextlib
import queue
import threading
import time
from collections.abc import Callable

import torch

from ..tensor_map import map_tensors, tensors_in
from .ops import TorchOps, real_cuda
from .split import PIPELINE_CHUNKS
from .stream import wait_on
from ..errors import RunError, WaitTimeout, reason_of

__all__ = ["RankThreadError", "RankThreads", "RanksAborted", "ThreadExchange"]

_STOP = object()


class RanksAborted(RuntimeError):
    """Raised in a rank thread whose pool was aborted by another thread's failure."""


class RankThreadError(RunError):
    """A rank thread's task failed; ``rank`` / ``device`` say where, ``__cause__`` is the original error."""

    def __init__(self, message: str, rank: int, device: torch.device):
        super().__init__(message)
        self.rank, self.device = rank, device


class _Task:
    __slots__ = ("autocast", "done", "error", "fn", "grad", "inference", "label", "result", "streams")

    def __init__(self, fn, label, cuda_devices=()):
        self.fn, self.label = fn, label
        self.done = threading.Event()
        self.result = self.error = None
        self.grad = torch.is_grad_enabled()
        self.inference = torch.is_inference_mode_enabled()
        self.autocast = tuple((dt, torch.get_autocast_dtype(dt), torch.is_autocast_cache_enabled())
                              for dt in ("cuda", "cpu") if torch.is_autocast_enabled(dt))
        self.streams = tuple(torch.cuda.current_stream(d) for d in cuda_devices)

    def state(self, device: torch.device) -> contextlib.ExitStack:
        """The main thread's per-thread state at submit time, entered on the worker of ``device``."""
        stack = contextlib.ExitStack()
        stack.enter_context(torch.inference_mode(self.inference))
        stack.enter_context(torch.set_grad_enabled(self.grad))
        for device_type, dtype, cache in self.autocast:
            stack.enter_context(torch.autocast(device_type, dtype=dtype, cache_enabled=cache))
        # entering a stream makes its device current: the worker's own device goes last
        for stream in sorted(self.streams, key=lambda st: st.device == device):
            stack.enter_context(torch.cuda.stream(stream))
        return stack


class RankThreads:
    """One persistent thread per rank (``len(devices)``); ``submit(rank, fn)`` queues ``fn()`` on rank's thread."""

    def __init__(self, devices, timeout_s: float = 600.0, worker_context: Callable | None = None,
                 serial_lock=None):
        self.devices = tuple(torch.device(d) for d in devices)
        self.serial_lock = serial_lock
        """Dry runs on fake devices: a lock every thread holds while it runs torch code, released
        only while waiting (a fake tensor reports device ``meta`` while another thread is inside
        the fake mode's kernel), so the threads take turns. None on real devices."""
        self.timeout_s = float(timeout_s)
        self.worker_context = worker_context
        # Intra-op threads are a per-thread setting (OpenMP): workers take the main thread's.
        self.intra_op_threads = torch.get_num_threads()
        self._abort = threading.Event()
        self._failure: RankThreadError | None = None
        self._lock = threading.Lock()
        self.cuda_devices = tuple(dict.fromkeys(d for d in self.devices if real_cuda(d)))
        self._queues = [queue.SimpleQueue() for _ in self.devices]
        self._threads = [threading.Thread(target=self._loop, args=(r,), daemon=True,
                                          name=f"sharddit-seq-{r}-{d}") for r, d in enumerate(self.devices)]
        for t in self._threads:
            t.start()

    # ---- main thread ---------------------------------------------------------------------------
    @property
    def aborted(self) -> bool:
        return self._abort.is_set()

    def submit(self, rank: int, fn: Callable, label: str = "") -> _Task:
        task = _Task(fn, label, self.cuda_devices)
        self._queues[rank].put(task)
        return task

    def wait(self, task: _Task, rank: int):
        """The task's result; re-raises the pool's first failure (as ``RankThreadError``)."""
        deadline = time.monotonic() + self.timeout_s
        while not task.done.wait(0.05):
            if self._failure is not None:
                break
            if time.monotonic() > deadline:
                self.abort(WaitTimeout(
                    f"sequence worker {rank} on {self.devices[rank]} did not finish {task.label} within "
                    f"{self.timeout_s:.0f} s"), rank)
                break
        self.raise_failure()
        return task.result

    def raise_failure(self) -> None:
        if self._failure is not None:
            raise self._failure from self._failure.__cause__

    def abort(self, error: BaseException, rank: int, label: str = "") -> None:
        """Record the first failure and stop every worker at its next task or exchange."""
        with self._lock:
            if self._failure is None:
                where = f" during {label}" if label else ""
                err = RankThreadError(f"sequence worker {rank} on {self.devices[rank]} failed{where}: "
                                  f"{type(error).__name__}: {reason_of(error)}", rank, self.devices[rank])
                err.__cause__ = error
                self._failure = err
        self._abort.set()

    def close(self, timeout_s: float = 10.0) -> None:
        """Stop the threads (queued tasks are skipped) and join them."""
        self._abort.set()
        for q in self._queues:
            q.put(_STOP)
        for t in self._threads:
            t.join(timeout_s)

    def alive_threads(self) -> int:
        return sum(t.is_alive() for t in self._threads)

    # ---- worker threads ------------------------------------------------------------------------
    def _loop(self, rank: int) -> None:
        dev = self.devices[rank]
        try:
            torch.set_num_threads(self.intra_op_threads)
            if dev.type == "cuda" and torch.cuda.is_available():  # fake cuda devices in dry runs have none
                torch.cuda.set_device(dev)
        except BaseException as e:  # noqa: BLE001 - a worker that cannot start fails the forward at once
            self.abort(e, rank, "start")
        while True:
            task = self._queues[rank].get()
            if task is _STOP:
                return
            if not self._abort.is_set():
                self._run(rank, task)
            # nothing of a finished task stays alive here until the next one comes (up to a step
            # later): its closure holds every rank's output rows, and the engine's pending list and
            # the closure reference each other, so only clearing ``fn`` frees them without a GC pass
            task.fn = None
            task.done.set()
            task = None

    def _run(self, rank: int, task: _Task) -> None:
        ctx = self.worker_context() if self.worker_context is not None else contextlib.nullcontext()
        serial = self.serial_lock if self.serial_lock is not None else contextlib.nullcontext()
        try:
            with serial, ctx, task.state(self.devices[rank]):
                task.result = task.fn()
        except RanksAborted:
            pass
        except BaseException as e:  # noqa: BLE001 - every failure must reach the main thread
            self.abort(e, rank, task.label)
            task.error = e


class ThreadExchange:
    """All-to-all between the ranks of one group, all in one process (threads): an ``Exchange``
    (``interfaces``).

    ``all_to_all(pos, parts)``: the rank at position ``pos`` posts ``parts[j]`` for position ``j``
    and returns what every position posted for it, in position order, moved to its own device.
    Calls are matched by a per-position sequence number, so ranks never wait for a slot to be
    freed; each waits only until every position has posted for that call.

    The pipelined exchange (``ulysses``, ``pipeline_chunks() > 1``: GPU ranks) uses ``start`` and
    ``settle`` instead: the same rendezvous of the host threads, but the copies run on an exchange
    stream of the receiving rank, ordered by events (``stream.EXCHANGE_WAITS``), so they overlap the
    attention on the compute stream. ``ops`` (``sequence/ops.TorchOps``, or a test's
    ``record.RecordingOps``) and ``places`` (one per position) say where.
    """

    def __init__(self, devices, pool: RankThreads, ops=None, places=None, chunks: int | None = None):
        self.devices = tuple(torch.device(d) for d in devices)
        self.pool = pool
        self.ops = ops if ops is not None else TorchOps()
        self.places = tuple(places) if places is not None else tuple(self.ops.home(d) for d in self.devices)
        self.chunks = chunks
        """Head chunks of the pipelined exchange; None: ``PIPELINE_CHUNKS`` where every position is a
        GPU (asynchronous streams), else 1 (CPU ranks, fake devices: the unpipelined exchange)."""
        self._xstreams: dict[int, object] = {}
        self._cond = threading.Condition()
        self._posts: dict[int, list] = {}
        self._reads: dict[int, int] = {}
        self._seq = [0] * len(self.devices)
        self.bytes_received = [0] * len(self.devices)
        self.bytes_sent = [0] * len(self.devices)
        """Bytes that left this process: none (``Exchange`` counters; ``DistExchange`` counts some)."""
        self.calls = [0] * len(self.devices)

    def pipeline_chunks(self) -> int:
        """Head chunks ``ulysses`` may pipeline over this exchange (see ``chunks``)."""
        if self.chunks is not None:
            return int(self.chunks)
        return PIPELINE_CHUNKS if all(self.ops.is_async(p) for p in self.places) else 1

    def all_to_all(self, pos: int, parts: list, expect=None):
        n = len(self.devices)
        assert len(parts) == n, f"{len(parts)} parts for {n} positions"
        posts = self._rendezvous(pos, (parts, _stream_of(self.devices[pos])))
        mine = [posts[j][0][pos] for j in range(n)]
        streams = [posts[j][1] for j in range(n)]
        dev = self.devices[pos]
        _check_streams(self.devices, streams, pos)
        out = [_to(m, dev) for m in mine]
        self.calls[pos] += 1
        self.bytes_received[pos] += sum(_nbytes(m) for j, m in enumerate(mine) if j != pos)
        return out

    def start(self, pos: int, parts: list, label: str = "exchange") -> tuple[list, object]:
        """Post ``parts`` (``parts[j]`` for position ``j``: tuples of tensors, or None, made on this
        rank's compute stream) and queue, on this rank's exchange stream, the copies of what every
        other position posted for this one. Returns ``(received, done)`` at once: the received
        tuples in position order (this rank's own part as it is) and the event of their copies;
        nothing waits for them until the caller makes its compute stream wait for ``done``."""
        n, ops, place = len(self.devices), self.ops, self.places[pos]
        assert len(parts) == n, f"{len(parts)} parts for {n} positions"
        cur = ops.current_stream(place)
        posts = self._rendezvous(pos, (parts, ops.record(cur)))  # made: all queued on cur so far
        x = self._xstream(pos)
        received, copies = [], []
        for j in range(n):
            part = posts[j][0][pos]
            if j == pos:
                received.append(part)
                continue
            dsts = tuple(None if t is None else ops.empty_like(t, place) for t in part)  # allocated on cur
            received.append(dsts)
            copies.append((j, part, dsts))
        if wait_on("exchange_waits_alloc"):  # the buffers' memory may still be read by work queued on cur
            ops.wait(x, ops.record(cur))
        for j, part, dsts in copies:
            if wait_on("exchange_waits_poster"):  # what position j posted is made on its compute stream
                ops.wait(x, posts[j][1])
            pairs = [(d, t) for d, t in zip(dsts, part, strict=True) if t is not None]
            ops.copy([d for d, _ in pairs], [t for _, t in pairs], x, f"{label} from {j}")
            self.bytes_received[pos] += _nbytes(part)
        self.calls[pos] += 1
        return received, ops.record(x)

    def settle(self, pos: int) -> None:
        """After this rank queued its last copies of a pipelined exchange: its compute stream waits
        for every position's exchange stream, whose copies read what this rank posted, before that
        memory is reused (host threads meet once more; no GPU work waits on the host)."""
        ops = self.ops
        events = self._rendezvous(pos, ops.record(self._xstream(pos)))
        if wait_on("reuse_waits_readers"):
            cur = ops.current_stream(self.places[pos])
            for event in events:
                ops.wait(cur, event)

    def _xstream(self, pos: int):
        if pos not in self._xstreams:
            self._xstreams[pos] = self.ops.side_stream(self.places[pos])
        return self._xstreams[pos]

    def _rendezvous(self, pos: int, post) -> list:
        """Post ``post`` for the next call of position ``pos``; every position's post of that call."""
        n = len(self.devices)
        call = self._seq[pos]
        self._seq[pos] += 1
        deadline = time.monotonic() + self.pool.timeout_s
        serial = self.pool.serial_lock
        if serial is not None:
            serial.release()
        try:
            with self._cond:
                posts = self._posts.setdefault(call, [None] * n)
                posts[pos] = (post,)
                self._cond.notify_all()
                while any(p is None for p in posts):
                    if self.pool.aborted:
                        raise RanksAborted()
                    if time.monotonic() > deadline:
                        raise WaitTimeout(f"exchange {call}: position {pos} waited "
                                          f"{self.pool.timeout_s:.0f} s for the others")
                    self._cond.wait(0.05)
                out = [p[0] for p in posts]
                self._reads[call] = self._reads.get(call, 0) + 1
                if self._reads[call] == n:
                    del self._posts[call], self._reads[call]
        finally:
            if serial is not None:
                serial.acquire()
        return out


def _stream_of(device):
    return torch.cuda.current_stream(device) if real_cuda(device) else None


def _check_streams(devices, streams, pos: int) -> None:
    """Parts cross threads with no event: right only while the poster queued them on the stream
    this thread uses for the poster's device (``RankThreads`` makes every thread use the main
    thread's); say so loudly if anything changed that."""
    for device, stream in zip(devices, streams, strict=True):
        if stream is not None and _stream_of(device) != stream:
            raise RunError(f"exchange position {pos}: parts from {device} were queued on {stream}, "
                           f"but this thread reads {device} on {_stream_of(device)}; every worker must run on "
                           "the main thread's current stream (RankThreads sets it)")


def _to(obj, dev):
    return map_tensors(lambda t: t if t.device == dev else t.to(dev, non_blocking=dev.type == "cuda"), obj,
                       dicts=False)


def _nbytes(obj) -> int:
    return sum(t.numel() * t.element_size() for t in tensors_in(obj, dicts=False))
