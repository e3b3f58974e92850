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

    python benchmarks/sequence_parallel.py [--reps 5] [--tokens 2048] [--batch 1]

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
    args = ap.parse_args(argv)
    import_pack()
    from harness.toy_seq import SeqToyDiT

    from sharddit.parallel.sequence.engine import attach_sequence_engine
    from sharddit.parallel.sequence.split import TokenSpec
    from sharddit.parallel.blocks.sharding import BlockLayout, attach_block_sharding

    torch.set_num_threads(1)
    torch.manual_seed(0)
    n_blocks, heads, ranks = 4, 16, ["cpu", "cpu"]
    model = SeqToyDiT(dim=args.dim, heads=heads, n_blocks=n_blocks, ffn=4 * args.dim, in_dim=64).eval()
    x = torch.randn(args.batch, args.tokens, 64)
    t, ctx = torch.rand(args.batch), torch.randn(args.batch, 512, args.dim)
    layout = BlockLayout(("blocks",), (("x",),))
    handle = attach_block_sharding(model, layout, ["cpu"] * (n_blocks // 2) + ["cpu"] * (n_blocks // 2), "cpu")
    proxies = list(handle.proxies["blocks"])
    engine = attach_sequence_engine(handle.router, proxies, (TokenSpec({"x": 1, "e": 1, "freqs": 1}),), ranks)

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
    assert torch.equal(ref, out), f"outputs differ: {(ref - out).abs().max()}"
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
    print(f"model: dim {args.dim}, {heads} heads, {n_blocks} blocks, batch {args.batch}, {args.tokens} tokens, "
          f"ranks {','.join(ranks)}; groups {st.groups}")
    print(f"exchanged per forward per rank: {st.bytes_exchanged} bytes (analytic {analytic}); "
          f"exchanges {st.exchanges}; streamed {st.bytes_streamed}")
    print(f"median unsharded {statistics.median(times['unsharded']):.3f} s, "
          f"sequence {statistics.median(times['sequence']):.3f} s")
    engine.close()
    speedup, ceil = statistics.median(ratios), statistics.median(ceilings)
    print(f"ceiling={ceil:.3f} efficiency={speedup / ceil:.3f}")
    print(f"speedup={statistics.median(ratios):.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
