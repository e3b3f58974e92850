"""Contiguous block ranges balanced by shares under per-device capacities (pure maths).

Why not accelerate's ``infer_auto_device_map`` / ``get_balanced_memory``: they size and assign
*modules* (we already have byte counts from sizing), fill devices in order up to ``max_memory``
rather than splitting proportionally, know no per-device activation headroom, no user weights
(``cuda:0:3,cuda:1:1``) and no repeated devices (``cpu,cpu``). What is left is this small
function: contiguous ranges whose byte sums follow the shares as closely as whole blocks allow,
never exceeding a capacity, found whenever any contiguous assignment fits.
"""
from __future__ import annotations

import bisect
import math
from collections.abc import Sequence

__all__ = ["compute_block_ranges"]


def compute_block_ranges(
    block_bytes: Sequence[int], shares: Sequence[float], caps: Sequence[float] | None = None
) -> tuple[tuple[int, int], ...] | None:
    """``(start, stop)`` per share, in order, covering ``range(len(block_bytes))``.

    Entry i gets the contiguous blocks whose cumulative bytes end closest to
    ``total * (shares[0] + ... + shares[i]) / sum(shares)`` (ties: the earlier boundary), moved
    only as far as needed to respect ``caps`` (bytes entry i may hold; None = unlimited). Returns
    None when no contiguous assignment fits the caps. Ranges may be empty.
    """
    assert len(shares) > 0 and all(s >= 0 for s in shares) and sum(shares) > 0, shares
    top = max(shares)
    shares = [s / top for s in shares]  # each <= 1: their sum cannot overflow (1e308 + 1e308 = inf)
    caps = [math.inf] * len(shares) if caps is None else [max(c, 0) for c in caps]
    cum = [0]
    for size in block_bytes:
        cum.append(cum[-1] + size)
    floors = _compute_suffix_starts(cum, caps)
    if floors[0] != 0:
        return None
    total_share, acc, start, ranges = sum(shares), 0.0, 0, []
    for i, share in enumerate(shares):
        acc += share
        target = cum[-1] * acc / total_share
        lo = max(start, floors[i + 1])
        hi = bisect.bisect_right(cum, cum[start] + caps[i]) - 1
        stop = min(range(lo, hi + 1), key=lambda s: (abs(cum[s] - target), s))
        ranges.append((start, stop))
        start = stop
    assert start == len(block_bytes)
    return tuple(ranges)


def _compute_suffix_starts(cum: Sequence[int], caps: Sequence[float]) -> list[int]:
    """floors[i]: smallest block index from which entries i.. can hold all remaining blocks.

    Filled back to front, each entry taking as many blocks as fit (that greedy packs the longest
    suffix). ``floors[len(caps)] == n``; the whole assignment is feasible iff ``floors[0] == 0``.
    """
    n = len(cum) - 1
    floors = [n] * (len(caps) + 1)
    for i in range(len(caps) - 1, -1, -1):
        s = floors[i + 1]
        while s > 0 and cum[floors[i + 1]] - cum[s - 1] <= caps[i]:
            s -= 1
        floors[i] = s
    return floors
