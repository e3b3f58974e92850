"""gpu_check helpers for the sections that run the real `sequence` engine on a toy Wan-like DiT
(``tests/harness/toy_seq.SeqToyDiT``: self-attention through ComfyUI's override hook, so Ulysses
runs; cross-attention to text; GELU FFN): build a model, shard it, run forwards, time them.

Where the blocks live (``where``):
- ``owners``: every block on the rank device: ``cuda:0,cuda:0`` as the engine runs it on one GPU,
  where every rank owns every block and nothing streams;
- ``pinned`` / ``pageable``: every block held in host RAM (page-locked or not), ranks on the GPU:
  each rank streams every block through its side stream, events and buffers (what a GPU rank does
  with the blocks of a ``cpu`` entry of the device list);
- ``split``: the first half of the blocks on the first rank's device, the rest on the second's
  (``cuda:0,cpu``: real cross-device copies both ways, a CPU rank computing beside the GPU);
- ``forced``: blocks on the rank device, every rank's ring forced to treat them as remote (dry
  runs on CPU, where nothing can be pinned).
"""
from __future__ import annotations

import math
import statistics
import time
import warnings

import torch

WAN_LAYOUT_ARGS = (("blocks",), (("x",),))
WAN_TOKEN_DIMS = {"x": 1, "e": 1, "freqs": 1}


def toy_factors():
    """The toy's own activation factors (``parallel/cost/memory.ActivationFactors``), for the
    ``memory`` section's plan. Not Wan's: the toy's block keeps ``h``, ``qkv``, ``q``, ``k`` alive
    through its FFN (ComfyUI's Wan block frees them), so Wan's factors under-plan it, and a check
    against them would fail for that reason alone. Measured on CPU (fp32, the fake-GPU memory tracker
    of the simulator, ``tracked_memory``: each rank thread's own peak, summed, as when the two ranks'
    peaks meet) in units of a rank's hidden state: block 15.85 at widths 256 and 512 (2048 and 4096
    tokens, batch 1 on two ranks), with Wan's Ulysses and home terms; block +5 % (cuBLAS workspaces,
    which the tracker does not see). The section's forward tracked on CPU then comes to 0.97 of this
    plan at both widths; ``tests/test_gpu_check_dry.py`` measures it again."""
    from sharddit.parallel.cost.memory import ActivationFactors

    return ActivationFactors(block=16.6, ulysses=1.05, home_hidden=1.05, rope=0.05)


def pack():
    """The engine's modules (the pack is imported by path first, as ``sharddit``)."""
    from harness.toy_seq import SeqToyDiT
    from sharddit.parallel.sequence import stream as seq_stream
    from sharddit.parallel.sequence.engine import attach_sequence_engine
    from sharddit.parallel.sequence.split import TokenSpec
    from sharddit.parallel.blocks.sharding import attach_block_sharding
    from sharddit.parallel.blocks.routing import BlockLayout

    return SeqToyDiT, seq_stream, attach_sequence_engine, TokenSpec, BlockLayout, attach_block_sharding


def build_model(dim: int, heads: int, n_blocks: int, ffn: int, dtype, device, text_dim=None, meta_init=False):
    """A SeqToyDiT; ``meta_init``: built on ``meta`` and drawn on ``device`` (a Wan-width model in
    seconds, not minutes of CPU init), weights ~ N(0, 1/fan_in) so activations stay of order 1."""
    SeqToyDiT = pack()[0]
    torch.manual_seed(0)
    if not meta_init:
        return SeqToyDiT(dim=dim, heads=heads, n_blocks=n_blocks, ffn=ffn, in_dim=16).eval().to(device, dtype)
    with torch.device("meta"):
        model = SeqToyDiT(dim=dim, heads=heads, n_blocks=n_blocks, ffn=ffn, in_dim=16)
    model = model.to_empty(device=device).to(dtype).eval()
    g = torch.Generator(device=device).manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() >= 2:
                p.normal_(0.0, 1.0 / math.sqrt(p.shape[-1]), generator=g)
            else:
                p.zero_()
    return model


def inputs(model, batch: int, tokens: int, text: int, device, dtype):
    g = torch.Generator().manual_seed(1)
    x = torch.randn(batch, tokens, 16, generator=g).to(device, dtype)
    t = torch.rand(batch, generator=g).to(device, dtype)
    ctx = torch.randn(batch, text, model.dim, generator=g).to(device, dtype)
    return x, t, ctx


class Sharded:
    """``model`` sharded for `sequence` over ``ranks`` with blocks placed per ``where``; ``close()``
    puts everything back."""

    def __init__(self, model, ranks, where: str, home):
        _, seq_stream, attach_engine, TokenSpec, BlockLayout, attach = pack()
        n = len(model.blocks)
        if where in ("owners", "forced"):
            block_devices = [ranks[0]] * n
        elif where in ("pinned", "pageable"):
            block_devices = ["cpu"] * n
        elif where == "split":
            block_devices = [ranks[0]] * (n // 2) + [ranks[1]] * (n - n // 2)
        else:
            raise ValueError(f"where {where!r}")
        self.model, self.where = model, where
        self.handle = attach(model, BlockLayout(*WAN_LAYOUT_ARGS), block_devices, home)
        proxies = list(self.handle.proxies["blocks"])
        if where == "pinned":
            with torch.no_grad():
                for p in (p for proxy in proxies for p in proxy.real_block.parameters()):
                    p.data = p.data.pin_memory()
        self.engine = attach_engine(self.handle.router, proxies, (TokenSpec(dict(WAN_TOKEN_DIMS)),), ranks,
                                    timeout_s=300)
        if where == "forced":
            base = seq_stream.BlockStream

            class _ForcedRemote(base):
                def owns(self, block):
                    return False

            self.engine.streams = [_ForcedRemote(d) for d in self.engine.devices]

    def forward(self, args):
        with torch.no_grad(), self.handle.router.forward_scope(sequence=True):
            return self.model(*args)

    def streamed(self) -> list[int]:
        return list(self.engine.stats.bytes_streamed)

    def ring_bytes(self) -> int:
        """Bytes the rings hold (``BlockStream.held`` where it exists, else counted from buffers)."""
        total = 0
        for s in self.engine.streams:
            held = getattr(s, "held", None)
            if held is not None:
                total += held()["device"]
            else:
                total += sum(t.numel() * t.element_size() for bufs in s._buffers.values() for b in bufs
                             for t in b.tensors)
        return total

    def close(self):
        self.engine.close()
        self.handle.detach()


def tracked_memory(model, args, ranks, where: str, home) -> tuple[int, int]:
    """(peak activation bytes of a steady-state forward, bytes the rings hold) as the simulator's
    memory tracker counts them (``parallel/simulate.MemoryTracker``, every rank thread included,
    attention output-only as flash attention allocates): the CPU figure of ``toy_factors``."""
    from sharddit.parallel.simulate import MemoryTracker, flash_attention_standin

    opts = {"optimized_attention_override": lambda func, *a, **k: flash_attention_standin(*a, **k)}
    run = Sharded(model, ranks, where, home)
    tracker = MemoryTracker(model)
    try:
        run.forward((*args, opts))  # threads and ring buffers made before the tracker counts
        for stream in run.engine.streams:  # refilled in place: the ring's bytes are added once, below
            for buffers in stream._buffers.values():
                for b in buffers:
                    tracker.add_weights(b.module)
        run.engine.pool.worker_context = tracker.thread_view
        with tracker:
            out = run.forward((*args, opts))
            del out
        ring = run.ring_bytes()
    finally:
        run.close()
    return tracker.report()[str(torch.device(home))].coinciding_activations, ring


def sync(device) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def count_syncs(fn) -> int:
    """Synchronizing CUDA calls made while ``fn()`` runs, from any thread
    (``torch.cuda.set_sync_debug_mode("warn")``: each such call raises a UserWarning)."""
    previous = torch.cuda.get_sync_debug_mode()
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            fn()
        finally:
            torch.cuda.set_sync_debug_mode(previous)
    return sum("synchroniz" in str(w.message) for w in seen)


def median_time(fn, device, reps: int) -> float:
    times = []
    for _ in range(reps):
        sync(device)
        t0 = time.perf_counter()
        fn()
        sync(device)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def max_diff(a, b) -> float:
    return (a.float() - b.float()).abs().max().item()
