"""Distributed `sequence` mode: an engine whose model was released (``close``: the workers drop its
blocks) runs again when ComfyUI reuses the same sharded model (issue 19, "fails every second
prompt": ComfyUI releases the shards when another clone of the weights takes over, e.g. a new
prompt, then samples the cached shard state again). Toy DiT, gloo on 127.0.0.1."""
import pytest
import torch
from harness import dist_procs
from sharddit.parallel.distributed.weights import WeightLayout
from sharddit.parallel.distributed.ranks import attach_remote_ranks

from harness.seq_models import engine_for as _engine, run_sequence as _run, toy_copies as _copies, toy_inputs as _inputs  # noqa: E402

TIMEOUT_S = 8.0


@pytest.fixture
def lobby():
    with dist_procs.lobby_with_workers(TIMEOUT_S, ("w1",)) as lob:
        yield lob


@pytest.mark.parametrize("keep_all", [True, False])
def test_a_closed_engine_runs_again_and_resends_the_dropped_blocks(lobby, keep_all):
    model, local_model = _copies(2)
    block = WeightLayout(local_model.blocks[0]).nbytes
    handle, engine = _engine(model, ["cpu", "cpu"])
    lhandle, lengine = _engine(local_model, ["cpu", "cpu"])
    ranks = attach_remote_ranks(engine, lobby, {1: "w1/cpu"}, {"w1/cpu": "cpu"}, keep_all=keep_all)
    owned = 4 if keep_all else 2
    try:
        for batch in (1, 2, 1):
            x = _inputs(batch)
            # the all-local cpu,cpu engine splits the same way (same GEMM shapes): equal on any CPU
            assert torch.equal(_run(handle, model, *x), _run(lhandle, local_model, *x)), batch
            assert ranks.held_bytes(1)["owned"] == owned * block
            engine.close()  # the model is released between prompts; the worker drops its blocks
            assert lobby.session is not None and ranks.held_bytes(1)["owned"] == 0
    finally:
        engine.close()
        lengine.close()
