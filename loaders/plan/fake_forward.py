"""One DiT forward on fake devices, the way the dry run needs it (ComfyUI classes, pure fakes).

``parallel/blocks/dry_forward.simulated_forward`` does the fake part: every block's weights on its planned
fake device, the rest on ``home``, the pack's own engine routing the forward, every storage counted
per device, everything back on ``meta`` afterwards. This module adds ComfyUI's side:

- the DiT is called as ComfyUI's sampler calls it, with inputs of the family's shapes
  (``comfy_families``: the latent, the extra inputs, whether scalars are read off tensors);
- attention is an output-only stand-in (flash / memory-efficient semantics) through ComfyUI's own
  ``transformer_options["optimized_attention_override"]`` hook AND, for a `blocks` forward, by
  swapping the module-level ``optimized_attention`` names for the duration of the forward (always
  restored), so call sites that do not pass ``transformer_options`` are covered too (a `sequence`
  forward keeps them: the engine's exchange wraps the override).
"""
from __future__ import annotations

import contextlib
import sys

import torch

from ...parallel.blocks.dry_forward import simulated_forward
from ...parallel.simulate import flash_attention_standin
from ..comfy.models.comfy_families import comfy_family
from .context import SimContext

__all__ = ["run_fake_forward"]


def run_fake_forward(ctx: SimContext, batch: int, block_devices: list[str] | None, home: str,
                     first_only: bool = False, engine=None):
    """One fake forward of ``ctx``'s DiT at ``batch``: ({device: ``DeviceMemory``}, what ``engine``'s
    ``after`` returned). ``block_devices`` None: all on ``home``; ``first_only`` and ``engine``: as
    ``simulated_forward`` takes them (the probe; the `sequence` engine)."""
    family = comfy_family(ctx.spec.family)
    g = ctx.spec.geometry

    def forward(home_device: torch.device) -> None:
        def empty(*shape, dt=ctx.compute_dtype):  # one per sample: the batch comes first
            return torch.empty((batch, *shape), dtype=dt, device=home_device)

        latent = torch.empty(g.latent_shape(*ctx.size, batch), dtype=ctx.compute_dtype, device=home_device)
        x = family.sim_latent(latent, ctx.size[2], empty)
        options = {"optimized_attention_override": _attention_override}
        out = ctx.dit(x, empty(dt=torch.float32), empty(g.context_tokens, g.context_dim),
                      transformer_options=options, **family.sim_inputs(ctx.spec.unet_config, g, empty))
        del out

    with _attention_standin() if engine is None else contextlib.nullcontext():
        return simulated_forward(ctx.dit, ctx.layout, block_devices, home, forward, scalars=family.sim_scalars,
                                 first_only=first_only, engine=engine)


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
