"""`parallel=sequence` inside real ComfyUI (in-process, CPU, PyTorch attention): every rank runs every
block on its share of cond/uncond and tokens, exchanging q/k/v (Ulysses) through ComfyUI's
``optimized_attention_override`` hook. Compared with core's KSampler on the same weights.

Tiny models (tests/harness/tiny_models.py): Wan 2.1 dim 256 = 2 heads, latent 1x16x3x10x10 -> 75
tokens: 38/37 on ``cpu,cpu`` (uneven), 25 each on ``cpu,cpu,cpu`` where the third rank gets no head.

Every split gives some GEMM other shapes than core's unsplit run: a rank's token rows (38/37 of
75), one sample of cond/uncond (a Linear on 1 row of modulation instead of 2). MKL picks its kernel
by CPU kind and by shape, so a row may be summed in another order: each comparison with core is
equal or within ``COMFY_SPLIT_BOUND`` (tests/harness/numerics.py: the figures measured across MKL
kernel paths and CPU kinds, e.g. 4.8e-5 for a cond/uncond split after 4 steps on an AVX-512 host).
"""
import pytest
import torch
from harness.numerics import COMFY_SPLIT_BOUND, assert_split_close
from harness.sampling import SEED, load, lora_loader, ours, stock
from harness.sampling import cond as _cond

pytestmark = pytest.mark.comfy


def _family(tiny, name):
    """(state dict, latent shape, conditioning extras). Wan's text encoder pads to 512 tokens; the
    text projections then run on M = 512 rows per sample whether cond and uncond are batched or
    split (fewer rows would let BLAS pick another kernel for the text too)."""
    g = torch.Generator().manual_seed(7)
    pooled = {"pooled_output": torch.randn(1, 768, generator=g)}
    return {
        "wan21": (tiny.wan21_t2v_state_dict, (1, 16, 3, 10, 10), {"tokens": 512}),
        "ltxv": (tiny.ltxv_state_dict, (1, 128, 3, 5, 5),
                 {"tokens": 128, "attention_mask": torch.ones(1, 128, dtype=torch.long)}),
        "hunyuan_video": (tiny.hunyuan_video_state_dict, (1, 16, 2, 8, 8), pooled),
    }[name]


def _load(sd):
    return load(None, sd)


def _stock(env, model, latent, extras, cfg):
    return stock(env, model, latent, extras, cfg=cfg)


def _ours(env, model, latent, extras, devices, cfg, parallel="sequence"):
    return ours(env, model, latent, extras, devices, cfg=cfg, parallel=parallel)


def _engine(env, model):
    """The sequence engine of the shard state ShardDiT cached on ``model``'s weights."""
    states = list(model.model.__dict__.get("_sharddit_states", {}).values())
    assert len(states) == 1, states
    return states[0].router.engine


# (HunyuanVideo's tiny model has 2 blocks, so cpu,cpu,cpu plans 2 ranks: a batch split at cfg > 1 too.)


@pytest.mark.parametrize("family", ["wan21", "ltxv", "hunyuan_video"])
@pytest.mark.parametrize("cfg", [1.0, 3.0])
@pytest.mark.parametrize("devices", ["cpu,cpu", "cpu,cpu,cpu"])
def test_sequence_matches_core_ksampler(env, tiny, family, cfg, devices):
    build, shape, extras = _family(tiny, family)
    model = _load(build())
    latent = torch.zeros(shape)
    ref = _stock(env, model, latent, extras, cfg)
    got = _ours(env, model, latent, extras, devices, cfg)
    stats = _engine(env, model).stats
    assert stats.fallbacks == 0 and sum(stats.blocks_run) == len(stats.blocks_run) * _n_blocks(family)
    batch_split = len(stats.groups) > 1
    assert batch_split == (cfg > 1 and len(stats.blocks_run) == 2)
    split = "cond/uncond" if batch_split else "tokens"
    assert_split_close(got, ref, COMFY_SPLIT_BOUND, f"{family} {devices} cfg {cfg} ({split} split)")


@pytest.mark.parametrize("cfg", [1.0, 3.0])
def test_hunyuan_sequence_on_three_ranks_matches_core(env, tiny, cfg):
    """HunyuanVideo with 3 blocks (1 double + 2 single), so ``cpu,cpu,cpu`` plans three ranks: one
    group of three at both cfgs (2 samples do not split in 3), 32 image tokens cut 11/11/10, 2 heads
    (the third rank only relays), the text tokens on every rank on the side the model puts them
    (after the image tokens before ComfyUI 0.14, before them since). Uneven rows change GEMM shapes,
    so a bound: measured max diff on ComfyUI 0.29.0 and 0.3.64 (torch 2.14.1, AMD EPYC AVX2): 0 with
    the default and MKL_CBWR=AVX2 kernels, 2.9e-6 (cfg 1) and 9.3e-6 (cfg 3) with MKL_CBWR=COMPATIBLE;
    the token order taken the wrong way round gives 0.9995 (cfg 1, cpu,cpu)."""
    _, shape, extras = _family(tiny, "hunyuan_video")
    model = _load(tiny.hunyuan_video_state_dict(depth_single_blocks=2))
    latent = torch.zeros(shape)
    ref = _stock(env, model, latent, extras, cfg)
    got = _ours(env, model, latent, extras, "cpu,cpu,cpu", cfg)
    stats = _engine(env, model).stats
    assert stats.fallbacks == 0 and stats.blocks_run == [3, 3, 3] and len(stats.groups) == 1
    assert_split_close(got, ref, COMFY_SPLIT_BOUND, f"hunyuan cpu,cpu,cpu cfg {cfg} (uneven rows)")


def _n_blocks(family):
    return {"wan21": 4, "ltxv": 2, "hunyuan_video": 2}[family]


def _lora_loader(env, tiny, tmp_path, sd):
    return lora_loader(env, tiny, tmp_path, sd, name="tiny_wan_lora_seq.safetensors")


WAN_EVEN = (1, 16, 2, 8, 8)  # 32 tokens: 16 per rank on cpu,cpu


@pytest.mark.parametrize("cfg", [1.0, 3.0])
def test_sequence_with_lora_before_and_after_sharding(env, tiny, tmp_path, cfg):
    sd = tiny.wan21_t2v_state_dict()
    apply_lora = _lora_loader(env, tiny, tmp_path, sd)
    extras = {"tokens": 512}
    latent = torch.zeros(WAN_EVEN)
    base = _load(sd)
    plain = _stock(env, base, latent, extras, cfg)
    ref = _stock(env, apply_lora(base), latent, extras, cfg)
    assert not torch.equal(ref, plain), "the LoRA must change the output, or this test proves nothing"
    first = _ours(env, apply_lora(base), latent, extras, "cpu,cpu", cfg)
    assert_split_close(first, ref, COMFY_SPLIT_BOUND, f"LoRA before sharding, cfg {cfg}")
    shard = env.nodes.NODE_CLASS_MAPPINGS["ShardDiTShardModel"]
    sharded = shard.execute(base, "cpu,cpu", 0.0, "sequence").result[0]
    after = _ours(env, apply_lora(sharded), latent, extras, "cpu,cpu", cfg, parallel="auto")
    assert torch.equal(after, first)  # the same split of the same patched weights: the same shapes
    assert_split_close(_ours(env, sharded, latent, extras, "cpu,cpu", cfg, parallel="auto"), plain, COMFY_SPLIT_BOUND,
                       f"sharded without the LoRA, cfg {cfg}")


def test_wan22_two_experts_sequence(env, tiny):
    high_sd, low_sd = tiny.wan22_t2v_pair_state_dicts()
    shard = env.nodes.NODE_CLASS_MAPPINGS["ShardDiTShardModel"]
    adv = env.nodes.KSamplerAdvanced()
    latent = {"samples": torch.zeros(WAN_EVEN)}
    pos, neg = _cond(tokens=512), _cond(tokens=512, seed=2)

    def run(high, low):
        x = adv.sample(high, "enable", SEED, 4, 3.5, "euler", "simple", pos, neg, latent, 0, 2, "enable")[0]
        return adv.sample(low, "disable", SEED, 4, 3.5, "euler", "simple", pos, neg, x, 2, 4, "disable")[0]["samples"]

    high, low = _load(high_sd), _load(low_sd)
    ref = run(high, low)
    got = run(shard.execute(high, "cpu,cpu", 0.0, "sequence").result[0],
              shard.execute(low, "cpu,cpu", 0.0, "sequence").result[0])
    assert_split_close(got, ref, COMFY_SPLIT_BOUND, "Wan 2.2 two experts")


def test_sub_quadratic_attention_stays_close(env, tiny):
    """CPU's default attention (sub-quadratic, chunked by free memory) instead of PyTorch's: the
    q/k/v chunks differ between a whole and a split run, so the last bits may move (bounded)."""
    import comfy.ldm.modules.attention as attn

    def sub_quad(func, *args, **kwargs):  # kwargs carry _inside_attn_wrapper: no second override call
        return attn.attention_sub_quad(*args, **kwargs)

    model = _load(tiny.wan21_t2v_state_dict())
    model.model_options.setdefault("transformer_options", {})["optimized_attention_override"] = sub_quad
    latent = torch.zeros(WAN_EVEN)
    pytorch_ref = _stock(env, _load(tiny.wan21_t2v_state_dict()), latent, {"tokens": 512}, 3.0)
    ref = _stock(env, model, latent, {"tokens": 512}, 3.0)
    assert not torch.equal(ref, pytorch_ref), "the override must really switch the attention"
    got = _ours(env, model, latent, {"tokens": 512}, "cpu,cpu,cpu", 3.0)
    diff = (got - ref).abs().max().item()
    assert diff <= 1e-4, f"sub-quadratic attention: max diff {diff}"


def _sharded_sequence(env, tiny):
    base = _load(tiny.wan21_t2v_state_dict())
    shard = env.nodes.NODE_CLASS_MAPPINGS["ShardDiTShardModel"]
    return base, shard.execute(base, "cpu,cpu", 0.0, "sequence").result[0]


def _proxies(env, model):
    states = list(model.model.__dict__["_sharddit_states"].values())
    return list(states[0].proxies["blocks"])


def _seq_threads():
    import threading

    return [t for t in threading.enumerate() if t.name.startswith("sharddit-seq")]


def test_worker_fault_names_the_device_and_next_prompt_is_undisturbed(env, tiny):
    import threading

    base, sharded = _sharded_sequence(env, tiny)
    latent, extras = torch.zeros(WAN_EVEN), {"tokens": 512}
    ref = _stock(env, base, latent, extras, 3.0)
    block = _proxies(env, sharded)[2].real_block

    def faulty(*args, **kwargs):
        if threading.current_thread().name.startswith("sharddit-seq-1"):
            raise RuntimeError("CUDA out of memory (injected)")
        return type(block).forward(block, *args, **kwargs)

    block.forward = faulty
    before = set(_seq_threads())
    try:
        with pytest.raises(RuntimeError, match=r"sequence worker 1 on cpu failed during block 2: .*injected"):
            _ours(env, sharded, latent, extras, "cpu,cpu", 3.0, parallel="auto")
    finally:
        del block.forward
    assert set(_seq_threads()) <= before and _engine(env, sharded).pool is None, \
        "a failed forward must join its worker threads"
    assert_split_close(_ours(env, sharded, latent, extras, "cpu,cpu", 3.0, parallel="auto"), ref, COMFY_SPLIT_BOUND,
                       "after a worker fault")


def test_interrupt_inside_a_sequence_forward_stops_at_the_next_block(env, tiny):
    """ComfyUI's interrupt flag is read before every block (not only between steps)."""
    import threading

    base, sharded = _sharded_sequence(env, tiny)
    latent, extras = torch.zeros(WAN_EVEN), {"tokens": 512}
    ref = _stock(env, base, latent, extras, 1.0)
    proxies = _proxies(env, sharded)
    seen = []
    block = proxies[1].real_block

    def interrupting(*args, **kwargs):
        if threading.current_thread().name.startswith("sharddit-seq-0"):
            env.mm.interrupt_current_processing(True)
        seen.append(1)
        return type(block).forward(block, *args, **kwargs)

    block.forward = interrupting
    engine = _engine(env, sharded)
    before = set(_seq_threads())
    try:
        with pytest.raises(env.mm.InterruptProcessingException):
            _ours(env, sharded, latent, extras, "cpu,cpu", 1.0, parallel="auto")
    finally:
        del block.forward
        env.mm.interrupt_current_processing(False)
    assert 0 < sum(engine.stats.blocks_run) < 2 * len(proxies), engine.stats  # stopped inside the first forward
    assert set(_seq_threads()) <= before and engine.pool is None
    assert_split_close(_ours(env, sharded, latent, extras, "cpu,cpu", 1.0, parallel="auto"), ref, COMFY_SPLIT_BOUND,
                       "after an interrupt")


def test_streamed_blocks_with_a_lora_on_some_blocks_match_core(env, tiny):
    """ComfyUI's lowvram loading applies a LoRA on the fly (``weight_function`` per layer): a LoRA
    on block 0 only, every block streamed by rank ``cuda:1`` through a ring of two buffers (block 2
    refills block 0's buffer), in `sequence` mode on two CPU ranks that ``RecordingOps`` calls
    ``cuda:0`` and ``cuda:1``: the forward equals core's unsharded one.

    ComfyUI 0.29's loader writes ``weight_function = []`` on every module it loads, which hides a
    ring that only ever copies the attribute; a module no patcher loaded has only the class default
    (no instance attribute): blocks 1-3 are put in that state (core computes the same with it).
    Before the fix (issue 30) block 0's patch stayed on block 2's buffer: this test failed with a max
    diff of 0.45 against ``COMFY_SPLIT_BOUND`` (1e-4)."""
    import comfy.sd
    from harness.sampling import cond as make_cond

    from sharddit.loaders.comfy.models.specs import find_arch_spec, get_arch_spec
    from sharddit.parallel.blocks.sharding import attach_block_sharding
    from sharddit.parallel.sequence.engine import attach_sequence_engine
    from sharddit.parallel.sequence.record import RecordingOps
    from sharddit.parallel.sequence.stream import BlockStream

    sd = tiny.wan21_t2v_state_dict()
    patched, _ = comfy.sd.load_lora_for_models(_load(sd), None, tiny.wan_lora_state_dict(sd, blocks=(0,)), 1.0, 0)
    patched.patch_model(device_to=torch.device("cpu"), lowvram_model_memory=1)  # lowvram: patches on the fly
    dit = patched.model.diffusion_model
    for block in dit.blocks[1:]:  # as modules no patcher loaded: class defaults, no instance attributes
        for m in block.modules():
            m.__dict__.pop("weight_function", None)
            m.__dict__.pop("bias_function", None)
    assert dit.blocks[0].ffn[0].weight_function and not dit.blocks[2].ffn[0].weight_function
    g = torch.Generator().manual_seed(3)
    x, t, context = torch.randn(WAN_EVEN, generator=g), torch.tensor([500.0]), make_cond(tokens=512)[0][0]
    with torch.no_grad():
        ref = dit(x, t, context)
        plain = _load(sd).model.diffusion_model(x, t, context)
    assert (ref - plain).abs().max() > 1e-2, "the LoRA must change the output, or this test proves nothing"
    layout = get_arch_spec(dit)
    rec = RecordingOps()
    for block in dit.blocks:
        rec.put(block, "cuda:0")
    handle = attach_block_sharding(dit, layout, ["cpu"] * len(dit.blocks), "cpu")
    specs, _ = find_arch_spec(type(dit).__name__).sequence_specs(dit)
    engine = attach_sequence_engine(handle.router, [p for pl in handle.proxies.values() for p in pl], specs,
                                    ["cpu", "cpu"], timeout_s=60)
    engine.streams = [BlockStream("cpu", ops=rec, place=p) for p in ("cuda:0", "cuda:1")]
    streams = engine.streams
    try:
        with torch.no_grad(), handle.router.forward_scope(sequence=True):
            got = dit(x, t, context)
        assert streams[1].copies == len(dit.blocks) and streams[0].copies == 0
    finally:
        engine.close()
        handle.detach()
        patched.unpatch_model()
    assert rec.violations() == []
    assert_split_close(got, ref, COMFY_SPLIT_BOUND, "LoRA on block 0, every block streamed on rank 1")
