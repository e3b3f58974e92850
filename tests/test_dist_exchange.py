"""Ulysses attention across processes (pure torch, gloo on 127.0.0.1): ``DistExchange`` gives the
same bits as the in-process ``ThreadExchange`` and as unsharded attention."""
import multiprocessing as mp

import pytest
import torch
from harness import dist_procs


@pytest.mark.parametrize("world,tokens,heads", [(2, 24, 4), (2, 23, 3), (3, 22, 2)])
def test_dist_ulysses_bit_identical_to_threads_and_unsharded(tmp_path, world, tokens, heads):
    head_dim = 8
    ctx = mp.get_context("spawn")
    port = dist_procs.free_port()
    paths = [tmp_path / f"rank{r}.pt" for r in range(world)]
    procs = [ctx.Process(target=dist_procs.ulysses_rank, args=(r, world, port, tokens, heads, head_dim, str(p)))
             for r, p in enumerate(paths)]
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
    got = [torch.load(p) for p in paths]
    threads, thread_bytes = dist_procs.ulysses_threads(world, tokens, heads, head_dim)
    q, k, v = dist_procs.attention_inputs(1, tokens, heads, head_dim)
    ref = dist_procs.sdpa(q, k, v, heads)
    whole = torch.cat([g["out"] for g in got], dim=1)
    for r in range(world):
        assert torch.equal(got[r]["out"], threads[r])
        assert got[r]["calls"] == 2 and got[r]["bytes"] == thread_bytes[r]
        # the split sizes follow from the token and head ranges: no header all-to-all, no host sync for one
        assert got[r]["header_rounds"] == 0
    assert torch.equal(whole, torch.cat(threads, dim=1))
    assert torch.allclose(whole, ref, atol=1e-6)  # heads split: per head the same maths
