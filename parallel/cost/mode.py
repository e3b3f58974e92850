"""Which parallel mode a sharded DiT runs in: `blocks` (capacity) or `sequence` (speed). Pure.

- ``blocks``: each block computes on the device that owns it; the hidden state hops at device
  boundaries; one device works at a time. Costs nothing beyond the weights.
- ``sequence``: every device computes every block on its share of the batch and tokens; blocks a
  device does not own are streamed from their owner two at a time. Costs two buffers per block
  shape the device streams (``cost/memory.compute_prefetch_bytes``: HunyuanVideo's double and
  single blocks are two shapes, four buffers) and the attention exchanges.

An explicit ``sequence`` checks room exactly as ``auto`` does; where ``auto`` falls back to
``blocks``, it is refused (``ValueError`` naming the GiB missing per device and the fix) before any
weight moves.

``decide_parallel`` is the memory rule of ``auto`` (decided with the plan, at load time);
``decide_auto_for_latent`` refines it at sampling time with the cost model: `sequence` only where
it fits AND is predicted faster than `blocks` for this latent on these GPUs over this link. Given
core's options on the same GPUs (``cost/baselines.CoreSetup``), its reason also names those
predicted as fast or faster (never picked: the MODEL is ShardDiT's already).
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from .baselines import compare_with_core, core_baselines, estimate_activation_bytes
from .inputs import DEFAULT_GPU, ModelShape, table_gpu_name
from .memory import compute_prefetch_bytes, format_bytes
from .model import (
    Workload,
    estimate_costs,
    estimate_sequence_lean,
    hardware_from_options,
)
from .report import choose_strategy
from .resident import describe_resident
from ..errors import InputError

__all__ = [
    "DEFAULT_PARALLEL",
    "PARALLEL_MODES",
    "ModeDecision",
    "check_parallel",
    "decide_auto_for_latent",
    "decide_parallel",
    "prefetch_bytes",
    "sequence_shortfalls",
    "workload_from_latent",
]

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
        raise InputError(f"parallel {value!r} is not one of {', '.join(PARALLEL_MODES)}: "
                         "'blocks' adds capacity, 'sequence' adds speed, 'auto' picks")
    return v


def prefetch_bytes(block_bytes, block_kinds=None) -> int:
    """Room for streamed blocks that holds for any rank: two buffers per block shape, each of that
    shape's largest block (``block_kinds``: one hashable per block; None: blocks of equal bytes are
    one shape). A rank of a plan needs ``cost/memory.compute_prefetch_bytes`` of what it streams."""
    kinds = list(block_kinds) if block_kinds is not None else list(block_bytes)
    largest: dict = {}
    for nbytes, kind in zip(block_bytes, kinds, strict=True):
        largest[kind] = max(largest.get(kind, 0), int(nbytes))
    return 2 * sum(largest.values())


def decide_parallel(requested: str, plan, footprint, inventory, reserve_bytes: int = 0,
                    block_kinds=None) -> ModeDecision:
    """``blocks`` or ``sequence`` for ``plan`` (a ``Plan``), with the reason. ``requested`` ``sequence``
    with a ``footprint`` and ``inventory`` raises ``ValueError`` (GiB missing per device) where
    ``auto`` would fall back to ``blocks`` for want of room; without them it is not checked."""
    requested = check_parallel(requested)
    ranks = [r.device for r in plan.block_ranges]
    if requested == "blocks":
        return ModeDecision("blocks", "blocks: requested (capacity; one device computes at a time)")
    if requested == "sequence" and len(ranks) < 2:
        return ModeDecision("blocks", f"blocks: sequence needs two or more DiT devices, the plan has {ranks}")
    gpus = sorted({d for d in ranks if d.startswith("cuda")})
    if requested == "auto" and len(gpus) < 2:
        return ModeDecision("blocks", f"blocks: sequence pays only with two or more GPUs (DiT on {','.join(ranks)})")
    if footprint is None or inventory is None:
        return ModeDecision("sequence", f"sequence: requested, every step on {len(ranks)} devices ({','.join(ranks)})")
    short = sequence_shortfalls(plan, footprint, inventory, reserve_bytes, block_kinds)
    if short and requested == "sequence":
        raise InputError(f"parallel 'sequence' does not fit: {'; '.join(short)}. Fix: parallel 'auto' "
                         "or 'blocks' (no streamed blocks), more or larger devices, or a lower reserve_vram_gb")
    if short:
        return ModeDecision("blocks", f"blocks: sequence does not fit: {short[0]}")
    need = format_bytes(max((_prefetch_on(plan, footprint, d, block_kinds) for d in gpus), default=0))
    if requested == "sequence":
        return ModeDecision("sequence", f"sequence: requested, every step on {len(ranks)} devices ({','.join(ranks)}); "
                                        f"streamed blocks up to {need} per GPU (two per block shape)")
    return ModeDecision("sequence", f"sequence: {len(gpus)} GPUs each hold their share plus streamed blocks (up to "
                                    f"{need}, two per block shape); every GPU computes every step")


def _prefetch_on(plan, footprint, device: str, block_kinds) -> int:
    return compute_prefetch_bytes(footprint.block_bytes, plan.block_devices(), device, block_kinds)


def sequence_shortfalls(plan, footprint, inventory, reserve_bytes: int = 0, block_kinds=None) -> list[str]:
    """Per GPU of the plan that lacks room for `sequence`: its share, the plan's activation room and
    the ring buffers of the blocks it streams, against free memory less ``reserve_bytes``; one line
    each naming the GiB missing ([] when every GPU has room). CPU ranks are not checked (RAM)."""
    loads = {load.device: load for load in plan.loads}
    out = []
    for d in sorted({r.device for r in plan.block_ranges if r.device.startswith("cuda")}):
        load, need = loads[d], _prefetch_on(plan, footprint, d, block_kinds)
        room = inventory.get(d).available_bytes - reserve_bytes - load.weight_bytes - load.activation_bytes
        if room < need:
            f = format_bytes
            out.append(f"{d} has {f(room)} left after its share ({f(load.weight_bytes)} weights + "
                       f"{f(load.activation_bytes)} activations), needs {f(need)} for its streamed blocks: "
                       f"{f(need - room)} missing")
    return out


def workload_from_latent(shape: ModelShape, latent_shape, weight_bytes: float = 2.0) -> Workload:
    """The cost model's work for one DiT call on ``latent_shape`` (batch, channels, frames, height,
    width in latent cells): batch >= 2 is cond + uncond (cfg > 1), batch 1 cond only."""
    if len(latent_shape) != 5:
        raise InputError(f"latent shape {tuple(latent_shape)} is not (batch, channels, frames, height, width): "
                         "the cost model plans video DiTs")
    b, _, t, h, w = (int(v) for v in latent_shape)
    return Workload(shape, w * shape.spatial, h * shape.spatial, (t - 1) * shape.temporal + 1,
                    cfg=2.0 if b >= 2 else 1.0, weight_bytes=weight_bytes)


def decide_auto_for_latent(memory: ModeDecision, shape: ModelShape, latent_shape, ranks, owned,
                           gpu_names, link_gbps=None, weight_bytes: float = 2.0, core=None,
                           lean: bool = False, resident=None) -> ModeDecision:
    """``auto`` for one latent: the memory rule's ``blocks`` stands; its ``sequence`` stands only
    when the cost model predicts it faster than ``blocks`` on ``ranks`` (``owned`` blocks each).

    ``gpu_names``: device -> NVML name; names not in the throughput table count as ``DEFAULT_GPU``.
    ``core``: a ``CoreSetup`` for the distinct GPUs of ``ranks`` (``activation_per_sample`` 0: estimated
    from the latent), or None (then a ``blocks`` memory decision comes back as is).
    ``lean``: `sequence` would run lean (``sequence/lean``: cond and uncond together do not fit), so
    it is priced as such (``estimate_sequence_lean``).
    ``resident``: per rank, the blocks it keeps this run (``cost/resident.resident_per_rank`` of the
    engine's budgets): `sequence` is priced with the bytes it still streams, as ``plan`` prices it.
    """
    gpus = list(dict.fromkeys(d for d in ranks if d.startswith("cuda")))
    if len(ranks) < 2 or (memory.mode != "sequence" and (core is None or len(gpus) < 2)):
        return memory
    names = [table_gpu_name(gpu_names.get(d, "")) or DEFAULT_GPU for d in ranks]
    hw = hardware_from_options(names, link_gbps=link_gbps)
    work = workload_from_latent(shape, latent_shape, weight_bytes)
    piped = all(d.startswith("cuda") for d in ranks)  # the engine pipelines its exchange between GPUs only
    costs = estimate_costs(work, hw, owned, resident=resident, pipelined=piped)
    if lean:
        costs["sequence"] = estimate_sequence_lean(work, hw, owned, resident=resident, pipelined=piped)
    decision = memory
    if memory.mode == "sequence":
        best, why = choose_strategy({k: costs[k] for k in ("blocks", "sequence")}, {"blocks": True, "sequence": True})
        how = "; sequence lean: cond and uncond together do not fit, they run in turn" if lean else ""
        kept = describe_resident([r for r, c in zip(ranks, owned) for _ in range(c)], ranks, resident) \
            if resident is not None and best == "sequence" else ""
        why = f"{why}; {kept}" if kept else why
        decision = ModeDecision(best, f"{why} ({hw.note}; memory: {memory.reason}{how})")
    if core is None or len(gpus) < 2:
        return decision
    if core.activation_per_sample <= 0:
        core = replace(core, activation_per_sample=estimate_activation_bytes(work))
    core_hw = hardware_from_options([table_gpu_name(gpu_names.get(d, "")) or DEFAULT_GPU for d in gpus],
                                    link_gbps=link_gbps)
    rows = core_baselines(work, core_hw, core, gpus)
    base = costs["one_gpu"].seconds_per_step  # the same one-GPU baseline as the decision's speed-ups
    rows = {k: replace(r, cost=replace(r.cost, speedup=base / r.cost.seconds_per_step)) for k, r in rows.items()}
    said = compare_with_core(decision.mode, costs[decision.mode], rows)
    return ModeDecision(decision.mode, f"{decision.reason}; {said}") if said else decision
