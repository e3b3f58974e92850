"""``CollectiveOrder``: one order for every collective a process posts in a distributed forward (pure PyTorch).

NCCL matches the collectives of one communicator by their order and runs each communicator on its
own stream; with several communicators it promises progress only when every process posts them in
one consistent order. A distributed `sequence` forward uses several: the weight broadcasts
(``all``: the host sends a block it owns; ``workers``: a worker sends one) and the attention
exchanges (``all_to_all_single`` per batch group). On the host they come from different threads
(the designated proxy thread posts the broadcasts, the ``DistExchange`` leaders the exchanges), so
without a rule their order followed thread timing, and under NCCL a worker posting them in another
order could wait on the host forever.

**The rule.** A forward's block calls are numbered by *step* (every rank runs every block call, in
the same order). For each step ``s`` every process posts ``W(s)`` (its part of the weight
broadcasts posted with step ``s``'s block command, in block order), then ``X(s)`` (its exchanges
of step ``s``, in call order), and ``W(s) < X(s) < W(s + 1)``. A worker does so by construction
(one thread). On the host an exchange of step ``s`` waits until ``W(s)`` is closed, and
``W(s + 1)`` waits until every local rank that exchanges with workers (an *exchanger*) has
finished step ``s``. Two batch groups' exchanges within one step may interleave on the host: no
other process is in two exchange groups (a worker serves one rank, a rank is in one batch group),
so no cycle can form. Each post also checks the rule (a post behind an earlier one raises instead
of hanging NCCL).

Waits end when the rank pool aborts (``RanksAborted``) or after the session's timeout
(``TimeoutError`` naming the step).
"""
from __future__ import annotations

import contextlib
import threading
import time

from ..sequence.threads import RanksAborted
from ..errors import RunError, WaitTimeout

__all__ = ["EXCHANGE", "WEIGHTS", "CollectiveOrder", "serial_released"]

WEIGHTS, EXCHANGE = 0, 1
"""Phases of a step, in posting order."""


class CollectiveOrder:
    """The order of one process's collectives in one forward (see the module docstring).

    ``weights(step)``: context of the one thread that posts this process's weight broadcasts of
    ``step``; ``exchanging(who, step)``: context of an exchanger running ``step`` (``who`` added
    first with ``add_exchanger``); ``post(what, fn)``: runs ``fn`` (which posts one collective) in
    its turn, from inside one of those contexts. ``posted``: ``(step, phase, what)`` of every post.
    """

    def __init__(self, timeout_s: float = 600.0, pool=None):
        self.timeout_s, self.pool = timeout_s, pool
        self._cond = threading.Condition()
        self._post_lock = threading.Lock()
        self._local = threading.local()
        self._weights_done = -1
        self._finished: dict = {}
        self._last = (-1, EXCHANGE)
        self.posted: list[tuple[int, int, str]] = []

    def add_exchanger(self, who) -> None:
        """``who`` (a rank) posts exchanges this forward: ``W(s + 1)`` waits for it to finish ``s``."""
        with self._cond:
            self._finished.setdefault(who, -1)

    @contextlib.contextmanager
    def weights(self, step: int):
        self._wait(lambda: all(f >= step - 1 for f in self._finished.values()),
                   f"the weight broadcasts of step {step} waited for the exchanges of step {step - 1}")
        try:
            with self._in(step, WEIGHTS):
                yield
        finally:
            with self._cond:
                self._weights_done = max(self._weights_done, step)
                self._cond.notify_all()

    @contextlib.contextmanager
    def exchanging(self, who, step: int):
        try:
            with self._in(step, EXCHANGE):
                yield
        finally:
            with self._cond:
                self._finished[who] = max(self._finished.get(who, -1), step)
                self._cond.notify_all()

    def post(self, what: str, fn):
        """``fn()`` (posting one collective) once the rule allows it; its result."""
        step, phase = getattr(self._local, "at", (None, None))
        if step is None:
            raise RunError(f"collective {what} posted outside a step of the forward's order")
        if phase == EXCHANGE:
            self._wait(lambda: self._weights_done >= step,
                       f"exchange {what} of step {step} waited for that step's weight broadcasts")
        with self._post_lock:
            if (step, phase) < self._last:
                raise RunError(f"collective {what} of step {step} (phase {phase}) posted after one "
                               f"of step {self._last[0]} (phase {self._last[1]}): the processes' orders would differ")
            self._last = (step, phase)
            self.posted.append((step, phase, what))
            return fn()

    @contextlib.contextmanager
    def _in(self, step: int, phase: int):
        before = getattr(self._local, "at", None)
        self._local.at = (step, phase)
        try:
            yield
        finally:
            self._local.at = before

    def _wait(self, ready, what: str) -> None:
        with self._cond:
            if ready():
                return
        deadline = time.monotonic() + self.timeout_s
        with serial_released(self.pool), self._cond:
            while not ready():
                if self.pool is not None and self.pool.aborted:
                    raise RanksAborted()
                if time.monotonic() > deadline:
                    raise WaitTimeout(f"{what} for {self.timeout_s:.0f} s")
                self._cond.wait(0.05)


@contextlib.contextmanager
def serial_released(pool):
    """Dry runs on fake devices (``pool.serial_lock``): the other rank threads run while this one waits."""
    serial = getattr(pool, "serial_lock", None)
    if serial is not None:
        serial.release()
    try:
        yield
    finally:
        if serial is not None:
            serial.acquire()
