"""ShardDiTVAEDecodeTiled with LTX-2's audio+video latents and audio VAE (ComfyUI 0.29, CPU).

LTX-2's sampler returns one ``NestedTensor`` of (video, audio) latents; core's template splits it
with ``LTXVSeparateAVLatent``, decodes the video with ``VAEDecodeTiled`` and the audio with
``LTXVAudioVAEDecode``. Our decode given the combined latent must equal core's decode of the
separated video part (``torch.equal`` with one tile per call: core's exact operations) and leave
the audio to core; given LTX-2's audio VAE it refuses with the nodes to use. Also: with
``--fp16-intermediates`` each tile is cast to core's fp16 output dtype as core casts it.
"""
import logging

import pytest
import torch

from harness.comfy_env import comfy_version, load_comfy

pytestmark = pytest.mark.comfy
TILES = (96, 32, 16, 8)  # LTX-2: tile 3 latent px, overlap 1; 2 latent frames, overlap 1 -> 8 tiles
VIDEO, AUDIO = (1, 128, 3, 5, 4), (1, 8, 9, 16)
_CACHE = {}


@pytest.fixture(scope="module")
def env():
    env = load_comfy()
    version = comfy_version()
    if version.startswith("0.3."):
        pytest.skip(f"ComfyUI {version} has no LTX-2 audio+video latents or VAEs (added after ComfyUI 0.3.64)")
    yield env
    _CACHE.clear()


def _vae(kind):
    import comfy.sd
    import comfy.utils
    from harness import tiny_vaes

    if kind not in _CACHE:
        if kind == "video":
            sd, meta = tiny_vaes.ltx2_video_vae_state_dict(0, torch.float32), tiny_vaes.ltx2_video_vae_metadata()
        else:  # what core's LTXVAudioVAELoader does with the checkpoint's keys
            sd = comfy.utils.state_dict_prefix_replace(tiny_vaes.ltx2_audio_vae_state_dict(0),
                                                       {"audio_vae.": "autoencoder."}, filter_keys=False)
            meta = tiny_vaes.ltx2_audio_vae_metadata()
        _CACHE[kind] = comfy.sd.VAE(sd=sd, metadata=meta)
    return _CACHE[kind]


def _av_latent():
    import comfy.nested_tensor

    g = torch.Generator().manual_seed(0)
    video, audio = torch.randn(VIDEO, generator=g), torch.randn(AUDIO, generator=g)
    return {"samples": comfy.nested_tensor.NestedTensor((video, audio))}


def _ours(env, vae, samples, batch="1", devices="cpu"):
    node = env.nodes.NODE_CLASS_MAPPINGS["ShardDiTVAEDecodeTiled"]
    with torch.inference_mode():
        return node.execute(samples, vae, *TILES, tile_batch_size=batch, devices=devices).result[0]


def _core_video(env, vae, av):
    separate = env.nodes.NODE_CLASS_MAPPINGS["LTXVSeparateAVLatent"]
    with torch.inference_mode():
        video_latent = separate.execute(av).result[0]
        return env.nodes.VAEDecodeTiled().decode(vae, video_latent, *TILES)[0]


@pytest.mark.parametrize("batch,devices", [("1", "cpu"), ("1", "cpu,cpu"), ("2", "cpu,cpu")])
def test_av_latent_decodes_its_video_part_as_core(env, batch, devices, caplog):
    vae, av = _vae("video"), _av_latent()
    ref = _core_video(env, vae, av)
    with caplog.at_level(logging.INFO, logger="sharddit"):
        got = _ours(env, vae, av, batch, devices)
    assert got.shape == ref.shape == (17, 160, 128, 3)
    if batch == "1":
        assert torch.equal(got, ref), f"max diff {(got - ref).abs().max().item():.3g}"
    else:  # 2 tiles per call: other conv shapes, other rounding. Measured 3.7e-6 (MKL_CBWR=COMPATIBLE),
        # 4.0e-6 (AVX2, default), torch 2.14.1: the bound of test_vae_decode_comfy.py (fp32)
        assert (got - ref).abs().max().item() <= 1e-5
    text = caplog.text
    assert "decoding its video part (1, 128, 3, 5, 4)" in text and "(1, 8, 9, 16)" in text
    assert "LTXV Audio VAE Decode" in text


def test_audio_vae_and_unsplittable_latents_are_refused(env):
    import comfy.nested_tensor

    av = _av_latent()
    with pytest.raises(ValueError, match="decodes audio, not frames.*LTXV Audio VAE Decode"):
        _ours(env, _vae("audio"), av)
    video, audio = av["samples"].tensors
    both = {"samples": comfy.nested_tensor.NestedTensor((video, video.clone()))}
    with pytest.raises(ValueError, match=r"2 parts .* has 2 parts .* 128 channels.*LTXVSeparateAVLatent"):
        _ours(env, _vae("video"), both)
    with pytest.raises(ValueError, match="has 0 parts"):
        _ours(env, _vae("video"), {"samples": comfy.nested_tensor.NestedTensor((audio,))})


def test_tiles_cast_to_core_output_dtype(env, monkeypatch):
    from comfy.cli_args import args

    vae = _vae("video")
    video = {"samples": _av_latent()["samples"].tensors[0]}
    monkeypatch.setattr(args, "fp16_intermediates", True)  # core's flag: vae_output_dtype() -> fp16
    assert vae.vae_output_dtype() == torch.float16
    with torch.inference_mode():
        ref = env.nodes.VAEDecodeTiled().decode(vae, video, *TILES)[0]
    got = _ours(env, vae, video)
    assert torch.equal(got, ref), f"max diff {(got - ref).abs().max().item():.3g}"
