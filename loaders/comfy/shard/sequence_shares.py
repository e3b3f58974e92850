"""How much of each `sequence` batch group's tokens and heads each GPU takes (issue 34, part 2).

By default every rank of a group gets an even share, so on mixed cards (a 5090 beside a 4090) the
fastest waits for the slowest at every block. The shares follow, in this order:

1. the ``devices`` weights the user gave (``cuda:0:3,cuda:1:1``: they already shape the `blocks`
   placement; in `sequence` they are the ranks' relative speeds);
2. else each GPU's throughput from the cost model's table, by its NVML name, when every rank is a
   GPU the table knows and they differ;
3. else even shares.
Worker ranks (other machines) keep even shares unless weights are given. The maths of each rank is
unchanged (one contiguous token range; ``parallel/sequence/split.share_ranges``).
"""
from __future__ import annotations

import logging

from ....parallel.cost.inputs import gpu_flops, table_gpu_name
from ....parallel.placement.devices import DevicePlan

__all__ = ["describe_shares", "rank_speeds"]

log = logging.getLogger("sharddit")


def rank_speeds(listed: DevicePlan, ranks, inventory, n_remote: int = 0) -> tuple[tuple[float, ...] | None, str]:
    """(speeds per rank or None for even shares, why). ``listed``: the ``devices`` input's plan
    (its ``entries``: this machine's part); ``ranks``: the engine's devices in rank order (workers
    last, ``n_remote``)."""
    if listed.weighted and len(listed.entries) == len(ranks) - n_remote:
        weights = [e.weight for e in listed.entries] + ([min(e.weight for e in listed.entries)] * n_remote)
        return tuple(weights), "the devices' weights"
    if n_remote or any(not str(r).startswith("cuda") for r in ranks):
        return None, "even (not every rank is a GPU of this machine with a known speed)"
    names = []
    for r in ranks:
        info = next((g for g in inventory.gpus if g.device == str(r)), None) if inventory is not None else None
        if info is None or table_gpu_name(info.name) is None:
            return None, f"even ({r}'s speed is not in the throughput table)"
        names.append(info.name)
    speeds = tuple(gpu_flops(n) for n in names)
    if len(set(speeds)) <= 1:
        return None, "even (the GPUs are alike)"
    return speeds, "each GPU's throughput (" + ", ".join(f"{r} {n}" for r, n in zip(ranks, names, strict=True)) + ")"


def describe_shares(ranks, speeds) -> str:
    """``cuda:0 62%, cuda:1 38%`` for the log."""
    total = sum(speeds)
    return ", ".join(f"{r} {100 * s / total:.0f}%" for r, s in zip(ranks, speeds, strict=True))
