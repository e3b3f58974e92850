"""What distributed `sequence` mode asks of worker devices and of the network, before anything moves (pure).

For ``plan --devices cuda:0=24GiB,box2/cuda:0=24GiB``: every rank owns an equal share of the blocks
(``devices.DevicePlan.with_worker_shares``); a worker device must hold its share plus four blocks (two arriving,
two of activations), or every block plus two under ``SHARDDIT_DIST_WEIGHTS=all`` (the rule of
``distributed/members.choose_worker_weights``, which refuses a prompt on the same numbers). Per step each
worker receives over the network the blocks it does not own (none under ``all``), the Ulysses
exchanges (cfg 1: tokens split inside a group) and its part of the hidden state's scatter:
``cost/model.estimate_sequence(...).bytes_per_device`` with the ranks' ownership and ``replicas``.
"""
from __future__ import annotations

from dataclasses import dataclass

from .inputs import positive_number
from .model import Hardware, Workload, estimate_sequence
from ..placement.devices import split_members
from ..placement.inventory import parse_bytes
from ..units import format_gib
from ..errors import InputError, reason_of

__all__ = ["DEFAULT_NET_GBPS", "NetworkStep", "WorkerNeed", "compute_network_step", "compute_worker_needs",
           "parse_net_gbps", "split_worker_spec"]

DEFAULT_NET_GBPS = 10.0
"""Gbit/s of the network between the machines (a 10 GbE LAN)."""


@dataclass(frozen=True)
class WorkerNeed:
    """One worker device: its share of the blocks and what it must hold (bytes)."""

    name: str
    device: str
    start: int
    stop: int
    """Blocks ``start <= i < stop`` it owns."""
    share_bytes: int
    need_bytes: int
    what: str
    """What ``need_bytes`` is made of, in words."""
    free_bytes: int | None
    """Free memory stated (``=24GiB`` or the joined worker's offer); None: unknown, not checked."""

    @property
    def short_bytes(self) -> int:
        return 0 if self.free_bytes is None else max(0, self.need_bytes - self.free_bytes)

    @property
    def fits(self) -> bool:
        return self.short_bytes == 0


@dataclass(frozen=True)
class NetworkStep:
    """What crosses the network per worker and sampling step, and how long that takes."""

    bytes_per_worker: int
    seconds: float
    """``bytes_per_worker`` at ``net_gbps``."""
    compute_s: float
    """The cost model's compute on the critical path per step."""
    step_s: float
    """The cost model's seconds per step (compute, exposed streams, exchanges, scatter)."""
    net_gbps: float

    @property
    def wait_s(self) -> float:
        """Seconds per step the ranks wait for the network (not hidden behind compute)."""
        return max(0.0, self.step_s - self.compute_s)

    @property
    def bound(self) -> str:
        """``link`` (more network than compute), ``partly link`` (over a tenth of the step waits
        for it) or ``compute``."""
        if self.seconds > self.compute_s:
            return "link"
        return "partly link" if self.wait_s > 0.1 * self.step_s else "compute"

    @property
    def verdict(self) -> str:
        line = (f"{self.bound}-bound: {self.seconds:.1f} s of network per step vs ~{self.compute_s:.1f} s of compute "
                f"at {self.net_gbps:g} Gbit/s")
        if self.bound == "compute":
            return line
        return line + f" ({self.wait_s:.1f} s per step waiting for it; predicted {self.step_s:.1f} s per step)"


def parse_net_gbps(text) -> float:
    """``--net-gbps 10`` -> 10.0 (Gbit/s); ValueError naming the value otherwise."""
    value = positive_number(text)
    if value is None:
        raise InputError(f"network speed {text!r} must be a number of Gbit/s > 0, e.g. --net-gbps 10 (10 GbE) "
                         "or 100 (InfiniBand-class)")
    return value


def split_worker_spec(text: str) -> tuple[str, tuple[tuple[str, str, int | None], ...]]:
    """``"cuda:0=24GiB,box2/cuda:0=20GiB"`` -> (``"cuda:0=24GiB"``, ((``"box2"``, ``"cuda:0"``, free bytes),)).
    A worker entry without ``=SIZE`` has free None. No worker entry: (text, ())."""
    if not isinstance(text, str) or "/" not in text:
        return text, ()
    parts = [p.strip() for p in text.split(",")]
    frees = []
    for part in parts:
        if "/" in part:
            size = part.partition("=")[2].strip()
            try:
                frees.append(parse_bytes(size) if size else None)
            except ValueError as err:
                raise InputError(f"devices {text.strip()!r}: {part!r}: {reason_of(err)}") from None
    names_only = ",".join(p.partition("=")[0] if "/" in p else p for p in parts)
    _, remote = split_members(names_only)  # checks NAME/DEVICE and that a host device is listed
    local = ",".join(p for p in parts if "/" not in p)
    return local, tuple((name, dev, free) for (name, dev), free in zip(remote, frees, strict=True))


def compute_worker_needs(mode: str, workers, ranges, block_bytes) -> tuple[bool, str, tuple[WorkerNeed, ...]]:
    """(keep_all, why, one ``WorkerNeed`` per worker) for ``SHARDDIT_DIST_WEIGHTS`` ``mode``.

    ``workers``: (name, device, free bytes or None); ``ranges``: (start, stop) of each worker's
    share, in the same order. ``auto`` keeps every block when every worker's stated free memory
    holds every block plus two, else shares (as ``distributed/members.choose_worker_weights``)."""
    if mode not in ("auto", "share", "all"):
        raise InputError(f"dist weights {mode!r} must be auto, share or all")
    biggest, total = max(block_bytes, default=0), sum(block_bytes)
    every = total + 2 * biggest
    chosen = mode
    if mode == "auto":
        chosen = "all" if all(free is not None and free >= every for _, _, free in workers) else "share"
    keep_all = chosen == "all"
    needs = []
    for (name, dev, free), (start, stop) in zip(workers, ranges, strict=True):
        own = sum(block_bytes[start:stop])
        if keep_all:
            need, what = every, f"every block {format_gib(total, 2)} + activations {format_gib(2 * biggest, 2)} GiB"
        else:
            need, what = own + 4 * biggest, (f"share {format_gib(own, 2)} + receive ring and activations "
                                             f"{format_gib(4 * biggest, 2)} GiB")
        needs.append(WorkerNeed(name, dev, start, stop, own, need, what, free))
    head = f"auto -> {chosen}" if mode == "auto" else chosen
    tail = ("every worker keeps every block (sent once); nothing streams per step" if keep_all
            else "each worker keeps its share; the other blocks stream from their owners every step")
    return keep_all, f"{head}: {tail}", tuple(needs)


def compute_network_step(work: Workload, flops, owned, keep_all: bool, net_gbps: float) -> NetworkStep:
    """Bytes per worker and step from ``estimate_sequence`` over every rank (host ranks first, then
    the workers; ``flops`` and ``owned`` blocks per rank), every copy at the network's speed. The
    figure is the most any rank receives: with equal shares, each worker's."""
    net_gbps = parse_net_gbps(net_gbps)
    bytes_per_s = net_gbps * 1e9 / 8
    cost = estimate_sequence(work, Hardware(tuple(flops), bytes_per_s), list(owned), replicas=keep_all,
                             pipelined=False)  # worker processes exchange whole (``DistExchange``)
    b = cost.bytes_per_device
    return NetworkStep(b, b / bytes_per_s, cost.compute_s, cost.seconds_per_step, net_gbps)
