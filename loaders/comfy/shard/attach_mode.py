"""Step 4 of a sharding call: attach the chosen mode to the sharded clone. The DiT wrapper runs
ShardDiT's routing scope in that mode; with ``auto`` a cost model decides per latent shape
(``auto_mode.AutoMode``) where `sequence` may win, or where core's own options are worth naming."""
from __future__ import annotations

import functools
import logging

from comfy.patcher_extension import WrappersMP

from .auto_mode import AutoMode
from .compile_guard import guarded_routing_scope
from .hooks import ATTACHMENT_KEY, ShardState, get_shard_patchers
from .memory_report import MODE_KEY, REQUESTED_KEY
from .step_values import ModeChoice, Shards

log = logging.getLogger("sharddit")

__all__ = ["attach_mode"]


def attach_mode(shards: Shards, choice: ModeChoice):
    """Bind the sharded clone ``shards.model`` (changed in place) to ``choice``; returns it."""
    m, state, decision = shards.model, shards.state, choice.decision
    m.set_attachments(MODE_KEY, decision)
    m.set_attachments(REQUESTED_KEY, choice.requested)
    m.remove_wrappers_with_key(WrappersMP.DIFFUSION_MODEL, ATTACHMENT_KEY)
    mode = decision.mode
    if choice.requested == "auto" and (decision.mode == "sequence" or _compares_core(state, decision)):
        home, shard_patchers = m.model_size(), get_shard_patchers(m)
        whole = home + sum(s.model_size() for s in shard_patchers) if shard_patchers else 0  # 0: no comparison
        mode = AutoMode(state, m.model.model_config, _weight_bytes(state), memory=decision, dit_bytes=whole,
                        home_bytes=home)
    m.add_wrapper_with_key(WrappersMP.DIFFUSION_MODEL, ATTACHMENT_KEY,
                           functools.partial(guarded_routing_scope, state, mode))
    log.info("[ShardDiT] parallel %s -> %s", choice.requested, decision.reason)
    return m


def _compares_core(state: ShardState, decision) -> bool:
    """``auto`` kept `blocks` by the memory rule over two or more GPUs: ``AutoMode`` keeps it and says
    when core's own options would be as fast (per latent)."""
    return decision is state.auto_mode and len({r.device for r in state.plan.block_ranges
                                                if r.device.startswith("cuda")}) > 1


def _weight_bytes(state: ShardState) -> float:
    """Bytes per weight as streamed (fp8 1, bf16 2), from the first block's largest tensor."""
    block = next((p.real_block for pl in state.proxies.values() for p in pl), None)
    tensors = list(block.parameters()) if block is not None else []
    return float(max(tensors, key=lambda t: t.numel()).element_size()) if tensors else 2.0
