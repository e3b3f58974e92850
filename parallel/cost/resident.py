"""Which streamed blocks a `sequence` rank keeps resident, and what it still streams (pure, no torch).

A rank streams every block its device does not own. With a byte budget (``loaders/comfy/shard/resident_budgets``
at sampling time, the room beside the plan in ``plan``) it keeps some of them as copies of their
own, in the order the forward first needs them (block order): a block is kept when it fits in what
the budget has left, else it streams and the next block is tried (``sequence/stream.BlockStream``
keeps them the same way). One rule for the plan, the runtime ``auto`` choice and the cost model, so
all three price the same streamed bytes per step (after the first step, which copies them once).
"""
from __future__ import annotations

from collections.abc import Sequence
from ..errors import InputError


__all__ = ["describe_resident", "kept_blocks", "resident_per_rank"]


def kept_blocks(block_bytes: Sequence[int], block_devices: Sequence[str], device: str, budget: int) -> tuple[int, ...]:
    """Indices of the blocks ``device`` streams (owned elsewhere) that it keeps within ``budget`` bytes."""
    if len(block_bytes) != len(block_devices):
        raise InputError(f"block_bytes ({len(block_bytes)}) and block_devices ({len(block_devices)}) must give one "
                         "entry per block, in block order")
    left, kept = max(0, int(budget)), []
    for i, (nbytes, owner) in enumerate(zip(block_bytes, block_devices)):
        if owner != device and int(nbytes) <= left:
            left -= int(nbytes)
            kept.append(i)
    return tuple(kept)


def resident_per_rank(block_bytes, block_devices, ranks: Sequence[str], budgets: Sequence[int]) -> tuple:
    """``kept_blocks`` for each rank (``ranks``: its device, ``budgets``: its bytes), in rank order."""
    if len(ranks) != len(budgets):
        raise InputError(f"resident budgets {list(budgets)} must be one byte count per rank ({len(ranks)})")
    return tuple(kept_blocks(block_bytes, block_devices, d, b) for d, b in zip(ranks, budgets))


def describe_resident(block_devices: Sequence[str], ranks: Sequence[str], resident) -> str:
    """One clause: ``every block resident on every GPU, nothing streamed after the first step`` or
    ``resident/streamed blocks per GPU: cuda:0 9/11, ...``; '' when no rank keeps any."""
    per = []
    for d, kept in zip(ranks, resident):
        streamed = sum(1 for o in block_devices if o != d)
        per.append((d, len(kept), streamed))
    if not any(k for _, k, _ in per):
        return ""
    if all(k == s for _, k, s in per):
        return "with every block resident on every GPU: nothing streamed after the first step"
    return "resident blocks: " + ", ".join(f"{d} keeps {k}, streams {s - k}" for d, k, s in per)
