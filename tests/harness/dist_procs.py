"""Child processes for the distributed tests (pure torch, gloo on 127.0.0.1).

Run with ``multiprocessing`` spawn: the child re-imports this module (sys.path comes from the
parent), which imports the pack as ``sharddit``.
"""
from __future__ import annotations

import datetime
import socket

import torch
import torch.distributed as dist

from harness.pack import import_pack

import_pack()

from sharddit.parallel.distributed.exchange import DistExchange
from sharddit.parallel.sequence.split import plan_groups, rank_slices
from sharddit.parallel.sequence.ulysses import ulysses_attention

from harness import dist_toys  # noqa: F401 - the toys' blocks can run on workers


def run_ranks(target, world: int, folder, *args) -> list:
    """Spawn ``target(rank, world, port, *args, out_path)`` for every rank on a fresh 127.0.0.1 port,
    wait for each (120 s), kill any left alive, and return each rank's output file path."""
    import multiprocessing as mp

    ctx = mp.get_context("spawn")
    port = free_port()
    paths = [folder / f"rank{r}.pt" for r in range(world)]
    procs = [ctx.Process(target=target, args=(r, world, port, *args, str(p))) for r, p in enumerate(paths)]
    for p in procs:
        p.start()
    try:
        for p in procs:
            p.join(120)
            assert p.exitcode == 0, f"rank process exit code {p.exitcode}"
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
    return paths


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def attention_inputs(batch, tokens, heads, head_dim, tail=0):
    g = torch.Generator().manual_seed(3)
    return [torch.randn(batch, tokens + tail, heads * head_dim, generator=g) for _ in range(3)]


def sdpa(q, k, v, heads, **kwargs):
    b, _, c = q.shape
    d = c // heads
    q, k, v = (t.view(b, -1, heads, d).transpose(1, 2) for t in (q, k, v))
    out = torch.nn.functional.scaled_dot_product_attention(q, k, v)
    return out.transpose(1, 2).reshape(b, -1, heads * d)


def ulysses_rank(rank, world, port, tokens, heads, head_dim, out_path):
    """One rank of a gloo group: Ulysses attention on its token rows through ``DistExchange``."""
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=30))
    try:
        q, k, v = attention_inputs(1, tokens, heads, head_dim)
        rs = rank_slices(plan_groups(1, world), tokens)[rank]
        t0, t1 = rs.tokens
        group = dist.new_group(list(range(world)))
        ex = DistExchange(group, list(range(world)), "cpu", [f"rank {r}" for r in range(world)], 30)
        out = ulysses_attention(ex, rs, tokens, sdpa, (q[:, t0:t1], k[:, t0:t1], v[:, t0:t1], heads), {})
        torch.save({"out": out, "bytes": ex.bytes_received[rs.position], "calls": ex.calls[rs.position]},
                   out_path)
    finally:
        dist.destroy_process_group()


def ulysses_threads(world, tokens, heads, head_dim):
    """The same Ulysses attention in one process over ``ThreadExchange`` (the reference the
    cross-process runs must equal): outputs per rank and bytes each rank received."""
    from sharddit.parallel.sequence.threads import ThreadExchange, RankThreads

    q, k, v = attention_inputs(1, tokens, heads, head_dim)
    pool = RankThreads(["cpu"] * world, timeout_s=30)
    ex = ThreadExchange(["cpu"] * world, pool)
    tasks = []
    for rs in rank_slices(plan_groups(1, world), tokens):
        t0, t1 = rs.tokens
        tasks.append(pool.submit(rs.rank, lambda rs=rs, t0=t0, t1=t1: ulysses_attention(
            ex, rs, tokens, sdpa, (q[:, t0:t1], k[:, t0:t1], v[:, t0:t1], heads), {})))
    outs = [pool.wait(t, r) for r, t in enumerate(tasks)]
    pool.close()
    return outs, ex.bytes_received
