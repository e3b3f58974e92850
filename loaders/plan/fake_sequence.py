"""One `sequence`-mode DiT forward on fake devices: per-device peaks with the real engine.

The blocks sit where the plan puts them; ``parallel/sequence/engine`` runs every block on every rank
with its share of the batch (cond / uncond first) and of the tokens (Ulysses exchanges through
ComfyUI's ``optimized_attention_override``), streaming blocks a rank does not own into its ring
(two buffers per block shape). Rank threads take turns (``serialize``: fake tensors are not thread-safe) and
each enters the fake mode and a view of the one ``MemoryTracker``, so every storage is counted
on the device that made it, whichever thread made it. Attention runs as the flash stand-in
through the override only: the engine's exchange wraps it.

Per device: weights (owned blocks, + the DiT's home part on the home device), prefetch (the
ring buffers the rank filled: ``cost/memory.compute_prefetch_bytes`` of the blocks it streams) and
activations (the measured peak minus those buffers, which live from first use to the end).
"""
from __future__ import annotations

import contextlib

from ...parallel.cost.memory import RankMemory
from ...parallel.errors import InputError
from ...parallel.sequence.engine import attach_sequence_engine
from .context import SimContext
from .fake_forward import run_fake_forward

__all__ = ["plan_sequence_peaks", "run_fake_sequence_forward"]


def run_fake_sequence_forward(ctx: SimContext, batch: int, block_devices: list[str], home: str,
                              speeds=None, resident=None) -> list[RankMemory]:
    """Peaks per rank (in rank order) of one `sequence` forward at ``batch`` (1, or 2 = cond+uncond);
    ``speeds``: the ranks' relative speeds, as the engine splits by them (None: even shares);
    ``resident``: bytes per rank it may keep of the blocks it streams (``SequenceEngine.keep_resident``)."""
    ranks = list(dict.fromkeys(block_devices))
    token_specs, why = ctx.sequence
    if token_specs is None:
        raise InputError(f"{why}")

    def engine(handle, mode, tracker):
        @contextlib.contextmanager
        def worker_context():
            with mode, tracker.thread_view():
                yield

        proxies = [p for pl in handle.proxies.values() for p in pl]
        seq = attach_sequence_engine(handle.router, proxies, token_specs, ranks, timeout_s=600,
                                     worker_context=worker_context, serialize=True)
        seq.set_speeds(speeds)
        if resident is not None:
            seq.keep_resident(resident)

        def after():  # the ring buffers each rank filled, and what it kept resident
            return [_buffer_bytes(s) for s in seq.streams], [s.resident_bytes() for s in seq.streams]
        return after, seq.close

    measured, (prefetch, kept) = run_fake_forward(ctx, batch, block_devices, home, engine=engine)
    out = []
    for rank, dev in enumerate(ranks):
        m = measured.get(dev)
        weights, peak = (m.weights, m.peak_activations) if m else (0, 0)
        out.append(RankMemory(dev, weights, prefetch=prefetch[rank], activations=max(0, peak - prefetch[rank] - kept[rank]),
                              resident=kept[rank]))
    return out


def plan_sequence_peaks(ctx: SimContext, batch: int, block_devices: list[str], home: str):
    """The plan's bytes per rank (``cost/memory.plan_sequence_memory``) for the forward
    ``run_fake_sequence_forward`` runs with the same arguments; block kinds are (block list, bytes)."""
    from ...parallel.blocks.sharding import get_block_list
    from ...parallel.cost.memory import plan_sequence_memory
    from ...parallel.families import activation_variant
    from ...parallel.placement.sizing import get_blocks

    shape = ctx.shape
    specs, _ = ctx.sequence
    kinds, whole, start = [], [], 0
    for i, path in enumerate(ctx.layout.block_lists):
        n = len(get_block_list(ctx.dit, path))
        kinds += [(i, b) for b in ctx.block_bytes[start:start + n]]
        whole += [bool(specs and specs[i].whole)] * n
        start += n
    variant = activation_variant(ctx.spec.family, get_blocks(ctx.dit, ctx.layout)[-1])
    return plan_sequence_memory(variant, shape.width, shape.image_tokens(*ctx.size), batch,
                                list(dict.fromkeys(block_devices)), ctx.block_bytes, block_devices, home,
                                ctx.home_bytes, kinds, ctx.spec.geometry.context_tokens,
                                ctx.compute_dtype.itemsize, shape.heads, whole=whole)


def _buffer_bytes(stream) -> int:
    return sum(t.untyped_storage().nbytes() for bufs in stream._buffers.values() for b in bufs for t in b.tensors)
