"""Core ComfyUI's own options on the same GPUs, from the same cost model (pure, no torch).

A user of current ComfyUI compares ShardDiT with what core does by itself:

- ``dynamic_vram`` (core 0.16+, default on NVIDIA): one GPU; the weights that do not fit stay in
  pinned host memory and are copied in every DiT call over the host link (PCIe,
  ``Hardware.host_link_bytes_per_s``). Core copies them ahead on its offload streams
  (``comfy/model_management.py`` ``get_offload_stream``), so a block's copy hides behind the
  previous block's compute: block time = max(compute, copy). The first blocks stay resident, the
  rest stream (the budget fills in execution order; the non-block part is always resident).
- ``core_cfg_split`` (core 0.23+, ``MultiGPU_WorkUnits`` / "MultiGPU CFG Split"): a full copy of
  the DiT per GPU, conds handed out round-robin: at cfg > 1 cond and uncond run at once on two
  GPUs (``estimate_sequence`` with groups of one device and replicas: nothing streamed, nothing
  exchanged); at cfg 1 there is one cond and one GPU works (1.0×). More GPUs add nothing.

``auto`` still picks among ShardDiT's modes; ``compare_with_core`` says when core's option is
predicted as fast or faster, so a user can choose it knowingly.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from .model import (
    TRANSFER_LATENCY_S,
    Hardware,
    StrategyCost,
    Workload,
    block_flops,
    block_shapes,
    estimate_one_gpu,
    estimate_sequence,
)
from .report import DevicePeak
from ..units import format_gib
from ..errors import InputError

__all__ = [
    "ACTIVATION_HIDDEN_STATES",
    "AS_FAST",
    "LABELS",
    "BaselineRow",
    "CoreSetup",
    "compare_with_core",
    "core_baselines",
    "estimate_activation_bytes",
    "estimate_core_cfg_split",
    "estimate_dynamic_vram",
]

AS_FAST = 0.05
"""Core's option counts as "as fast" when its predicted step is at most 5 % slower than ShardDiT's
pick (the cost model's calibration misses by up to 10 %; closer than 5 % is a tie)."""
ACTIVATION_HIDDEN_STATES = 9.5
"""Peak activations of one sample, in hidden states (tokens × width × activation bytes), where no
simulated peak is at hand (``auto`` at sampling time): the simulator measured Wan 2.1 14B at 2.9 GiB
(480p×81) and 6.6 GiB (720p×81), 9.3 and 9.2 hidden states."""
LABELS = {"dynamic_vram": "one GPU with dynamic VRAM", "core_cfg_split": "core's CFG split"}


@dataclass(frozen=True)
class CoreSetup:
    """What core's options would hold on these GPUs (bytes; ``usable`` None: unknown, counts as room)."""

    dit_bytes: int
    """The whole DiT (a full copy: CFG split holds one per GPU)."""
    home_bytes: int
    """The DiT outside its blocks, always resident."""
    activation_per_sample: int
    """Peak activations of one sample (cond or uncond) over all tokens."""
    usable: tuple
    """Usable bytes of each GPU, in device order (free minus the reserve)."""
    cfg_split: bool = True
    """Core's MultiGPU CFG Split node is in this ComfyUI."""
    dynamic_vram: bool = True
    """Core's dynamic VRAM is in this ComfyUI."""
    dynamic_condition: str = ""
    """When dynamic VRAM is not on in this process: the condition, e.g. "on ComfyUI with dynamic VRAM (NVIDIA)"."""


@dataclass(frozen=True)
class BaselineRow:
    cost: StrategyCost
    peak: DevicePeak
    """The most loaded GPU."""
    fits: bool
    devices: tuple
    detail: str
    """What it holds or streams, for the plan and the log."""


def estimate_activation_bytes(work: Workload) -> int:
    """Peak activations of one sample from the hidden-state size (``ACTIVATION_HIDDEN_STATES``)."""
    return int(ACTIVATION_HIDDEN_STATES * work.tokens * work.shape.width * work.activation_bytes)


def estimate_core_cfg_split(work: Workload, hw: Hardware) -> StrategyCost:
    """Cond and uncond on the first two devices, a full copy each; one device at cfg 1."""
    if work.batch < 2 or len(hw.flops) < 2:
        base = estimate_one_gpu(work, hw)
        why = "cfg 1: one cond per step, nothing to split (one GPU works)" if work.batch < 2 else "one GPU"
        return replace(base, strategy="core_cfg_split", note=why)
    pair = Hardware(hw.flops[:2], hw.link_bytes_per_s, hw.names[:2], hw.note, hw.host_link_bytes_per_s)
    seq = estimate_sequence(work, pair, replicas=True)
    base = estimate_one_gpu(work, hw).seconds_per_step
    return replace(seq, strategy="core_cfg_split", speedup=base / seq.seconds_per_step,
                   note="cond and uncond at once on two GPUs, a full copy each")


def estimate_dynamic_vram(work: Workload, hw: Hardware, resident_block_bytes: float, calls: int = 1) -> StrategyCost:
    """Every block on the first device; block weights past ``resident_block_bytes`` (filled in
    execution order) copied from pinned host memory in each of ``calls`` DiT calls per step."""
    if calls not in (1, 2) or work.batch % calls:
        raise InputError(f"calls {calls!r} must be 1 (cond+uncond together) or 2 (one after the other, cfg > 1)")
    s, n, budget = work.shape, work.tokens, max(0.0, float(resident_block_bytes))
    samples = work.batch / calls
    compute = exposed = streamed = 0.0
    for b in block_shapes(s):
        w = b.weight_params * work.weight_bytes
        resident = min(w, budget)
        budget -= resident
        c = samples * block_flops(b, s, n, n, s.heads) / hw.flops[0]
        copy = (w - resident) / hw.host_link_bytes_per_s + TRANSFER_LATENCY_S if w > resident else 0.0
        compute, exposed, streamed = compute + c, exposed + max(0.0, copy - c), streamed + w - resident
    t = calls * (compute + exposed)
    base = estimate_one_gpu(work, hw).seconds_per_step
    gb = hw.host_link_bytes_per_s / 1e9
    note = (f"streams {format_gib(calls * streamed)} GiB per step from pinned host RAM at {gb:g} GB/s, "
            f"{calls * exposed / t:.0%} of the step waiting for it" if streamed else "whole model resident")
    return StrategyCost("dynamic_vram", t, base / t, calls * compute, 0.0, calls * exposed, 0.0,
                        int(calls * streamed), note)


def core_baselines(work: Workload, hw: Hardware, setup: CoreSetup, devices: Sequence[str]) -> dict[str, BaselineRow]:
    """The rows core's options get on ``devices`` (GPUs, in ``hw`` order), where this ComfyUI has them."""
    rows = {}
    if setup.dynamic_vram and devices:
        rows["dynamic_vram"] = _dynamic_row(work, hw, setup, devices[0])
    if setup.cfg_split and len(devices) > 1:
        used = tuple(devices[:2])
        act, full = setup.activation_per_sample, setup.dit_bytes
        fits = all(u is None or full + act <= u for u in setup.usable[:2])
        rows["core_cfg_split"] = BaselineRow(estimate_core_cfg_split(work, hw), DevicePeak(full, act, 0), fits,
                                             used, f"full copy {format_gib(full)} GiB per GPU")
    return rows


def _dynamic_row(work: Workload, hw: Hardware, setup: CoreSetup, device: str) -> BaselineRow:
    blocks = [b.weight_params * work.weight_bytes for b in block_shapes(work.shape)]
    usable, per = setup.usable[0] if setup.usable else None, setup.activation_per_sample
    calls = 1 if usable is None or per * work.batch + setup.home_bytes + max(blocks) <= usable else work.batch
    act = per * work.batch // calls
    resident = sum(blocks) if usable is None else min(sum(blocks), max(0, usable - setup.home_bytes - act))
    fits = usable is None or setup.home_bytes + act + max(blocks) <= usable
    cost = estimate_dynamic_vram(work, hw, resident, calls)
    if setup.dynamic_condition:
        cost = replace(cost, note=f"{setup.dynamic_condition}: {cost.note}")
    return BaselineRow(cost, DevicePeak(int(setup.home_bytes + resident), int(act), 0), fits, (device,),
                       cost.note.split(": ", 1)[-1])


def compare_with_core(chosen: str, chosen_cost: StrategyCost, rows: dict[str, BaselineRow]) -> str:
    """'' or "core's CFG split predicted 1.92× (fits: full copy 26.6 GiB per GPU) — as fast as
    sequence; use it if you prefer core" for each core option that fits and is predicted within
    ``AS_FAST`` of ShardDiT's pick or faster. Speed-ups as in the rows (same one-GPU baseline)."""
    out = []
    for name, row in rows.items():
        ratio = row.cost.seconds_per_step / chosen_cost.seconds_per_step
        if not row.fits or ratio > 1 + AS_FAST:
            continue
        how = "as fast as" if ratio >= 1 - AS_FAST else "faster than"
        out.append(f"{LABELS[name]} predicted {row.cost.speedup:.2f}× (fits: {row.detail}) — {how} {chosen}; "
                   "use it if you prefer core")
    return "; ".join(out)
