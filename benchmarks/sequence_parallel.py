"""Speed-up of `parallel=sequence` on two CPU "devices": unsharded on one thread vs ``cpu,cpu``.

Two ranks on this machine are two worker threads, each running torch ops on one intra-op thread
(``torch.set_num_threads(1)``), exactly as two GPUs run two streams: an engine that serialises its
workers (a lock, a host sync, the GIL held in Python loops) shows a speed-up near 1.0, one whose
workers really run at the same time shows one near 2.0 on two free cores.

The model is Wan-shaped (``tests/harness/toy_seq.py``: self-attention through a ComfyUI-style
``optimized_attention_override`` hook, cross-attention to 512 text tokens, GELU FFN, per-token
rotary stand-in), dim 1024 with 16 heads, 4 blocks, fp32. Batch 1 (cfg = 1): the ranks split the
tokens and exchange q/k/v per block (Ulysses) — the harder case; ``--batch 2`` is the cond/uncond
split with no exchange. Repetitions alternate unsharded / sequence (order flipped every pair)
after one warm-up each; the result is the median of unsharded/sequence wall-time ratios. Outputs
are checked bit-identical (even token split, > 10 rows per rank).

    python benchmarks/sequence_parallel.py [--reps 5] [--tokens 2048] [--batch 1] [--family wan] [--slow K] [--chunks C]

``--family`` picks the toy's shape (``tests/harness/toy_families.py``): ``wan`` (above), ``h3``
(MiniMax H3: 256 text rows and the video rows packed in one sample's sequence, joint attention,
SwiGLU, modulation per row range; batch 1 always, as ComfyUI runs H3), ``kandinsky`` (Kandinsky 5:
two text blocks run whole, then visual blocks split, with cross-attention to 256 text tokens) or
``ltx2`` (LTX-2.3: the video tokens split, 40 audio tokens half as wide kept whole on every rank,
per-frame timesteps, audio->video and video->audio attention, the latter split by heads).
Their outputs are compared within the toy bound (``tests/harness/numerics.py``), not bit for bit:
their GEMMs run on a rank's rows.

``--slow K`` (issue 34) makes rank 1 a K times slower device (it sleeps K - 1 times the CPU time each
block took on its thread) and times even shares against shares by speed (1 : 1/K), printing both and
``weighted_gain=even / by speed`` (ideal: 2K / (K + 1), 1.5 for K = 3).

``--chunks C`` (issue 34) runs the pipelined Ulysses exchange (heads in C chunks, ``sequence/ulysses``)
on the CPU ranks, where the engine otherwise keeps the unpipelined one. CPU copies are synchronous,
so nothing overlaps here: the ratio against ``--chunks 1`` is the host cost of the pipeline (C times
the rendezvous, transfers and attention calls per block; ``exchanges`` counts them), which a GPU
must win back by overlapping the exchange with the attention.

Prints the bytes each rank received in exchanges per forward beside the analytic figure
``blocks x 4 x B x (L/N) x (C - C/N) x 4 bytes`` (q, k, v out and the output back, the other ranks'
share of the heads). The last line is ``speedup=<unsharded time / sequence time>``.

Two "CPU devices" are two cores of one host that may not run two threads at full speed (a VM's
vCPUs, turbo, shared caches). Each repetition therefore also times the same number of 1024x1024
matmuls on one thread and then split over two threads: ``ceiling`` is the best speed-up any
two-thread engine can reach on this machine at that moment, and ``efficiency = speedup / ceiling``
is the engine's own share of the loss.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import threading
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]


def import_pack():
    sys.path.insert(0, str(REPO / "tests"))
    from harness.pack import import_pack as _import_pack

    return _import_pack()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--tokens", type=int, default=2048)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--dim", type=int, default=1024)
    ap.add_argument("--family", choices=("wan", "h3", "kandinsky", "ltx2"), default="wan")
    ap.add_argument("--slow", type=int, default=1,
                    help="K > 1: make rank 1 a K times slower device (Wan-shaped toy) and compare "
                         "even shares with shares by speed (1 : 1/K) instead of timing against unsharded")
    ap.add_argument("--chunks", type=int, default=1,
                    help="C > 1: the pipelined Ulysses exchange in C head chunks on the CPU ranks")
    args = ap.parse_args(argv)
    import_pack()
    from harness.numerics import assert_split_close

    from sharddit.parallel.sequence.engine import attach_sequence_engine
    from sharddit.parallel.blocks.sharding import attach_block_sharding

    torch.set_num_threads(1)
    torch.manual_seed(0)
    n_blocks, heads, ranks = 4, 16, ["cpu", "cpu"]
    if args.family == "h3":
        args.batch = 1  # ComfyUI gives H3 one sample per call
    model, inputs, layout, specs = _family(args, heads, n_blocks)
    x, t, ctx = inputs
    lists = [len(getattr(model, p)) for p in layout.block_lists]
    devices = [d for n in lists for d in ["cpu"] * (n // 2) + ["cpu"] * (n - n // 2)]
    handle = attach_block_sharding(model, layout, devices, "cpu")
    proxies = [p for pl in handle.proxies.values() for p in pl]
    engine = attach_sequence_engine(handle.router, proxies, specs, ranks)
    engine.runner.chunks = args.chunks if args.chunks > 1 else None

    if args.slow > 1:
        return _slow_rank(args, model, (x, t, ctx), handle, engine)

    def unsharded():
        with torch.inference_mode():
            return model(x, t, ctx)

    def sequence():
        with torch.inference_mode(), handle.router.forward_scope(sequence=True):
            return model(x, t, ctx)

    mat = torch.randn(1024, 1024)

    def matmuls(n):
        torch.set_num_threads(1)
        for _ in range(n):
            mat @ mat

    def ceiling(n=24):
        t0 = time.perf_counter()
        matmuls(2 * n)
        one = time.perf_counter() - t0
        threads = [threading.Thread(target=matmuls, args=(n,)) for _ in range(2)]
        t0 = time.perf_counter()
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        return one / (time.perf_counter() - t0)

    ref, out = unsharded(), sequence()  # warm-up (threads started, buffers allocated)
    if args.family == "wan" and args.chunks <= 1:
        assert torch.equal(ref, out), f"outputs differ: {(ref - out).abs().max()}"
    else:
        for o, r in zip(out, ref, strict=True) if isinstance(out, tuple) else [(out, ref)]:  # ltx2: (video, audio)
            assert_split_close(o, r, what=f"{args.family} toy")
    ratios, ceilings, times = [], [], {"unsharded": [], "sequence": []}
    for rep in range(args.reps):
        order = [("unsharded", unsharded), ("sequence", sequence)]
        for name, fn in order if rep % 2 == 0 else order[::-1]:
            t0 = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t0)
        ratios.append(times["unsharded"][-1] / times["sequence"][-1])
        ceilings.append(ceiling())
        print(f"rep {rep}: unsharded {times['unsharded'][-1]:.3f} s, sequence {times['sequence'][-1]:.3f} s, "
              f"ratio {ratios[-1]:.3f}; two-thread matmul ceiling {ceilings[-1]:.3f}", flush=True)
    st = engine.stats
    n = len(ranks)
    per_rank = args.tokens // n if args.batch == 1 else args.tokens
    analytic = 0 if args.batch >= n else n_blocks * 4 * args.batch * per_rank * (args.dim - args.dim // n) * 4
    print(f"model: {args.family}-shaped, dim {args.dim}, {heads} heads, {n_blocks} blocks, batch {args.batch}, "
          f"{args.tokens} tokens, ranks {','.join(ranks)}; groups {st.groups}; head chunks {args.chunks}")
    said = f" (analytic {analytic})" if args.family == "wan" else ""
    print(f"exchanged per forward per rank: {st.bytes_exchanged} bytes{said}; "
          f"exchanges {st.exchanges}; streamed {st.bytes_streamed}")
    print(f"median unsharded {statistics.median(times['unsharded']):.3f} s, "
          f"sequence {statistics.median(times['sequence']):.3f} s")
    engine.close()
    speedup, ceil = statistics.median(ratios), statistics.median(ceilings)
    print(f"ceiling={ceil:.3f} efficiency={speedup / ceil:.3f}")
    print(f"speedup={statistics.median(ratios):.3f}")
    return 0


def _slow_rank(args, model, inputs, handle, engine) -> int:
    """Rank 1 as a K times slower device: after each block it runs (its thread is ``sharddit-seq-1-…``)
    it sleeps K - 1 times the CPU time the block took on its thread (not its waits for the others), so everything it computes (projections, attention,
    FFN, its share of the exchange) costs K times; sleeping frees the core as an idle GPU would. Even
    shares wait for it at every block; shares by speed (``SequenceEngine.set_speeds``: 1 : 1/K) give
    it fewer rows and heads."""
    started = threading.local()

    def start(module, args_in):
        started.t = time.thread_time()  # this thread's CPU time: its compute, not its waits in the exchange

    def slower(module, args_in, out):
        if threading.current_thread().name.startswith("sharddit-seq-1-"):
            time.sleep((args.slow - 1) * (time.thread_time() - started.t))
    real = [p.real_block for pl in handle.proxies.values() for p in pl]  # what the rank threads call
    hooks = [h for b in real for h in (b.register_forward_pre_hook(start), b.register_forward_hook(slower))]

    def run(speeds):
        engine.set_speeds(speeds)
        with torch.inference_mode(), handle.router.forward_scope(sequence=True):
            model(*inputs)
        return engine.stats.tokens

    times = {"even": [], "by speed": []}
    shares = {"even": None, "by speed": (1.0, 1.0 / args.slow)}
    for name in shares:  # warm-up
        run(shares[name])
    for rep in range(args.reps):
        for name in (list(shares) if rep % 2 == 0 else list(shares)[::-1]):
            t0 = time.perf_counter()
            tokens = run(shares[name])
            times[name].append(time.perf_counter() - t0)
        print(f"rep {rep}: even {times['even'][-1]:.3f} s, by speed {times['by speed'][-1]:.3f} s", flush=True)
    for h in hooks:
        h.remove()
    engine.close()
    even, weighted = (statistics.median(times[n]) for n in shares)
    print(f"rank 1 {args.slow}x slower: tokens by speed {tokens}; median even {even:.3f} s, "
          f"by speed {weighted:.3f} s")
    print(f"weighted_gain={even / weighted:.3f}")
    return 0


def _family(args, heads: int, n_blocks: int):
    """(model, (x, t, context), layout, token specs) of the ``--family`` toy."""
    from harness.toy_families import AV_SPEC, PACKED_SPEC, AVToy, PackedToy, TextThenVisualToy
    from harness.toy_seq import SeqToyDiT

    from sharddit.parallel.blocks.routing import BlockLayout
    from sharddit.parallel.sequence.split import TokenSpec

    b, d = args.batch, args.dim
    if args.family == "h3":
        model = PackedToy(dim=d, heads=heads, n_blocks=n_blocks, ffn=4 * d, in_dim=64, text_dim=d).eval()
        frames = 8
        inputs = (torch.randn(1, frames, args.tokens // frames, 64), torch.rand(1), torch.randn(1, 256, d))
        specs = (TokenSpec(PACKED_SPEC, unbatched=True, row_tables=("mod_segments",)),)
        return model, inputs, BlockLayout(("blocks",), (("x",),)), specs
    if args.family == "kandinsky":
        model = TextThenVisualToy(dim=d, heads=heads, text_blocks=2, visual_blocks=n_blocks, ffn=4 * d, in_dim=64,
                                  text_dim=d).eval()
        inputs = (torch.randn(b, args.tokens, 64), torch.rand(b), torch.randn(b, 256, d))
        specs = (TokenSpec(whole=True), TokenSpec({"visual_embed": 1, "freqs": 2}))
        return model, inputs, BlockLayout(("text_blocks", "visual_blocks"), (("x",), ("visual_embed",))), specs
    if args.family == "ltx2":
        model = AVToy(dim=d, heads=heads, n_blocks=n_blocks, in_dim=64, text_dim=d, a_dim=d // 2, a_heads=heads // 2).eval()
        frames = 8
        x = (torch.randn(b, frames, args.tokens // frames, 64), torch.randn(b, 40, 64))
        inputs = (x, torch.rand(b, frames), torch.randn(b, 256, d))
        return model, inputs, BlockLayout(("transformer_blocks",), (("x",),)), (TokenSpec(**AV_SPEC),)
    model = SeqToyDiT(dim=d, heads=heads, n_blocks=n_blocks, ffn=4 * d, in_dim=64).eval()
    inputs = (torch.randn(b, args.tokens, 64), torch.rand(b), torch.randn(b, 512, d))
    return model, inputs, BlockLayout(("blocks",), (("x",),)), (TokenSpec({"x": 1, "e": 1, "freqs": 1}),)


if __name__ == "__main__":
    sys.exit(main())
