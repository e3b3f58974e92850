"""Ulysses attention across processes (pure torch, gloo on 127.0.0.1): ``DistExchange`` gives the
same bits as the in-process ``ThreadExchange`` and as unsharded attention."""
import json

import pytest
import torch
from harness import dist_procs, dist_syncs
from harness.numerics import assert_split_close


@pytest.mark.parametrize("world,tokens,heads", [(2, 24, 4), (2, 23, 3), (3, 22, 2)])
def test_dist_ulysses_bit_identical_to_threads_and_unsharded(tmp_path, world, tokens, heads):
    head_dim = 8
    paths = dist_procs.run_ranks(dist_procs.ulysses_rank, world, tmp_path, tokens, heads, head_dim)
    got = [torch.load(p) for p in paths]
    threads, thread_bytes = dist_procs.ulysses_threads(world, tokens, heads, head_dim)
    q, k, v = dist_procs.attention_inputs(1, tokens, heads, head_dim)
    ref = dist_procs.sdpa(q, k, v, heads)
    whole = torch.cat([g["out"] for g in got], dim=1)
    for r in range(world):
        assert torch.equal(got[r]["out"], threads[r])
        # two all-to-alls, of the parts' bytes only: the split sizes follow from the token and head ranges
        assert got[r]["calls"] == 2 and got[r]["bytes"] == thread_bytes[r]
    assert torch.equal(whole, torch.cat(threads, dim=1))
    assert torch.allclose(whole, ref, atol=1e-6)  # heads split: per head the same maths


def test_the_gloo_path_waits_on_the_host_once_per_exchange_call(tmp_path):
    """Issue 30, fix 5: the ranks' tensors taken for GPU tensors (``harness.dist_syncs``), every
    all-to-all stages what a process sends through one page-locked buffer with one host wait, and
    receives into one without any: no per-item copy to the host, no header (the sizes are known).
    The result stays bit-identical to the in-process exchange."""
    world, tokens, heads, head_dim = 2, 24, 4, 8
    paths = dist_procs.run_ranks(dist_syncs.ulysses_rank_as_gpu, world, tmp_path, tokens, heads, head_dim)
    threads, _ = dist_procs.ulysses_threads(world, tokens, heads, head_dim)
    for r, path in enumerate(paths):
        got = torch.load(path)
        counts = json.loads(path.with_name(path.name + ".syncs.json").read_text())
        assert torch.equal(got["out"], threads[r])
        assert counts["calls"] == got["calls"] == 2
        assert counts["host_sync"] == counts["calls"], counts  # one wait per call: before gloo reads the bytes
        assert counts["buffers"] == [True, True] * counts["calls"], counts  # send and receive, page-locked
        assert counts["reads"] == {}, counts  # nothing else copied to or read on the host


def test_the_local_path_has_no_host_sync(monkeypatch):
    """Ranks that are threads of one process (``cpu,cpu``, the in-process exchange) call nothing that
    makes the host wait for a GPU in a forward: no ``host_sync``, no read or copy to the host
    (``item``, ``tolist``, ``cpu``, ``numpy``), no stream, event or device synchronize. On a GPU
    ``benchmarks/gpu_check.py`` (``syncs``) checks the same with CUDA's own sync debug mode."""
    from harness.seq_models import engine_for as _engine, run_sequence as _run, toy_copies as _copies, toy_inputs as _inputs

    from sharddit.parallel.distributed import wire

    calls = []

    def counted(owner, name):
        real = getattr(owner, name)
        monkeypatch.setattr(owner, name, lambda *a, **k: (calls.append(name), real(*a, **k))[1])

    for name in ("item", "tolist", "cpu", "numpy"):
        counted(torch.Tensor, name)
    counted(torch.cuda, "synchronize")
    counted(torch.cuda.Event, "synchronize")
    counted(torch.cuda.Stream, "synchronize")
    counted(wire, "host_sync")
    model, ref_model = _copies(2)
    handle, engine = _engine(model, ["cpu", "cpu"])
    try:
        x = _inputs(1)
        out = _run(handle, model, *x)
        assert engine.stats.blocks_run == [4, 4] and engine.stats.exchanges == [8, 8]
    finally:
        engine.close()
    assert calls == []
    with torch.no_grad():
        assert_split_close(out, ref_model(*x), what="cpu,cpu")
