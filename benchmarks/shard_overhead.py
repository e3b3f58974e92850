"""Overhead of block sharding on one device: sharded ``cpu,cpu`` vs unsharded, same model, one run.

A Wan-shaped DiT (dim 1024, 8 blocks, 1024 video tokens + 128 text tokens, fp32 on CPU): each
block takes the hidden state ``x``, timestep modulation ``e`` (B, 6, dim), rotary ``freqs``, the
text ``context`` and ``transformer_options`` holding a tensor, exactly the argument mix the engine
routes for ComfyUI's WanModel. Runs alternate unsharded / sharded (order flipped every repetition)
after one warm-up each. Time is the process CPU time of each forward on ONE torch thread by
default (wall time on a machine shared with other jobs varies by tens of percent; CPU time still
counts every cycle the routing spends); the result is the median of the per-pair ratios (robust
to load drift). Wall-time medians are printed too. Outputs are checked bit-identical. ``cpu,cpu``
means no tensor ever changes device, so hops and constant copies per forward are 0 here: the ratio
is the cost of the proxies and the routing scan itself.

    python benchmarks/shard_overhead.py [--reps 7] [--tokens 1024] [--threads 1] [--wall]

The last line is ``ratio=<sharded/unsharded>``.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch
from torch import nn
from torch.nn import functional as F

REPO = Path(__file__).resolve().parents[1]


def import_pack():
    """The pack as package ``sharddit``, by path (``tests/harness/pack.py``; tests/ only on sys.path)."""
    sys.path.insert(0, str(REPO / "tests"))
    from harness.pack import import_pack as _import_pack

    return _import_pack()


class WanLikeBlock(nn.Module):
    def __init__(self, dim: int, ffn: int, heads: int):
        super().__init__()
        self.heads = heads
        self.norm = nn.LayerNorm(dim, elementwise_affine=False)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.o = nn.Linear(dim, dim)
        self.cq, self.ckv, self.co = nn.Linear(dim, dim), nn.Linear(dim, 2 * dim), nn.Linear(dim, dim)
        self.ffn = nn.Sequential(nn.Linear(dim, ffn), nn.GELU(approximate="tanh"), nn.Linear(ffn, dim))
        self.modulation = nn.Parameter(torch.randn(1, 6, dim) / dim ** 0.5)

    def _attn(self, q, k, v):
        b, n, d = q.shape
        split = lambda t: t.view(b, -1, self.heads, d // self.heads).transpose(1, 2)  # noqa: E731
        return F.scaled_dot_product_attention(split(q), split(k), split(v)).transpose(1, 2).reshape(b, n, d)

    def forward(self, x, e, freqs, context, transformer_options={}):
        e = (self.modulation + e).chunk(6, dim=1)
        q, k, v = self.qkv(self.norm(x) * (1 + e[1]) + e[0]).chunk(3, dim=-1)
        q, k = q * freqs, k * freqs
        x = x + self.o(self._attn(q, k, v)) * e[2]
        k, v = self.ckv(context).chunk(2, dim=-1)
        x = x + self.co(self._attn(self.cq(self.norm(x)), k, v))
        x = x + self.ffn(self.norm(x) * (1 + e[4]) + e[3]) * e[5]
        return x * transformer_options["scale"]


class WanLikeDiT(nn.Module):
    def __init__(self, dim=1024, blocks=8, ffn=2816, heads=8, in_dim=16):
        super().__init__()
        self.dim = dim
        self.embed = nn.Linear(in_dim, dim)
        self.time = nn.Sequential(nn.Linear(1, dim), nn.SiLU(), nn.Linear(dim, 6 * dim))
        self.blocks = nn.ModuleList(WanLikeBlock(dim, ffn, heads) for _ in range(blocks))
        self.head = nn.Linear(dim, in_dim)

    def forward(self, x, t, context, transformer_options):
        x = self.embed(x)
        e = self.time(t[:, None]).view(-1, 6, self.dim)
        pos = torch.arange(x.shape[1], dtype=x.dtype)[:, None]
        freqs = torch.cos(pos * torch.linspace(0.01, 1.0, self.dim))
        for block in self.blocks:
            x = block(x, e=e, freqs=freqs, context=context, transformer_options=transformer_options)
        return self.head(x)


def _time(model, inputs) -> tuple[float, float, torch.Tensor]:
    wall, cpu = time.perf_counter(), time.process_time()
    out = model(*inputs)
    return time.process_time() - cpu, time.perf_counter() - wall, out


def main(argv=None) -> float:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--tokens", type=int, default=1024)
    ap.add_argument("--context", type=int, default=128, help="text tokens")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (0: torch's default)")
    ap.add_argument("--wall", action="store_true", help="ratio from wall time instead of CPU time")
    opts = ap.parse_args(argv)
    if opts.threads:
        torch.set_num_threads(opts.threads)
    import_pack()
    from sharddit.parallel.blocks.sharding import attach_block_sharding
    from sharddit.parallel.blocks.routing import BlockLayout

    torch.manual_seed(0)
    model = WanLikeDiT().eval()
    layout = BlockLayout(("blocks",), (("x",),))
    n = len(model.blocks)
    devices = ["cpu"] * n  # two shards, cpu,cpu: blocks 0-3 and 4-7
    inputs = (torch.randn(1, opts.tokens, 16), torch.tensor([0.5]), torch.randn(1, opts.context, model.dim),
              {"scale": torch.tensor(1.0), "cond_or_uncond": [0]})
    handle = attach_block_sharding(model, layout, devices, "cpu")
    handle.detach()
    times = {"unsharded": [], "sharded": []}
    walls = {"unsharded": [], "sharded": []}
    with torch.inference_mode():
        _, _, ref = _time(model, inputs)  # warm-up
        for rep in range(opts.reps + 1):
            for kind in (("unsharded", "sharded") if rep % 2 else ("sharded", "unsharded")):
                handle = attach_block_sharding(model, layout, devices, "cpu") if kind == "sharded" else None
                with (handle.router.forward_scope() if handle else _null()):
                    dt, wall, out = _time(model, inputs)
                stats = handle.stats if handle else None
                if handle:
                    handle.detach()
                assert torch.equal(out, ref), "sharded output differs from unsharded"
                if rep:  # rep 0 warms the sharded path up
                    times[kind].append(dt)
                    walls[kind].append(wall)
    used = walls if opts.wall else times
    pairs = [s / u for s, u in zip(used["sharded"], used["unsharded"])]
    print(f"model: dim {model.dim}, {n} blocks, {opts.tokens} tokens + {opts.context} text, "
          f"threads {torch.get_num_threads()}")
    print(f"per forward: hops={stats.hops} constant_copies={stats.constant_copies} blocks_run={stats.blocks_run}")
    for label, d in (("cpu time", times), ("wall time", walls)):
        print(f"{label}: unsharded median {statistics.median(d['unsharded']) * 1000:.1f} ms, sharded median "
              f"{statistics.median(d['sharded']) * 1000:.1f} ms ({opts.reps} interleaved repetitions)")
    print("outputs bit-identical: True")
    print(f"pair ratios ({'wall' if opts.wall else 'cpu'} time): {' '.join(f'{r:.3f}' for r in pairs)}")
    ratio = statistics.median(pairs)
    print(f"ratio={ratio:.4f}")
    return ratio


class _null:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


if __name__ == "__main__":
    main()
