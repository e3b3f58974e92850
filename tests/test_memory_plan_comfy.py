"""The `sequence` memory plan inside real ComfyUI (in-process, CPU; issue 21): an explicit
``parallel=sequence`` that does not fit is refused before anything moves, naming the memory missing
per device; what the ring of streamed blocks holds is counted in the shard patchers' sizes, which
ComfyUI's ``load_models_gpu`` frees room for per device.

Tiny models (tests/harness/tiny_models.py) sharded over fake ``cuda:0,cuda:1`` inventories: sharding
builds patchers only, nothing is copied, so fake GPUs are enough on a CPU-only machine.
"""
import pytest
from harness.sampling import load as _load

pytestmark = pytest.mark.comfy
MiB = 1 << 20


@pytest.fixture(autouse=True)
def _placement_restored(env):
    """Sharding records where the DiT went, for later ``auto`` text encoder / VAE placement; a DiT
    recorded on these fake GPUs must not steer the next test's components onto them."""
    from harness.comfy_env import pack_module

    placement = pack_module(env, "loaders.comfy.core.component_placement")
    saved = placement.placed()
    yield
    with placement._LOCK:
        placement._PLACED.clear()
        placement._PLACED.update(saved)


def _modules(env):
    from harness.comfy_env import pack_module

    return (pack_module(env, "loaders.comfy.shard.pipeline"), pack_module(env, "loaders.comfy.shard.memory_report"),
            pack_module(env, "parallel.placement.inventory"), pack_module(env, "parallel.cost.mode"))


def _tight_inventory(sm, inv_mod, pm, model):
    """The smallest even two-GPU inventory (1 MiB steps) on which the plan fits but the ring does not."""
    from sharddit.parallel.placement.devices import parse_device_plan
    from sharddit.loaders.comfy.models.specs import get_arch_spec
    from sharddit.parallel.placement.planner import plan_placement
    from sharddit.parallel.placement.plan_text import PlacementError
    from sharddit.parallel.placement.plan_types import PlacementRequest
    from sharddit.loaders.comfy.shard.mode_decision import footprint_of

    dit = model.get_model_object("diffusion_model")
    layout = get_arch_spec(dit)
    fp = footprint_of(dit, layout)
    for mib in range(1, 4096):
        inv = inv_mod.inventory_from_spec(f"cuda:0={mib}MiB,cuda:1={mib}MiB")
        try:
            plan = plan_placement(inv, fp, PlacementRequest(devices=parse_device_plan("cuda:0,cuda:1")))
        except PlacementError:
            continue
        if len(plan.dit_devices) == 2 and pm.sequence_shortfalls(plan, fp, inv):
            return inv, mib
    raise AssertionError("no inventory where the plan fits and the ring does not")


def _weights(model):
    return {k: (v.device, v.data_ptr()) for k, v in model.model.state_dict().items()}


def test_explicit_sequence_refused_before_anything_moves(env, tiny):
    sm, mr, inv_mod, pm = _modules(env)
    model = _load(env, tiny.wan21_t2v_state_dict())
    inv, mib = _tight_inventory(sm, inv_mod, pm, model)
    weights = _weights(model)
    with pytest.raises(ValueError) as err:
        sm.shard_model(model, "cuda:0,cuda:1", 0.0, inventory=inv, parallel="sequence")
    text = str(err.value)
    assert text.startswith("[ShardDiT] parallel 'sequence' does not fit: cuda:")
    assert "MiB missing" in text and "parallel 'auto' or 'blocks'" in text
    assert model.object_patches == {} and model.additional_models == {} and _weights(model) == weights
    # auto on the same GPUs falls back to blocks; blocks is what was asked: both shard
    assert sm.shard_model(model, "cuda:0,cuda:1", 0.0, inventory=inv).get_attachment(mr.MODE_KEY).mode == "blocks"
    plain = sm.shard_model(model, "cuda:0,cuda:1", 0.0, inventory=inv, parallel="blocks")
    assert plain.get_attachment(mr.MODE_KEY).mode == "blocks"
    roomy = inv_mod.inventory_from_spec(f"cuda:0={2 * mib}MiB,cuda:1={2 * mib}MiB")
    fresh = _load(env, tiny.wan21_t2v_state_dict())  # (a shard state is kept per devices and reserve)
    ok = sm.shard_model(fresh, "cuda:0,cuda:1", 0.0, inventory=roomy, parallel="sequence")
    assert ok.get_attachment(mr.MODE_KEY).mode == "sequence"


def _prepare(sm, mr, model, noise_shape):
    """Run ShardDiT's memory wrapper as ComfyUI's prepare_sampling does; the shard sizes ComfyUI's
    ``load_models_gpu`` would read (the executor stands for that load)."""
    seen = {}

    def executor(m, shape, *args, **kwargs):
        seen["sizes"] = [(str(s.load_device), s.model_size()) for s in mr.get_shard_patchers(m)]
        return "loaded"

    assert mr.sequence_memory_wrapper(executor, model, noise_shape, {}, {}) == "loaded"
    return seen["sizes"]


def test_ring_counted_in_shard_sizes_per_block_shape(env, tiny):
    """HunyuanVideo's tiny model: a double block on cuda:0, a single block on cuda:1; each rank
    streams the other's block (one buffer of that shape): its shard reports it to ComfyUI."""
    sm, mr, inv_mod, _ = _modules(env)
    model = _load(env, tiny.hunyuan_video_state_dict())
    roomy = inv_mod.inventory_from_spec("cuda:0=4GiB,cuda:1=4GiB")
    seq = sm.shard_model(model, "cuda:0,cuda:1", 0.0, inventory=roomy, parallel="sequence")
    state = mr.get_shard_state(seq)
    assert seq.get_attachment(mr.MODE_KEY).mode == "sequence" and state.plan.block_devices() == ("cuda:0", "cuda:1")
    blocks = [env.mm.module_size(s.model) for s in mr.get_shard_patchers(seq)]
    assert blocks[0] != blocks[1]  # two block shapes
    assert _prepare(sm, mr, seq, (1, 16, 2, 8, 8)) == [("cuda:0", blocks[0] + blocks[1]), ("cuda:1", blocks[1] + blocks[0])]
    plain = sm.shard_model(model, "cuda:0,cuda:1", 0.0, inventory=roomy, parallel="blocks")
    assert _prepare(sm, mr, plain, (1, 16, 2, 8, 8)) == [("cuda:0", blocks[0]), ("cuda:1", blocks[1])]


def test_sequence_refused_at_sampling_when_the_latent_does_not_fit(env, tiny, monkeypatch):
    """Free memory at sampling time (another model loaded meanwhile): the latent's plan (weights,
    ring, the activations of its tokens) is checked before ComfyUI loads anything."""
    sm, mr, inv_mod, _ = _modules(env)
    model = _load(env, tiny.wan21_t2v_state_dict())
    seq = sm.shard_model(model, "cuda:0,cuda:1", 0.0, inventory=inv_mod.inventory_from_spec("cuda:0=4GiB,cuda:1=4GiB"),
                         parallel="sequence")
    small = (1, 16, 3, 10, 10)
    rows = mr.latent_plan(seq, mr.get_shard_state(seq), small)
    big = mr.latent_plan(seq, mr.get_shard_state(seq), (1, 16, 21, 60, 104))
    assert all(b.activations > 100 * r.activations for r, b in zip(rows, big, strict=True))  # from tokens
    need = max(r.total for r in big)
    monkeypatch.setattr(mr, "current_inventory",
                        lambda: inv_mod.inventory_from_spec(f"cuda:0={need // MiB - 1}MiB,cuda:1=4GiB"))
    assert _prepare(sm, mr, seq, small)  # the small latent fits
    with pytest.raises(ValueError, match=r"^\[ShardDiT\] parallel 'sequence' does not fit latent \(1, 16, 21, 60, "
                                         r"104\): cuda:0 needs .* MiB missing\. Fix: parallel 'auto'"):
        mr.sequence_memory_wrapper(lambda *a: pytest.fail("loaded"), seq, (1, 16, 21, 60, 104), {}, {})
    auto = sm.shard_model(model, "cuda:0,cuda:1", 0.0, inventory=inv_mod.inventory_from_spec("cuda:0=4GiB,cuda:1=4GiB"))
    assert mr.sequence_memory_wrapper(lambda *a: "loaded", auto, (1, 16, 21, 60, 104), {}, {}) == "loaded"
