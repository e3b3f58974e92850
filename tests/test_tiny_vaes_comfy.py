"""The harness's tiny 2026 VAE files load through core's own loader nodes as the real classes.

``harness.tiny_vaes`` writes LTX-2.3's video and audio VAEs, HunyuanVideo 1.5's VAE and
HunyuanVideo 1.0's (Kandinsky 5's); core's ``VAELoader`` / ``LTXVAudioVAELoader`` must detect each
as that VAE (class, latent channels, compression) at the tiny size, and decode a latent to finite
pixels/audio. ComfyUI 0.29 only (the LTX-2 and HunyuanVideo 1.5 VAEs are absent from 0.3.64).
"""
import pytest
import torch

from harness.comfy_env import comfy_version, load_comfy

pytestmark = pytest.mark.comfy

# kind -> (core class, latent channels, spatial x, temporal x, latent to decode)
EXPECTED = {
    "ltx2_video_vae": ("VideoVAE", 128, 32, 8, (1, 128, 2, 2, 3)),
    "hv15_vae": ("AutoencodingEngine", 32, 16, 4, (1, 32, 2, 2, 3)),
    "hunyuan_video_vae": ("AutoencoderKL", 16, 8, 4, (1, 16, 2, 3, 2)),
}


def _require_029():
    import importlib.util

    if importlib.util.find_spec("comfy.ldm.lightricks.vae.audio_vae") is None:
        pytest.skip(f"ComfyUI {comfy_version()} has no LTX-2 audio VAE (added after ComfyUI 0.3.64)")


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    env = load_comfy()
    _require_029()
    from harness import tiny_vaes

    root = tmp_path_factory.mktemp("tiny_vaes")
    paths = {kind: tiny_vaes.write_tiny_vae(root, kind) for kind in tiny_vaes.TINY_VAE_KINDS}
    for folder in ("vae", "checkpoints"):
        env.folder_paths.add_model_folder_path(folder, str(root / folder), is_default=True)
    cache = getattr(env.folder_paths, "filename_list_cache", None)
    if isinstance(cache, dict):
        cache.clear()
    return env, paths


@pytest.mark.parametrize("kind", sorted(EXPECTED))
def test_video_vae_files_load_as_core_detects_them(files, kind):
    env, paths = files
    cls, channels, space, time, shape = EXPECTED[kind]
    vae = env.nodes.VAELoader().load_vae(paths[kind].name)[0]
    assert type(vae.first_stage_model).__name__ == cls
    assert vae.latent_channels == channels and vae.spacial_compression_decode() == space
    assert vae.temporal_compression_decode() == time
    assert sum(p.numel() for p in vae.first_stage_model.parameters()) < 3_000_000  # tiny, not core's widths
    with torch.inference_mode():
        images = vae.decode(torch.randn(shape, generator=torch.Generator().manual_seed(0)))
    frames = (shape[2] - 1) * time + 1
    assert tuple(images.shape) == (1, frames, shape[3] * space, shape[4] * space, 3)
    assert images.isfinite().all() and images.std() > 0


def test_ltx2_audio_vae_loads_with_core_loader(files):
    env, paths = files
    loader = env.nodes.NODE_CLASS_MAPPINGS["LTXVAudioVAELoader"]
    vae = loader.execute(paths["ltx2_audio_vae"].name).result[0]
    assert type(vae.first_stage_model).__name__ == "AudioVAE" and vae.latent_channels == 8
    assert vae.audio_sample_rate_output == 48000  # LTX-2.3's bandwidth-extension vocoder
    with torch.inference_mode():
        audio = vae.decode(torch.randn(1, 8, 5, 16, generator=torch.Generator().manual_seed(0)))
    assert audio.isfinite().all() and audio.shape[0] == 1


def test_ltx23_checkpoint_parts_use_core_prefixes(files):
    import comfy.supported_models
    from harness import tiny_vaes

    sd, config = tiny_vaes.ltx23_checkpoint_parts()
    assert comfy.supported_models.LTXAV.vae_key_prefix == ["vae."]
    assert set(config) == {"vae", "audio_vae", "vocoder"}
    prefixes = {k.split(".", 1)[0] for k in sd}
    assert prefixes == {"vae", "audio_vae", "vocoder"}, prefixes
    assert "vae.decoder.up_blocks.0.res_blocks.0.conv1.conv.weight" in sd
    assert "vocoder.vocoder.resblocks.0.convs1.0.weight" in sd
