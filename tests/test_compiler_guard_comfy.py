"""ShardDiT under the Comfy Compiler (core 0.35+), in real ComfyUI (in-process, CPU, tiny Wan 2.1).

The compiler needs CUDA and comfy-aimdo, and 0.35+ cannot be run here, so ``StandInPrefetch`` stands
in for what ShardDiT detects in 0.38.1's ``comfy/model_prefetch.py``: a per-thread malloc graph
(``MALLOC_GRAPHS[threading.get_ident()]``, recording while ``_comfy_active``) and
``pause_malloc_graph()``, which pauses this thread's graph while inside it. Written here from
those names, put in ``sys.modules`` as ``comfy.model_prefetch`` for one test (on 0.33 in front of
core's own module, which has neither).

- `blocks`: every block call (moves between GPUs, the block on its GPU, the move home) runs with
  the graph paused, as core keeps such work out of it;
- `sequence`: rank threads allocate beyond any pause, so while a graph records every block runs
  whole and ShardDiT says once which flag runs it split (``--disable-comfy-compiler``);
- a block captured into a CUDA graph is refused, naming ``--disable-cuda-graphs``.
"""
import contextlib
import threading
import types

import pytest
import torch
from harness.comfy_env import pack_module
from harness.numerics import COMFY_SPLIT_BOUND, assert_split_close
from harness.sampling import load, ours, stock

pytestmark = pytest.mark.comfy

LATENT = (1, 16, 2, 8, 8)


class StandInGraph:
    def __init__(self):
        self._comfy_active = True
        self.paused = 0
        self.pauses = 0

    def pause(self, sync=False):
        self.paused += 1
        self.pauses += 1

    def resume(self, sync=False):
        self.paused -= 1


def _stand_in_prefetch():
    prefetch = types.ModuleType("comfy.model_prefetch")
    prefetch.MALLOC_GRAPHS = {}

    @contextlib.contextmanager
    def pause_malloc_graph(sync=False):
        graph = prefetch.MALLOC_GRAPHS.get(threading.get_ident())
        active = graph is not None and graph._comfy_active
        if active:
            graph.pause(sync=sync)
        try:
            yield
        finally:
            if active:
                graph.resume(sync=sync)

    @contextlib.contextmanager
    def recording():
        graph = prefetch.MALLOC_GRAPHS[threading.get_ident()] = StandInGraph()
        try:
            yield graph
        finally:
            del prefetch.MALLOC_GRAPHS[threading.get_ident()]

    prefetch.pause_malloc_graph = pause_malloc_graph
    prefetch.recording = recording
    return prefetch


@pytest.fixture
def prefetch(monkeypatch):
    stand_in = _stand_in_prefetch()
    monkeypatch.setitem(__import__("sys").modules, "comfy.model_prefetch", stand_in)
    return stand_in


def _engine(model):
    states = list(model.model.__dict__.get("_sharddit_states", {}).values())
    assert len(states) == 1, states
    return states[0].router.engine


def test_blocks_mode_runs_every_block_with_the_graph_paused(env, tiny, prefetch):
    model = load(env, tiny.wan21_t2v_state_dict())
    latent = torch.zeros(LATENT)
    ref = stock(env, model, latent, {}, cfg=3.0)
    seen = []
    hooks = [b.register_forward_pre_hook(lambda m, a: seen.append(threading.get_ident()))
             for b in model.model.diffusion_model.blocks]
    paused_at = []
    try:
        with prefetch.recording() as graph:
            hooks += [b.register_forward_pre_hook(lambda m, a: paused_at.append(graph.paused))
                      for b in model.model.diffusion_model.blocks]
            got = ours(env, model, latent, {}, "cpu,cpu", cfg=3.0, parallel="blocks")
    finally:
        for h in hooks:
            h.remove()
    assert paused_at and all(p > 0 for p in paused_at), f"blocks ran with the graph recording: {paused_at}"
    assert graph.paused == 0 and graph.pauses >= len(paused_at)
    assert torch.equal(got, ref)


def test_sequence_under_the_compiler_runs_whole_and_names_the_flag_once(env, tiny, prefetch, caplog):
    model = load(env, tiny.wan21_t2v_state_dict())
    latent = torch.zeros(LATENT)
    ref = stock(env, model, latent, {}, cfg=1.0)
    with caplog.at_level("WARNING", logger="sharddit"), prefetch.recording() as graph:
        got = ours(env, model, latent, {}, "cpu,cpu", cfg=1.0, parallel="sequence")
    stats = _engine(model).stats
    assert stats.fallbacks == 4 and sum(stats.blocks_run) == 0 and graph.pauses >= 4
    said = [r.getMessage() for r in caplog.records if "--disable-comfy-compiler" in r.getMessage()]
    assert len(said) == 1, said
    assert_split_close(got, ref, COMFY_SPLIT_BOUND, "sequence under the compiler (run whole)")
    again = ours(env, model, latent, {}, "cpu,cpu", cfg=1.0, parallel="sequence")  # no graph recording now
    assert _engine(model).stats.fallbacks == 0 and sum(_engine(model).stats.blocks_run) == 8
    assert_split_close(again, ref, COMFY_SPLIT_BOUND, "sequence without the compiler (split)")


def test_a_block_captured_into_a_cuda_graph_is_refused_with_the_flag(env, tiny, monkeypatch):
    guard = pack_module(env, "loaders.comfy.shard.compile_guard")
    monkeypatch.setattr(guard, "cuda_graph_capturing", lambda: True)
    model = load(env, tiny.wan21_t2v_state_dict())
    with pytest.raises(RuntimeError, match=r"\[ShardDiT\].*CUDA graph.*--disable-cuda-graphs"):
        ours(env, model, torch.zeros(LATENT), {}, "cpu,cpu", cfg=1.0, parallel="blocks")
