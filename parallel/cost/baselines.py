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

Their step times are ``model.estimate_dynamic_vram`` and ``model.estimate_core_cfg_split`` (beside
ShardDiT's own estimators); here, what each holds and whether it fits. ``auto`` still picks among
ShardDiT's modes; ``compare_with_core`` says when core's option is predicted as fast or faster, so a
user can choose it knowingly.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from .model import (
    Hardware,
    StrategyCost,
    Workload,
    estimate_core_cfg_split,
    estimate_dynamic_vram,
)
from .report import DevicePeak
from ..units import format_gib

__all__ = [
    "ACTIVATION_HIDDEN_STATES",
    "AS_FAST",
    "LABELS",
    "BaselineRow",
    "CoreSetup",
    "compare_with_core",
    "core_baselines",
    "estimate_activation_bytes",
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
    largest = max(b.weight_params * work.weight_bytes for b in work.shape.blocks if b.count)
    total = sum(b.weight_params * work.weight_bytes * b.count for b in work.shape.blocks)
    usable, per = setup.usable[0] if setup.usable else None, setup.activation_per_sample
    calls = 1 if usable is None or per * work.batch + setup.home_bytes + largest <= usable else work.batch
    act = per * work.batch // calls
    resident = total if usable is None else min(total, max(0, usable - setup.home_bytes - act))
    fits = usable is None or setup.home_bytes + act + largest <= usable
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
