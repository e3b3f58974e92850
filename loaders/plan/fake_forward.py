"""One DiT forward on fake devices, the way ``dry_run`` needs it (ComfyUI classes, pure fakes).

- every block's weights on its planned fake device, the rest on ``home``; the pack's own engine
  (``parallel/blocks/sharding.attach_block_sharding``) routes the forward, then ``detach()``;
- the DiT is called as ComfyUI's sampler calls it, with inputs of the family's shapes;
- attention is an output-only stand-in (flash / memory-efficient semantics) through ComfyUI's own
  ``transformer_options["optimized_attention_override"]`` hook AND by swapping the module-level
  ``optimized_attention`` names for the duration of the forward (always restored), so call sites
  that do not pass ``transformer_options`` are covered too;
- afterwards every tensor goes back to ``meta``: nothing fake leaks, the next run starts clean.
"""
from __future__ import annotations

import contextlib
import sys

import torch

from ...parallel.blocks.sharding import attach_block_sharding, get_block_list
from ...parallel.placement.sizing import get_blocks
from ...parallel.simulate import (MemoryTracker, fake_device_mode, flash_attention_standin, materialize_planned,
                                  modules_move_in_place)
from ..comfy.models.comfy_families import comfy_family
from .context import SimContext

__all__ = ["back_to_meta", "call_dit", "first_blocks_only", "run_fake_forward"]


def run_fake_forward(ctx: SimContext, batch: int, block_devices: list[str], home: str) -> dict:
    """One fake forward; {device: (weight bytes, peak activation bytes)}."""
    dit, layout = ctx.dit, ctx.layout
    blocks = get_blocks(dit, layout)
    try:
        with fake_device_mode(comfy_family(ctx.spec.family).sim_scalars), _attention_standin():
            materialize_planned(dit, blocks, block_devices, home)
            handle = attach_block_sharding(dit, layout, [torch.device(d) for d in block_devices],
                                           torch.device(home))
            try:
                with MemoryTracker(dit, *blocks) as tracker, handle.router.forward_scope():
                    del_out = call_dit(ctx, dit, batch, torch.device(home))
                    del del_out
            finally:
                handle.detach()
    finally:
        back_to_meta(dit)
    return {d: (m.weights, m.peak_activations) for d, m in tracker.report().items()}


@contextlib.contextmanager
def first_blocks_only(dit, layout):
    """Keep only the first block of each block list (a probe for the planner's activation
    headroom: the blocks of a list are alike, so one of each shows the per-device peak). An empty
    list stays empty (HunyuanVideo 1.5 has no single blocks); yields how many blocks are kept."""
    saved, kept = [], 0
    for path in layout.block_lists:
        parent, _, name = ("." + path).rpartition(".")
        owner = get_block_list(dit, parent[1:]) if parent else dit
        saved.append((owner, name, getattr(owner, name)))
        setattr(owner, name, torch.nn.ModuleList(list(getattr(owner, name))[:1]))
        kept += len(getattr(owner, name))
    try:
        yield kept
    finally:
        for owner, name, blocks in saved:
            setattr(owner, name, blocks)


def back_to_meta(dit) -> None:
    """Back to ``meta`` after a run: the next run starts clean and no fake tensor leaks out."""
    memo = {}
    for mod in dit.modules():
        for name, p in list(mod._parameters.items()):
            if p is not None:
                if id(p) not in memo:
                    meta = torch.empty(p.shape, dtype=p.dtype, device="meta")
                    memo[id(p)] = torch.nn.Parameter(meta, requires_grad=False)
                mod._parameters[name] = memo[id(p)]
        for name, b in list(mod._buffers.items()):
            if b is not None:
                mod._buffers[name] = torch.empty(b.shape, dtype=b.dtype, device="meta")


def call_dit(ctx: SimContext, dit, batch: int, home: torch.device):
    """Call the DiT as ComfyUI's sampler does, with inputs of the family's shapes on ``home``."""
    spec, dtype = ctx.spec, ctx.compute_dtype
    g = spec.geometry

    def empty(*shape, dt=dtype):  # one per sample: the batch comes first
        return torch.empty((batch, *shape), dtype=dt, device=home)

    family = comfy_family(spec.family)
    x = family.sim_latent(torch.empty(g.latent_shape(*ctx.size, batch), dtype=dtype, device=home), ctx.size[2], empty)
    t = empty(dt=torch.float32)
    context = empty(g.context_tokens, g.context_dim)
    options = {"optimized_attention_override": _attention_override}
    kwargs = family.sim_inputs(spec.unet_config, g, empty)
    with modules_move_in_place(dit):
        return dit(x, t, context, transformer_options=options, **kwargs)


def _attention_override(func, *args, **kwargs):
    """ComfyUI's ``optimized_attention_override`` hook: ignore ``func``, run the stand-in."""
    return flash_attention_standin(*args, **kwargs)


@contextlib.contextmanager
def _attention_standin():
    """Swap ComfyUI's module-level attention entry points for the stand-in; always restored."""
    import comfy.ldm.modules.attention as attention

    originals = {getattr(attention, n) for n in dir(attention) if n.startswith("attention_")}
    originals |= {attention.optimized_attention, attention.optimized_attention_masked}
    swapped = []
    for name, module in list(sys.modules.items()):
        if module is None or not name.startswith("comfy.ldm"):
            continue
        for attr in ("optimized_attention", "optimized_attention_masked"):
            value = getattr(module, attr, None)
            if value is not None and value in originals:
                swapped.append((module, attr, value))
                setattr(module, attr, flash_attention_standin)
    try:
        yield
    finally:
        for module, attr, value in swapped:
            setattr(module, attr, value)
