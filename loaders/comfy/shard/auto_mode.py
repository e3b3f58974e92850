"""``parallel=auto`` at sampling time: the memory rule decided with the plan, refined per latent
shape by the cost model (``parallel/cost/mode.decide_auto_for_latent``).

The DiT wrapper calls ``AutoMode`` with the forward's arguments; the first call for a latent shape
decides (GPU names from the inventory, the default PCIe 4.0 link) and logs why, later calls reuse
it. `sequence` is priced with the blocks each rank keeps resident this run (the engine's budgets,
set per sampling run from the free memory then: ``resident_budgets``), so a prompt whose free memory
changed the budgets decides again. Models the cost model has no shape for keep the memory rule's choice.

With two or more GPUs the log line also names core's own options on the same GPUs (one GPU with
dynamic VRAM, core's MultiGPU CFG Split, where this ComfyUI has them: ``features``) when they
are predicted as fast or faster; ``auto`` still runs ShardDiT's mode. Their memory: the whole DiT
(``dit_bytes``), activations estimated from the latent, each GPU's free memory (ShardDiT's own
holdings counted free) minus the plan's reserve.
"""
from __future__ import annotations

import logging

from ....parallel.cost.baselines import CoreSetup
from ....parallel.families import shape_of_unet
from ....parallel.cost.mode import ModeDecision, decide_auto_for_latent
from ....parallel.cost.resident import resident_per_rank
from ..core.features import (
    core_cfg_split_available,
    dynamic_vram_available,
    dynamic_vram_condition,
)
from ..core.component_placement import current_inventory

log = logging.getLogger("sharddit")

__all__ = ["AutoMode"]


class AutoMode:
    """Callable ``(args, kwargs) -> "blocks" | "sequence"`` for one sharded model's ``auto``."""

    def __init__(self, state, model_config, weight_bytes: float = 2.0, memory: ModeDecision | None = None,
                 dit_bytes: int = 0, home_bytes: int = 0):
        self.memory: ModeDecision = memory or state.auto_mode
        self.state, self.dit_bytes, self.home_bytes = state, int(dit_bytes), int(home_bytes)
        self.ranks = [r.device for r in state.plan.block_ranges]
        self.owned = [r.stop - r.start for r in state.plan.block_ranges]
        self.weight_bytes = weight_bytes
        self.shape = _model_shape(model_config)
        self.decisions: dict[tuple, ModeDecision] = {}

    def __call__(self, args, kwargs) -> str:
        x = args[0] if args else kwargs.get("x")
        shape = tuple(getattr(x, "shape", ()))
        # memory_report: cond and uncond together do not fit this latent, so sequence runs lean
        lean = getattr(getattr(self.state, "runtime", None), "lean_pass_batch", None)
        lean = bool(lean and shape and shape[0] > lean)
        budgets = self.resident_budgets()
        key = (*shape, lean, budgets)  # budgets: set per sampling run from its free memory (resident.py)
        decision = self.decisions.get(key)
        if decision is None:
            decision = self.decide(shape, lean, budgets)
            self.decisions[key] = decision
            log.info("[ShardDiT] parallel auto for latent %s -> %s", "x".join(map(str, shape)), decision.reason)
        return decision.mode

    def resident_budgets(self) -> tuple:
        """The engine's resident budget per rank for this sampling run (``resident_budgets.apply_resident_budgets``)."""
        engine = getattr(getattr(self.state, "router", None), "engine", None)
        return tuple(int(s.resident_budget) for s in getattr(engine, "streams", ()))

    def decide(self, latent_shape, lean: bool = False, budgets: tuple = ()) -> ModeDecision:
        if self.shape is None or len(latent_shape) != 5:
            return self.memory
        inventory = current_inventory()
        names = {g.device: g.name for g in inventory.gpus}
        return decide_auto_for_latent(self.memory, self.shape, latent_shape, self.ranks, self.owned, names,
                                      weight_bytes=self.weight_bytes, core=self._core_setup(inventory), lean=lean,
                                      resident=self._kept(budgets))

    def _kept(self, budgets: tuple):
        """Per rank, the blocks it keeps with ``budgets`` (the rule ``plan`` prices, ``cost/resident``)."""
        footprint = getattr(self.state, "footprint", None)
        if not any(budgets) or footprint is None or len(budgets) != len(self.ranks):
            return None
        return resident_per_rank(footprint.block_bytes, self.state.plan.block_devices(), self.ranks, budgets)

    def _core_setup(self, inventory):
        """Core's options on the plan's GPUs (None without the DiT's size: nothing to compare)."""
        if self.dit_bytes <= 0:
            return None
        gpus = list(dict.fromkeys(d for d in self.ranks if d.startswith("cuda")))
        reserve = int(float(getattr(self.state, "request_key", ("", 0.0))[1]) * (1 << 30))
        usable = tuple(inventory.get(d).available_bytes - reserve if d in inventory.names else None for d in gpus)
        return CoreSetup(self.dit_bytes, self.home_bytes, 0, usable, core_cfg_split_available(),
                         dynamic_vram_available(), dynamic_vram_condition())


def _model_shape(model_config):
    unet = dict(getattr(model_config, "unet_config", {}) or {})
    name = type(model_config).__name__
    try:
        return shape_of_unet(name, unet)
    except (ValueError, KeyError, TypeError) as err:
        log.info("[ShardDiT] parallel auto: no cost shape for %s (%r); the memory rule decides", name, err)
        return None
