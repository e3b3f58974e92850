"""Words of the cost model (pure): the ``auto`` decision and the strategy rows of the plan."""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from .model import BASELINES, STRATEGIES, StrategyCost
from ..units import format_gib
from ..errors import InputError

__all__ = ["DevicePeak", "choose_strategy", "format_strategy_rows"]



@dataclass(frozen=True)
class DevicePeak:
    """Peak bytes on the most loaded device for one strategy (from the simulator / planner)."""

    weights_bytes: int
    """Resident weights: owned blocks + DiT home (or the whole model for one GPU)."""
    activation_bytes: int
    """Peak activations (and exchange buffers in sequence mode)."""
    prefetch_bytes: int = 0
    """Buffers for blocks streamed from their owners (sequence mode)."""

    @property
    def total_bytes(self) -> int:
        return self.weights_bytes + self.activation_bytes + self.prefetch_bytes


def choose_strategy(costs: Mapping[str, StrategyCost], fits_by_strategy: Mapping[str, bool]) -> tuple[str, str]:
    """The fastest strategy that fits, and why: ``"sequence: predicted 1.87× vs 1 GPU; blocks 1.00×"``.

    ``fits_by_strategy`` comes from the simulator/planner; a strategy missing there counts as not
    fitting. Core's own options (``BASELINES``) are never picked. ValueError when none fits (the
    planner's error says what to change).
    """
    costs = {k: v for k, v in costs.items() if k not in BASELINES}
    unknown = set(costs) - set(STRATEGIES)
    if unknown:
        raise InputError(f"unknown strategies {sorted(unknown)}: costs are keyed by {', '.join(STRATEGIES)}")
    fitting = [name for name in costs if fits_by_strategy.get(name, False)]
    if not fitting:
        raise InputError(f"no ShardDiT mode fits ({', '.join(costs)} all too large): fewer frames, a smaller "
                         "size, fp8 weights or more devices")
    best = min(fitting, key=lambda name: costs[name].seconds_per_step)
    others = []
    for name in STRATEGIES:
        if name == best or name not in costs:
            continue
        tail = "" if fits_by_strategy.get(name, False) else " (does not fit)"
        others.append(f"{_label(name)} {costs[name].speedup:.2f}×{tail}")
    reason = f"{best}: predicted {costs[best].speedup:.2f}× vs 1 GPU"
    if "bound" in costs[best].note:  # say why it falls short of N×; plain breakdowns stay in the table
        reason += f", {costs[best].note}"
    return best, "; ".join([reason] + others)


def _label(name: str) -> str:
    return "1 GPU" if name == "one_gpu" else name


def format_strategy_rows(costs: Mapping[str, StrategyCost], peaks: Mapping[str, DevicePeak],
                         fits_by_strategy: Mapping[str, bool], baseline_name: str = "GPU",
                         hardware_note: str = "") -> str:
    """strategy | per-device peak GiB (weights + activations + prefetch) | s/step | speed-up | fits;
    ShardDiT's modes, then core's own options (``BASELINES``) where present."""
    header = ("strategy", "per-device peak GiB (weights + activations + prefetch)", "pred. s/step",
              "speed-up vs 1 GPU", "fits")
    rows = [header]
    for name in STRATEGIES + BASELINES:
        if name not in costs:
            continue
        c, p = costs[name], peaks.get(name)
        peak = (f"{format_gib(p.weights_bytes)} + {format_gib(p.activation_bytes)} + {format_gib(p.prefetch_bytes)} "
                f"= {format_gib(p.total_bytes)}") if p else "?"
        fits = "yes" if fits_by_strategy.get(name, False) else "no"
        rows.append((name, peak, f"{c.seconds_per_step:.2f}", f"{c.speedup:.2f}×", fits))
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    lines = [" | ".join(cell.ljust(w) for cell, w in zip(r, widths)).rstrip() for r in rows]
    lines.insert(1, "-+-".join("-" * w for w in widths))
    lines.append(f"speed-up vs one {baseline_name} holding the whole model (hypothetical where it "
                 "does not fit: same kind of GPU, unlimited memory)")
    if hardware_note:
        lines.append(hardware_note)
    for name in STRATEGIES + BASELINES:
        if name in costs and costs[name].note:
            lines.append(f"{name}: {costs[name].note}")
    return "\n".join(lines)
