"""``parallel=auto`` at sampling time: the memory rule decided with the plan, refined per latent
shape by the cost model (``parallel/parallel_mode.decide_auto_for_latent``).

The DiT wrapper calls ``AutoMode`` with the forward's arguments; the first call for a latent shape
decides (GPU names from the inventory, the default PCIe 4.0 link) and logs why, later calls reuse
it. Models the cost model has no shape for keep the memory rule's choice.
"""
from __future__ import annotations

import logging

from ...parallel.cost_inputs import shape_from_config
from ...parallel.model_geometry import family_of, geometry_of
from ...parallel.parallel_mode import ModeDecision, decide_auto_for_latent
from .placement import current_inventory

log = logging.getLogger("sharddit")

__all__ = ["AutoMode"]


class AutoMode:
    """Callable ``(args, kwargs) -> "blocks" | "sequence"`` for one sharded model's ``auto``."""

    def __init__(self, state, model_config, weight_bytes: float = 2.0):
        self.memory: ModeDecision = state.auto_mode
        self.ranks = [r.device for r in state.plan.block_ranges]
        self.owned = [r.stop - r.start for r in state.plan.block_ranges]
        self.weight_bytes = weight_bytes
        self.shape = _model_shape(model_config)
        self.decisions: dict[tuple, ModeDecision] = {}

    def __call__(self, args, kwargs) -> str:
        x = args[0] if args else kwargs.get("x")
        key = tuple(getattr(x, "shape", ()))
        decision = self.decisions.get(key)
        if decision is None:
            decision = self.decide(key)
            self.decisions[key] = decision
            log.info("[ShardDiT] parallel auto for latent %s -> %s", "x".join(map(str, key)), decision.reason)
        return decision.mode

    def decide(self, latent_shape) -> ModeDecision:
        if self.shape is None or len(latent_shape) != 5:
            return self.memory
        names = {g.device: g.name for g in current_inventory().gpus}
        return decide_auto_for_latent(self.memory, self.shape, latent_shape, self.ranks, self.owned, names,
                                      weight_bytes=self.weight_bytes)


def _model_shape(model_config):
    unet = dict(getattr(model_config, "unet_config", {}) or {})
    name = type(model_config).__name__
    try:
        family = family_of(unet, name)
        g = geometry_of(family, unet)
        return shape_from_config(name, family, unet, g.spatial, g.temporal, g.context_tokens, g.clip_tokens)
    except (ValueError, KeyError, TypeError) as err:
        log.info("[ShardDiT] parallel auto: no cost shape for %s (%r); the memory rule decides", name, err)
        return None
