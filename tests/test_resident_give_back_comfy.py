"""Resident blocks are a cache, not a claim (issue 34): when another model's load asks ComfyUI's
manager for room mid-run, a shard's rank gives its resident copies back before any of the shard's
weights (``loaders/comfy/shard/resident_budgets.give_back_first``).

ComfyUI's own ``load_models_gpu`` loads a shard patcher (comfy ops, on this CPU); its
``LoadedModel.model_unload(memory_to_free)`` is what ``free_memory`` calls per loaded model when a
load needs room (0.3.64 and 0.33 alike). The copies are the real ring's: two ranks of the MM toy
recorded as cuda:0 and cuda:1 (test_stream_order), each keeping every block it streams.
"""
import pytest
import torch
from sharddit.parallel.sequence.record import RecordingOps
from test_stream_order import _engine, _inputs, _model

pytestmark = pytest.mark.comfy


def _loaded_shard(env, features=256, layers=4):
    import comfy.model_patcher
    import comfy.ops

    module = torch.nn.Sequential(*(comfy.ops.disable_weight_init.Linear(features, features) for _ in range(layers)))
    shard = comfy.model_patcher.ModelPatcher(module, load_device=torch.device("cpu"), offload_device=torch.device("cpu"))
    env.mm.load_models_gpu([shard])
    (loaded,) = [m for m in env.mm.current_loaded_models if m.model is shard]
    return shard, loaded


@pytest.fixture()
def resident_engine():
    """The engine after one forward with every streamed block kept: (engine, handle), closed after."""
    model = _model()
    _, handle, engine = _engine(model, RecordingOps())
    engine.keep_resident([1 << 30, 1 << 30])
    with torch.no_grad(), handle.router.forward_scope(sequence=True):
        model(*_inputs())
    yield engine, handle, model
    engine.close()
    handle.detach()


def test_a_load_that_needs_less_than_the_copies_takes_only_them(env, resident_engine):
    from sharddit.loaders.comfy.shard.resident_budgets import give_back_first

    engine, handle, model = resident_engine
    kept = [s.resident_bytes() for s in engine.streams]
    assert all(kept), kept
    shard, loaded = _loaded_shard(env)
    size = shard.loaded_size()
    give_back_first(shard, engine, "cuda:1")
    try:
        assert loaded.model_unload(kept[1]) is False  # ComfyUI: enough was freed, the model stays loaded
        assert shard.loaded_size() == size  # not one of the shard's weights moved
        assert [s.resident_bytes() for s in engine.streams] == [kept[0], 0]  # only cuda:1's copies went
        with torch.no_grad(), handle.router.forward_scope(sequence=True):
            model(*_inputs())
        assert engine.stats.bytes_streamed[0] == 0 and engine.stats.bytes_streamed[1] > 0  # cuda:1 streams now
        assert engine.streams[1].resident_bytes() == 0  # and keeps none for the rest of the run
    finally:
        env.mm.unload_all_models()


def test_a_larger_load_takes_the_copies_first_then_weights(env, resident_engine):
    from sharddit.loaders.comfy.shard.resident_budgets import give_back_first

    engine, _, _ = resident_engine
    kept = engine.streams[0].resident_bytes()
    shard, loaded = _loaded_shard(env)
    size = shard.loaded_size()
    assert size > 3 * kept, (size, kept)
    give_back_first(shard, engine, "cuda:0")
    try:
        assert loaded.model_unload(2 * kept) is False
        assert engine.streams[0].resident_bytes() == 0 and engine.streams[1].resident_bytes() > 0
        assert 0 < size - shard.loaded_size() < size  # the rest came from its weights, partly unloaded
    finally:
        env.mm.unload_all_models()
    assert engine.streams[1].resident_bytes() > 0  # cuda:1's shard was never asked


def test_the_runs_budgets_make_each_loaded_shard_give_back_first(env):
    """``apply_resident_budgets`` (what the PREPARE_SAMPLING wrapper calls once the models are
    loaded) hands each loaded shard its rank's copies to give back first."""
    from sharddit.loaders.comfy.shard.resident_budgets import apply_resident_budgets
    from sharddit.parallel.cost.memory import RankMemory
    from sharddit.parallel.placement.inventory import DeviceInfo, Inventory

    gib = 1 << 30
    model = _model()
    _, handle, engine = _engine(model, RecordingOps())
    rows = [RankMemory("cuda:0", gib, 0, 0), RankMemory("cuda:1", gib, 0, 0)]
    inventory = Inventory((DeviceInfo("cuda:0", "RTX 4090", 24 * gib, 8 * gib),
                           DeviceInfo("cuda:1", "RTX 4090", 24 * gib, gib // 2)), "nvml")
    shards = [_loaded_shard(env), _loaded_shard(env)]
    try:
        budgets = apply_resident_budgets(engine, rows, inventory, gib // 4, [s for s, _ in shards])
        assert budgets[0] > 0 and budgets[1] == gib // 4
        with torch.no_grad(), handle.router.forward_scope(sequence=True):
            model(*_inputs())
        kept = engine.streams[0].resident_bytes()
        assert kept > 0
        assert shards[0][1].model_unload(kept) is False and engine.streams[0].resident_bytes() == 0
        assert "partially_unload" in vars(shards[1][0]) and engine.streams[1].resident_bytes() > 0
    finally:
        engine.close()
        handle.detach()
        env.mm.unload_all_models()
