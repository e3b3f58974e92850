"""``DistExchange``: the all-to-all of ``sequence.threads.ThreadExchange`` across processes (pure PyTorch).

Same call, ``all_to_all(pos, parts, expect) -> list`` (what every position sent this one, in
position order, on its device), but a batch group's positions live in several processes, one or more
each (the host may hold two GPUs of a group whose other positions are workers). This process's
threads meet; parts between two of them are handed over in memory; the last to arrive sends every
part bound for another process in one ``all_to_all_single`` of the raw bytes (``wire``), bundled
per process, on the group's own process group. Bytes go as they are, so a split forward stays
bit-identical to the local one. The receive sizes follow from ``expect`` (the dtypes and shapes
each position sends this one, which Ulysses attention knows), so no header travels and no host
sync waits for one.

Every collective is posted asynchronously, in its turn of ``order.CollectiveOrder`` when given,
and waited on for at most the group's timeout. A failure raises ``DistPeerError`` naming every
remote peer of the group in every local thread (later calls fail at once); a local thread that
does not arrive in time, or an aborted pool, stops the others (``TimeoutError`` /
``sequence.threads.RanksAborted``).
"""
from __future__ import annotations

import contextlib
import datetime
import threading
import time

import torch
import torch.distributed as dist

from ..tensor_map import rebuild
from .wire import expect_sizes, pack_parts, part_items, receive_buffer, unpack_expected
from .order import serial_released
from ..sequence.threads import RanksAborted
from ..errors import InputError, RunError, WaitTimeout, reason_of

__all__ = ["DistExchange", "DistPeerError"]


class DistPeerError(RunError):
    """A torch.distributed operation with remote ranks failed or timed out."""


class _Round:
    """One all-to-all call of the local positions: their posts, then the leader's outcome."""

    __slots__ = ("done", "error", "expects", "got", "posted_at", "posts", "reads")

    def __init__(self):
        self.posts: dict[int, list] = {}
        self.expects: dict[int, list | None] = {}
        self.posted_at = 0.0
        self.got: dict[tuple[int, int], tuple] = {}
        """(source, local destination) -> items received from another process, on the wire device."""
        self.error: BaseException | None = None
        self.done = False
        self.reads = 0


class DistExchange:
    """An ``Exchange`` (``sequence.interfaces``) between positions of one batch group spread over
    processes. ``group_ranks[p]``: the global rank holding position ``p`` (repeated when a process
    holds several); ``device``: this process's one position's device, or ``{position: device}``
    (one calling thread each); ``peers[p]``: position ``p``'s label in errors; ``pool``: the
    ``RankThreads`` whose abort stops a wait; ``order``: the process's ``CollectiveOrder``.
    Counters per position: ``bytes_received`` (as ``ThreadExchange`` counts), ``bytes_sent``
    (bytes that left this process), ``calls``."""

    def __init__(self, group, group_ranks: list[int], device, peers: list[str], timeout_s: float,
                 backend: str = "gloo", pool=None, order=None):
        n = len(group_ranks)
        self.group = group
        self.group_ranks = list(group_ranks)
        self.devices = _local_devices(device, self.group_ranks)
        self.local = sorted(self.devices)
        self.rank = self.group_ranks[self.local[0]]
        self.procs = sorted(set(self.group_ranks))  # torch numbers a group's ranks in ascending global order
        self.device = self.devices[self.local[0]]
        self.wire = torch.device("cpu") if backend == "gloo" else self.device
        """Where the bytes travel from: gloo sends host memory (a GPU rank stages through it), NCCL
        sends from the GPU (this process's first position's)."""
        self.peers = list(peers)
        self.timeout_s = timeout_s
        self.pool = pool
        self.order = order
        """``order.CollectiveOrder`` every all-to-all is posted through (None: posted at once)."""
        self.bytes_received = [0] * n
        self.bytes_sent = [0] * n
        self.calls = [0] * n
        self._seq = dict.fromkeys(self.local, 0)
        self._cond = threading.Condition()
        self._rounds: dict[int, _Round] = {}
        self._broken: str | None = None

    def positions_of(self, rank: int) -> list[int]:
        return [p for p, r in enumerate(self.group_ranks) if r == rank]

    def all_to_all(self, pos: int, parts: list, expect=None):
        """What every position sent ``pos``; ``expect[j]``: the items position ``j`` sends ``pos`` as
        (dtype, shape) or None. Required across processes (``expect=None`` is the in-process
        exchange's signature): the receive sizes come from it, never from a peer."""
        n = len(self.group_ranks)
        assert len(parts) == n and expect is not None and len(expect) == n, f"{len(parts)} parts for {n} positions"
        assert pos in self.devices, f"position {pos} is not in this process (local: {self.local})"
        call = self._seq[pos]
        self._seq[pos] += 1
        with serial_released(self.pool):
            rnd, leader = self._meet(call, pos, parts, expect)
        if leader:
            self._lead(call, rnd)
        else:
            with serial_released(self.pool):
                self._await(call, pos, rnd)
        if rnd.error is not None:
            raise DistPeerError(str(rnd.error)) from rnd.error.__cause__
        return self._collect(call, pos, parts, rnd)

    # ---- the local threads meet ----------------------------------------------------------------
    def _meet(self, call: int, pos: int, parts: list, expect) -> tuple[_Round, bool]:
        """Post ``parts``; True for the last local position to post (it does the transfer)."""
        deadline = time.monotonic() + self.timeout_s
        with self._cond:
            self._check(call)
            rnd = self._rounds.setdefault(call, _Round())
            rnd.posts[pos] = parts
            rnd.expects[pos] = expect
            if len(rnd.posts) == len(self.local):
                rnd.posted_at = time.monotonic()
                return rnd, True
            while len(rnd.posts) < len(self.local):
                self._check(call)
                if time.monotonic() > deadline:
                    missing = [p for p in self.local if p not in rnd.posts]
                    self._broken = (f"attention exchange {call}: position {pos} waited "
                                    f"{self.timeout_s:.0f} s for position(s) {missing} of this process")
                    self._cond.notify_all()
                    raise WaitTimeout(self._broken)
                self._cond.wait(0.05)
            return rnd, False

    def _await(self, call: int, pos: int, rnd: _Round) -> None:
        """Wait for the leader's transfer (it ends within the group's timeout, or fails)."""
        deadline = rnd.posted_at + self.timeout_s + max(10.0, self.timeout_s)
        with self._cond:
            while not rnd.done:
                self._check(call)
                if time.monotonic() > deadline:
                    rnd.error = DistPeerError(self._failure(call, "no answer"))
                    self._broken = rnd.error.reason
                    self._cond.notify_all()
                    return
                self._cond.wait(0.05)

    def _check(self, call: int) -> None:
        if self.pool is not None and self.pool.aborted:
            raise RanksAborted()
        if self._broken is not None:
            raise DistPeerError(f"attention exchange {call} not started: an earlier one failed "
                                f"({self._broken})")

    # ---- the last local thread to arrive moves the bytes -----------------------------------------
    def _lead(self, call: int, rnd: _Round) -> None:
        try:
            ctx = torch.cuda.device(self.wire) if self.wire.type == "cuda" else contextlib.nullcontext()
            with ctx:
                rnd.got = self._transfer(call, rnd.posts, rnd.expects)
        except Exception as e:  # noqa: BLE001 - every local thread raises it as DistPeerError
            err = DistPeerError(self._failure(call, f"{type(e).__name__}: {(reason_of(e).splitlines() or [''])[0]}"))
            err.__cause__ = e
            rnd.error = err
        with self._cond:
            if rnd.error is not None:
                self._broken = rnd.error.reason
            rnd.done = True
            self._cond.notify_all()

    def _transfer(self, call: int, posts: dict[int, list], expects: dict) -> dict[tuple[int, int], tuple]:
        """One byte all-to-all carrying every local->remote part, its sizes from ``expects``."""
        sends = [self._pairs(self.local, self.positions_of(r)) if r != self.rank else [] for r in self.procs]
        recvs = [self._pairs(self.positions_of(r), self.local) if r != self.rank else [] for r in self.procs]
        flat = [posts[i][j] for pairs in sends for i, j in pairs]
        pairs_in = [pair for pairs in recvs for pair in pairs]
        data, sizes = pack_parts(flat, list(range(len(flat))), self.wire)
        specs = [[_spec(s) for s in expects[j][i]] for i, j in pairs_in]
        in_sizes = expect_sizes(specs)
        data_in = receive_buffer(sum(in_sizes), self.wire, self.devices.values())
        self._collective(data_in, data, _per_proc(in_sizes, recvs), _per_proc(sizes, sends))
        dests = [self.devices[j] for _, j in pairs_in]  # each part lands on its position's device
        got = unpack_expected(specs, data_in, dests)
        with self._cond:
            for (i, j), size in zip([p for pairs in sends for p in pairs], sizes, strict=True):
                self.bytes_sent[i] += size
            for (i, j), size in zip(pairs_in, in_sizes, strict=True):
                self.bytes_received[j] += size
        return dict(zip(pairs_in, got, strict=True))

    def _collective(self, out, inp, out_sizes: list[int], in_sizes: list[int]) -> None:
        """One ``all_to_all_single``, posted asynchronously and waited on for at most the timeout
        (a dead peer on NCCL would otherwise block this thread, and a host sync, forever)."""
        def post():
            return dist.all_to_all_single(out, inp, output_split_sizes=out_sizes, input_split_sizes=in_sizes,
                                          group=self.group, async_op=True)
        work = post() if self.order is None else self.order.post(f"all_to_all of processes {self.procs}", post)
        if not work.wait(datetime.timedelta(seconds=self.timeout_s)):
            raise WaitTimeout(f"all_to_all not done within {self.timeout_s:.0f} s")

    @staticmethod
    def _pairs(sources: list[int], dests: list[int]) -> list[tuple[int, int]]:
        return [(i, j) for i in sources for j in dests]

    def _failure(self, call: int, why: str) -> str:
        others = [p for i, p in enumerate(self.peers) if self.group_ranks[i] != self.rank]
        return (f"attention exchange {call} with {', '.join(others)} failed "
                f"(dead, or silent for {self.timeout_s:.0f} s): {why}")

    # ---- every local thread takes its parts ------------------------------------------------------
    def _collect(self, call: int, pos: int, parts: list, rnd: _Round) -> list:
        dev = self.devices[pos]
        out = []
        local_bytes = 0
        for j, template in enumerate(parts):
            if j in self.devices:
                items = part_items(rnd.posts[j][pos])
                if j != pos:
                    local_bytes += sum(t.numel() * t.element_size() for t in items if t is not None)
            else:
                items = rnd.got[(j, pos)]
            out.append(_restore(template, tuple(_to(t, dev) for t in items)))
        with self._cond:
            self.bytes_received[pos] += local_bytes
            self.calls[pos] += 1
            rnd.reads += 1
            if rnd.reads == len(self.local):
                del self._rounds[call]
        return out


def _local_devices(device, group_ranks: list[int]) -> dict[int, torch.device]:
    if isinstance(device, dict):
        devices = {int(p): torch.device(d) for p, d in device.items()}
    else:
        me = dist.get_rank()
        mine = [p for p, r in enumerate(group_ranks) if r == me]
        if len(mine) != 1:
            raise InputError(f"distributed exchange: rank {me} holds positions {mine} of group ranks "
                             f"{group_ranks}; pass device as {{position: device}} for this process's positions")
        devices = {mine[0]: torch.device(device)}
    ranks = {group_ranks[p] for p in devices}
    if not devices or len(ranks) != 1:
        raise InputError(f"distributed exchange: local positions {sorted(devices)} belong to processes "
                         f"{sorted(ranks)} of group ranks {group_ranks}; list the positions of exactly one process")
    return devices


def _per_proc(sizes: list[int], pairs_per_proc: list[list]) -> list[int]:
    """Byte counts per process out of byte counts per pair (pairs listed process by process)."""
    out, k = [], 0
    for pairs in pairs_per_proc:
        out.append(sum(sizes[k:k + len(pairs)]))
        k += len(pairs)
    return out


def _to(t, dev):
    if t is None or t.device == dev:
        return t
    return t.to(dev, non_blocking=dev.type == "cuda")


def _restore(template, items: tuple):
    """Received items in the container type the sender used (a lone tensor stays a tensor)."""
    if isinstance(template, torch.Tensor):
        return items[0]
    if template is None:
        return None
    return rebuild(template, items)


def _spec(s):
    """An expected item as (dtype, shape), or None."""
    return None if s is None else (s[0], tuple(s[1]))
