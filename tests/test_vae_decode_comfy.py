"""ShardDiTVAEDecodeTiled against core VAEDecodeTiled with real ComfyUI VAE classes (CPU).

Each VAE is ComfyUI's own class (Wan 2.1 ``comfy.ldm.wan.vae.WanVAE``, Wan 2.2
``comfy.ldm.wan.vae2_2.WanVAE``, LTX-Video ``VideoVAE``, HunyuanVideo's conv3d ``AutoencoderKL``
(also Kandinsky 5's VAE), and on ComfyUI 0.29 LTX-2.3's ``VideoVAE`` and HunyuanVideo 1.5's
``vae_refiner`` VAE from ``harness.tiny_vaes``)
loaded through ``comfy.sd.VAE(sd=...)`` — so detection, compression ratios, memory estimates and
``process_output`` are core's — but built at reduced width (the constructor ComfyUI calls is wrapped
while the VAE is built) with deterministic random weights (``fill_state_dict``, seed 0).
``tile_batch_size=1`` runs core's exact sequence of operations (one tile per decoder call, core's
blend): ``torch.equal`` to core, on ``cpu`` and ``cpu,cpu``. Batched tiles: max abs diff <= 1e-5 in
fp32 (a convolution over a batch of tiles may pick another kernel and round differently).
"""
import contextlib
import json

import pytest
import torch

from harness.comfy_env import comfy_version, load_comfy, pack_module

pytestmark = pytest.mark.comfy
TOL = 1e-5
WAN21 = dict(dim=96, z_dim=16, dim_mult=[1, 2, 4, 4], num_res_blocks=2, attn_scales=[],
             temperal_downsample=[False, True, True], dropout=0.0)
WAN22 = dict(WAN21, dim=160, z_dim=48)
LTXV_SMALL = {"_class_name": "CausalVideoAutoencoder", "dims": 3, "in_channels": 3, "out_channels": 3,
              "latent_channels": 128, "scaling_factor": 1.0, "norm_layer": "pixel_norm", "patch_size": 4,
              "latent_log_var": "uniform", "use_quant_conv": False, "causal_decoder": False,
              "blocks": [["res_x", 1], ["compress_all", 1], ["res_x_y", 1], ["res_x", 1], ["compress_all", 1],
                         ["res_x_y", 1], ["res_x", 1], ["compress_all", 1], ["res_x", 1]]}
HUNYUAN_DD = {"double_z": True, "z_channels": 16, "resolution": 256, "in_channels": 3, "out_ch": 3, "ch": 128,
              "ch_mult": [1, 2, 4, 4], "num_res_blocks": 2, "attn_resolutions": [], "dropout": 0.0,
              "conv3d": True, "time_compress": 4}

# (latent shape, tile_size, overlap, temporal_size, temporal_overlap); comments: latent tiles (t, h, w).
SETTINGS = {
    "wan21": [((1, 16, 4, 10, 12), 64, 32, 8, 4),    # overlap cut to 16 -> tiles t 2/1, h 8+4, w 8+6
              ((2, 16, 4, 9, 7), 96, 32, 12, 4)],    # batch 2, overlap cut to 24 -> 3: t 3+2 (ragged), h, w fit
    "wan22": [((1, 48, 3, 6, 5), 64, 0, 8, 4),       # tile 4, no overlap: h 4+2, w 4+1, t 2/1
              ((1, 48, 2, 3, 3), 512, 64, 64, 8)],   # fits one tile: core's no-mask path
    "ltxv": [((1, 128, 3, 5, 3), 96, 64, 16, 8)],    # tile 3, overlap 0: h 3+2, t 2/1
    "hunyuan": [((1, 16, 3, 9, 6), 64, 32, 8, 4)],   # tile 8 overlap 2: h 8+3, t 2/1
    # LTX-2.3's video VAE (x32 space, x8 time: 1 + 8(t-1) frames): tile 3, overlap 1; t 2/1 -> 2 tiles
    "ltx2": [((1, 128, 3, 5, 4), 96, 32, 16, 8)],
    # HunyuanVideo 1.5's VAE (x16 space, x4 time, 32 channels): tile 4, overlap 1; t 2/1
    "hv15": [((1, 32, 3, 6, 5), 64, 16, 8, 4)],
}
CASES = [(k, i) for k, v in SETTINGS.items() for i in range(len(v))]
_CACHE = {}


@contextlib.contextmanager
def _wrapped(owner, name, **override):
    """Make ``owner.name(...)`` build the class with ``override`` (dict values are merged)."""
    orig = getattr(owner, name)

    def build(*args, **kwargs):
        for key, value in override.items():
            kwargs[key] = {**kwargs[key], **value} if isinstance(value, dict) else value
        return orig(*args, **kwargs)

    setattr(owner, name, build)
    try:
        yield build
    finally:
        setattr(owner, name, orig)


def _vae(build, kwargs, metadata=None):
    """Build on meta through the wrapped constructor, fill weights, load with comfy.sd.VAE."""
    import comfy.sd
    from harness.tiny_models import fill_state_dict

    with torch.device("meta"):
        module = build(**kwargs)
    return comfy.sd.VAE(sd=fill_state_dict(module, seed=0), metadata=metadata)


def make_vae(kind):
    if kind in _CACHE:
        return _CACHE[kind]
    load_comfy()
    import comfy.ldm.lightricks.vae.causal_video_autoencoder as ltx
    import comfy.ldm.wan.vae
    import comfy.ldm.wan.vae2_2
    import comfy.sd

    if kind == "wan21":
        with _wrapped(comfy.ldm.wan.vae, "WanVAE", dim=8, num_res_blocks=1) as build:
            vae = _vae(build, WAN21)
    elif kind == "wan22":
        with _wrapped(comfy.ldm.wan.vae2_2, "WanVAE", dim=16, dec_dim=16, num_res_blocks=1) as build:
            vae = _vae(build, WAN22)
    elif kind == "ltxv":
        with _wrapped(ltx, "Decoder", base_channels=8), _wrapped(ltx, "Encoder", base_channels=8):
            vae = _vae(lambda **kw: ltx.VideoVAE(config=LTXV_SMALL), {},
                       metadata={"config": json.dumps({"vae": LTXV_SMALL})})
    elif kind in ("ltx2", "hv15"):  # harness.tiny_vaes: LTX-2.3's config in metadata / the tiny-VAE hook
        vae = _tiny_2026_vae(kind)
    else:
        small = {"ch": 32, "ch_mult": [1, 1, 1, 1], "num_res_blocks": 1}
        with _wrapped(comfy.sd, "AutoencoderKL", ddconfig=small) as build:
            vae = _vae(build, dict(ddconfig=HUNYUAN_DD, embed_dim=16))
    assert vae.first_stage_model is not None and vae.vae_dtype == torch.float32
    _CACHE[kind] = vae
    return vae


def _tiny_2026_vae(kind):
    """LTX-2.3's / HunyuanVideo 1.5's VAE from ``harness.tiny_vaes`` (fp32), as ComfyUI 0.29 loads them."""
    import comfy.sd
    from harness import tiny_vaes

    version = comfy_version()
    if version.startswith("0.3."):  # 0.3.64's HunyuanVideo 1.5 VAE differs; it has no LTX-2
        pytest.skip(f"ComfyUI {version}: the {kind} VAE of ComfyUI 0.29 (added after ComfyUI 0.3.64)")

    if kind == "ltx2":
        sd, meta = tiny_vaes.ltx2_video_vae_state_dict(0, torch.float32), tiny_vaes.ltx2_video_vae_metadata()
    else:
        sd, meta = tiny_vaes.hv15_vae_state_dict(0, torch.float32), None
    return comfy.sd.VAE(sd=sd, metadata=meta)


def latent(shape, seed=0):
    return {"samples": torch.randn(shape, generator=torch.Generator().manual_seed(seed))}


def core_decode(env, vae, samples, *tiles):
    with torch.inference_mode():  # as ComfyUI's executor runs nodes (core's decode works in place since 0.18)
        return env.nodes.VAEDecodeTiled().decode(vae, samples, *tiles)[0]


def ours(env, vae, samples, *tiles, batch="auto", devices="auto"):
    node = env.nodes.NODE_CLASS_MAPPINGS["ShardDiTVAEDecodeTiled"]
    with torch.inference_mode():
        return node.execute(samples, vae, *tiles, tile_batch_size=batch, devices=devices).result[0]


@pytest.fixture(scope="module")
def env():
    yield load_comfy()
    _CACHE.clear()  # free VAEs (and their cached replicas) while ComfyUI is still importable
    import gc

    gc.collect()


def _reference(env, kind, i):
    key = ("ref", kind, i)
    if key not in _CACHE:
        shape, *tiles = SETTINGS[kind][i]
        _CACHE[key] = core_decode(env, make_vae(kind), latent(shape), *tiles)
    return _CACHE[key]


@pytest.mark.parametrize("kind,i", CASES)
@pytest.mark.parametrize("batch,devices", [("auto", "auto"), ("1", "cpu"), ("1", "cpu,cpu"), ("2", "cpu,cpu"),
                                           ("auto", "cpu,cpu")])
def test_matches_core(env, kind, i, batch, devices):
    shape, *tiles = SETTINGS[kind][i]
    ref = _reference(env, kind, i)
    got = ours(env, make_vae(kind), latent(shape), *tiles, batch=batch, devices=devices)
    assert got.shape == ref.shape and got.ndim == 4
    if batch == "1":  # one tile per decoder call, blended in core's order: every conv sees core's shapes
        assert torch.equal(got, ref), f"{kind} {devices}: max diff {(got - ref).abs().max().item():.3g}"
    else:  # measured up to 8.1e-6 (LTXV), under MKL_CBWR default and COMPATIBLE alike; LTX-2.3 4.0e-6,
        # HunyuanVideo 1.5 2.9e-6 (default, AVX2; 3.7e-6 / 2.4e-6 under COMPATIBLE), torch 2.14.1
        assert (got - ref).abs().max().item() <= TOL


def test_schema_matches_core_inputs(env):
    node = env.nodes.NODE_CLASS_MAPPINGS["ShardDiTVAEDecodeTiled"]
    schema = node.define_schema()
    assert schema.display_name == "VAE Decode Tiled (ShardDiT)" and schema.category == "sharddit/vae"
    inputs = {i.id: i for i in schema.inputs}
    assert list(inputs) == ["samples", "vae", "tile_size", "overlap", "temporal_size", "temporal_overlap",
                            "tile_batch_size", "devices"]
    for name, spec in env.nodes.VAEDecodeTiled.INPUT_TYPES()["required"].items():
        opts = spec[1] if len(spec) > 1 else {}
        for key in ("default", "min", "max", "step"):
            if key in opts:
                assert getattr(inputs[name], key) == opts[key], (name, key)
    assert inputs["tile_batch_size"].default == "auto" and inputs["devices"].default == "auto"
    assert all(i.tooltip for i in schema.inputs) and all(o.tooltip for o in schema.outputs)


def test_bad_inputs_name_the_value(env):
    vae = make_vae("wan21")
    node = env.nodes.NODE_CLASS_MAPPINGS["ShardDiTVAEDecodeTiled"]
    with pytest.raises(ValueError, match="5-D"):
        ours(env, vae, {"samples": torch.zeros(1, 16, 8, 8)}, 64, 32, 8, 4)
    for bad in ("0", "-2", "many"):
        with pytest.raises(ValueError, match=f"tile_batch_size '{bad}'"):
            ours(env, vae, latent((1, 16, 1, 4, 4)), 64, 32, 8, 4, batch=bad)
    with pytest.raises(ValueError, match="gpu0"):
        ours(env, vae, latent((1, 16, 1, 4, 4)), 64, 32, 8, 4, devices="gpu0")
    assert node.validate_inputs(devices="cpu,cuda:9") != True  # noqa: E712
    assert node.validate_inputs(devices=",".join(["cpu"] * 65)) != True  # noqa: E712
    assert node.validate_inputs(devices="cpu,cpu") is True


def test_progress_per_batch_and_interrupt_leaves_vae_usable(env, monkeypatch):
    import comfy.model_management as mm
    import comfy.utils

    kind, (shape, *tiles) = "wan21", SETTINGS["wan21"][0]
    vae, samples = make_vae(kind), latent(shape)
    updates, seen = [], []
    update = comfy.utils.ProgressBar.update_absolute

    def recording(self, value, total=None, preview=None):
        updates.append((value, total))
        return update(self, value, total, preview)

    monkeypatch.setattr(comfy.utils.ProgressBar, "update_absolute", recording)  # core's own, recorded
    comfy.utils.set_progress_bar_global_hook(lambda value, total, preview, node_id=None: seen.append((value, total)))
    try:
        ours(env, vae, samples, *tiles, batch="2", devices="cpu")
    finally:
        comfy.utils.set_progress_bar_global_hook(None)
    every = [(k, 8) for k in range(1, 9)]  # 12 tiles in 4 shape groups of 3 -> 2 calls each
    assert updates == every
    # what reaches the UI: all of them (0.3.64), or core's throttled share (0.29: first, last, and
    # those >= its interval apart), in order
    assert seen[0] == every[0] and seen[-1] == every[-1] and seen == sorted(set(seen)) and set(seen) <= set(every)

    decode, calls = vae.first_stage_model.decode, []

    def interrupting(x, *a, **kw):
        calls.append(x.shape[0])
        mm.interrupt_current_processing(True)
        return decode(x, *a, **kw)

    vae.first_stage_model.decode = interrupting
    try:
        with pytest.raises(mm.InterruptProcessingException):
            ours(env, vae, samples, *tiles, batch="1", devices="cpu")
    finally:
        del vae.first_stage_model.decode
        mm.interrupt_current_processing(False)
    assert len(calls) < 12
    ref = _reference(env, kind, 0)
    assert (ours(env, vae, samples, *tiles, batch="1", devices="cpu") - ref).abs().max().item() <= TOL


def test_replicas_are_comfy_vaes_loaded_by_comfyui(env):
    import comfy.model_management as mm
    import comfy.sd

    vae_decode = pack_module(env, "loaders.comfy.vae.tiled_decode")
    vae = make_vae("wan22")
    reps = vae_decode.replicas_for(vae, [torch.device("cpu"), torch.device("cpu")])
    assert reps[0] is vae and isinstance(reps[1], comfy.sd.VAE)
    assert reps[1].first_stage_model is not vae.first_stage_model
    assert reps[1].patcher.load_device == torch.device("cpu") and reps[1].patcher.model is reps[1].first_stage_model
    assert vae_decode.replicas_for(vae, [torch.device("cpu")] * 2)[1] is reps[1]  # cached per VAE
    shape, *tiles = SETTINGS["wan22"][0]
    ours(env, vae, latent(shape), *tiles, batch="1", devices="cpu,cpu")
    assert any(lm.model is reps[1].patcher for lm in mm.current_loaded_models)


def test_replicas_bounded_by_decoder_calls(env):
    """Five entries, four decoder calls: the fifth entry gets no VAE copy and is logged as left out."""
    import logging

    vae_decode = pack_module(env, "loaders.comfy.vae.tiled_decode")
    vae = make_vae("wan21")
    shape, *tiles = SETTINGS["wan21"][0]  # 12 tiles in 4 shape groups of 3: batch 3 -> 4 calls
    records = []
    handler = logging.Handler()
    handler.emit = records.append
    logging.getLogger("sharddit").addHandler(handler)
    try:
        out = ours(env, vae, latent(shape), *tiles, batch="3", devices="cpu,cpu,cpu,cpu,cpu")
    finally:
        logging.getLogger("sharddit").removeHandler(handler)
    assert (out - _reference(env, "wan21", 0)).abs().max().item() <= TOL
    text = "\n".join(r.getMessage() for r in records)
    assert "VAE decode: 1 of 5 listed devices left out: cpu (only 4 decoder calls to make)" in text, text
    assert len(vae_decode._REPLICAS[vae]) <= 3
