"""Which parallel mode a sharded DiT runs in: `blocks` (capacity) or `sequence` (speed). Pure.

- ``blocks``: each block computes on the device that owns it; the hidden state hops at device
  boundaries; one device works at a time. Costs nothing beyond the weights.
- ``sequence``: every device computes every block on its share of the batch and tokens; blocks a
  device does not own are streamed from their owner two at a time. Costs two blocks of prefetch
  buffers per device and the attention exchanges.

``decide_parallel`` is the one place ``auto`` is decided (the cost model refines it).
"""
from __future__ import annotations

from dataclasses import dataclass

from .inventory import GiB

__all__ = ["DEFAULT_PARALLEL", "PARALLEL_MODES", "ModeDecision", "decide_parallel", "check_parallel", "prefetch_bytes"]

PARALLEL_MODES = ("auto", "blocks", "sequence")
DEFAULT_PARALLEL = "auto"


@dataclass(frozen=True)
class ModeDecision:
    mode: str
    """``blocks`` or ``sequence``."""
    reason: str
    """One line for the log and the plan."""


def check_parallel(value: str) -> str:
    v = str(value).strip().lower()
    if v not in PARALLEL_MODES:
        raise ValueError(f"[ShardDiT] parallel {value!r} is not one of {', '.join(PARALLEL_MODES)}: "
                         "'blocks' adds capacity, 'sequence' adds speed, 'auto' picks")
    return v


def prefetch_bytes(block_bytes) -> int:
    """Room a `sequence` rank needs for streamed blocks: two buffers of the largest block."""
    return 2 * max(block_bytes, default=0)


def decide_parallel(requested: str, plan, footprint, inventory, reserve_bytes: int = 0) -> ModeDecision:
    """``blocks`` or ``sequence`` for ``plan`` (a ``Plan``), with the reason."""
    requested = check_parallel(requested)
    ranks = [r.device for r in plan.block_ranges]
    if requested == "blocks":
        return ModeDecision("blocks", "blocks: requested (capacity; one device computes at a time)")
    if requested == "sequence":
        if len(ranks) < 2:
            return ModeDecision("blocks", f"blocks: sequence needs two or more DiT devices, the plan has {ranks}")
        return ModeDecision("sequence", f"sequence: requested, every step on {len(ranks)} devices ({','.join(ranks)})")
    gpus = sorted({d for d in ranks if d.startswith("cuda")})
    if len(gpus) < 2:
        return ModeDecision("blocks", f"blocks: sequence pays only with two or more GPUs (DiT on {','.join(ranks)})")
    need = prefetch_bytes(footprint.block_bytes)
    loads = {load.device: load for load in plan.loads}
    for d in gpus:
        load = loads[d]
        room = inventory.get(d).available_bytes - reserve_bytes - load.weight_bytes - load.activation_bytes
        if room < need:
            return ModeDecision("blocks", f"blocks: {d} has {room / GiB:.1f} GiB left after its share, sequence "
                                          f"needs {need / GiB:.1f} GiB more for two streamed blocks")
    return ModeDecision("sequence", f"sequence: {len(gpus)} GPUs each hold their share plus two streamed blocks "
                                    f"({need / GiB:.1f} GiB); every GPU computes every step")
