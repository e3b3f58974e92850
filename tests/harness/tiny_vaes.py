"""Tiny random-weight VAEs of 2026's video models, in the key layout ComfyUI 0.29 detects.

Each builder instantiates ComfyUI's own class on ``meta`` at a reduced width and fills it with
``fill_state_dict`` (same seed → bit-identical tensors, see ``tiny_models``). What ``comfy.sd.VAE``
makes of the keys (ComfyUI 0.29.0):

- **LTX-2 video VAE** (``comfy.ldm.lightricks.vae.causal_video_autoencoder.VideoVAE``): detected
  by ``decoder.up_blocks.0.res_blocks.0.conv1.conv.weight``; the architecture comes from the
  file's safetensors metadata ``config`` → ``"vae"`` (as in the LTX-2.3 checkpoint), so the tiny
  file is small by its own config: LTX-2.3's block layout (x32 space, x8 time, 128 latent
  channels, no timestep conditioning) at base width 8 with one layer per ``res_x``.
- **LTX-2 audio VAE + vocoder** (``comfy.ldm.lightricks.vae.audio_vae.AudioVAE``): detected by
  ``vocoder.resblocks.0.convs1.0.weight`` / ``vocoder.vocoder.…`` (LTX-2.3 has the BWE vocoder);
  built from metadata ``config`` → ``"audio_vae"`` and ``"vocoder"``; core loads it with
  ``LTXVAudioVAELoader`` (checkpoints folder), which keeps ``audio_vae.*`` (renamed
  ``autoencoder.*``) and ``vocoder.*``.
- **HunyuanVideo 1.5 VAE** (``AutoencodingEngine`` of ``comfy.ldm.hunyuan_video.vae_refiner``):
  detected by a 5-D ``decoder.conv_in.conv.weight`` with 32 input channels; core fixes
  ``block_out_channels`` 128..1024 (1.26B parameters), so the file carries a width override for
  the test hook (``harness.tiny_vae_hook``, installed by ``load_comfy()`` and the test server).
- **HunyuanVideo 1.0 VAE** (conv3d ``AutoencoderKL``, 16 latent channels) — the one Kandinsky 5's
  template loads (``hunyuan_video_vae_bf16.safetensors``): detected by
  ``decoder.conv_in.conv.weight`` (16 channels); core fixes ``ch`` 128 (246M), so the file
  carries an override for the same hook.

Single-file LTX-2.3 checkpoint (``CheckpointLoaderSimple`` + ``LTXVAudioVAELoader`` on the same
file, as in core's ``video_ltx2_3_t2v.json``): ``ltx23_checkpoint_parts()`` gives the VAE keys
with the prefixes core strips — ``vae.`` (``supported_models.LTXV.vae_key_prefix``, inherited by
``LTXAV``), ``audio_vae.`` and ``vocoder.`` (``LTXVAudioVAELoader``) — and the metadata
``config`` entries ``"vae"``, ``"audio_vae"``, ``"vocoder"`` to merge into the file's
``{"config": json.dumps({...})}`` beside the DiT's own entries (``"transformer"``).
"""
from __future__ import annotations

import copy
import json

import torch

from .tiny_models import ModelKind, _bytes_tensor, fill_state_dict
from .tiny_vae_hook import VAE_CONFIG_KEY

SEED = 0

# LTX-2.3's "vae" metadata entry (block layout of the released checkpoint) at base width 8 and
# one layer per res_x: x32 space, x8 time, 128 latent channels, no timestep conditioning.
LTX23_VAE_CONFIG = {
    "_class_name": "CausalVideoAutoencoder", "dims": 3, "in_channels": 3, "out_channels": 3, "latent_channels": 128,
    "encoder_blocks": [["res_x", {"num_layers": 1}], ["compress_space_res", {"multiplier": 2}],
                       ["res_x", {"num_layers": 1}], ["compress_time_res", {"multiplier": 2}],
                       ["res_x", {"num_layers": 1}], ["compress_all_res", {"multiplier": 2}],
                       ["res_x", {"num_layers": 1}], ["compress_all_res", {"multiplier": 1}],
                       ["res_x", {"num_layers": 1}]],
    "decoder_blocks": [["res_x", {"num_layers": 1}], ["compress_space", {"multiplier": 2}],
                       ["res_x", {"num_layers": 1}], ["compress_time", {"multiplier": 2}],
                       ["res_x", {"num_layers": 1}], ["compress_all", {"multiplier": 1}],
                       ["res_x", {"num_layers": 1}], ["compress_all", {"multiplier": 2}],
                       ["res_x", {"num_layers": 1}]],
    "scaling_factor": 1.0, "norm_layer": "pixel_norm", "patch_size": 4, "latent_log_var": "uniform",
    "use_quant_conv": False, "causal_decoder": False, "timestep_conditioning": False,
    "normalize_latent_channels": False, "encoder_base_channels": 8, "decoder_base_channels": 8,
    "spatial_padding_mode": "zeros",
}

# LTX-2.3's "audio_vae" and "vocoder" (with bandwidth extension to 48 kHz) entries, narrowed.
LTX23_AUDIO_VAE_CONFIG = {
    "model": {"params": {"ddconfig": {
        "double_z": True, "mel_bins": 64, "z_channels": 8, "resolution": 256, "downsample_time": False,
        "in_channels": 2, "out_ch": 2, "ch": 8, "ch_mult": [1, 2, 4], "num_res_blocks": 1, "attn_resolutions": [],
        "dropout": 0.0, "mid_block_add_attention": False, "norm_type": "pixel", "causality_axis": "height"},
        "sampling_rate": 16000}},
    "preprocessing": {"audio": {"sampling_rate": 16000, "max_wav_value": 32768.0, "duration": 5.12, "stereo": True,
                                "causal_padding": 3},
                      "stft": {"filter_length": 1024, "hop_length": 160, "win_length": 1024, "causal": True},
                      "mel": {"n_mel_channels": 64, "mel_fmin": 0, "mel_fmax": 8000}},
}
_AMP = {"resblock": "AMP1", "resblock_kernel_sizes": [3], "resblock_dilation_sizes": [[1, 3, 5]], "stereo": True,
        "use_tanh_at_final": False, "activation": "snakebeta", "use_bias_at_final": False}
LTX23_VOCODER_CONFIG = {
    "vocoder": {**_AMP, "upsample_initial_channel": 64, "upsample_rates": [5, 2, 2, 2, 2, 2],
                "upsample_kernel_sizes": [11, 4, 4, 4, 4, 4]},
    "bwe": {**_AMP, "upsample_initial_channel": 32, "upsample_rates": [6, 5, 2, 2, 2],
            "upsample_kernel_sizes": [12, 11, 4, 4, 4], "apply_final_activation": False,
            "input_sampling_rate": 16000, "output_sampling_rate": 48000, "hop_length": 80, "n_fft": 512,
            "win_size": 512, "num_mels": 64},
}

# HunyuanVideo 1.5 VAE: core's ddconfig (comfy/sd.py) with narrow blocks; the widest must stay a
# multiple of the 32 latent channels (the decoder adds the latent repeated to that width).
HV15_VAE_DDCONFIG = {"block_out_channels": [128, 256, 512, 1024, 1024], "in_channels": 3, "out_channels": 3,
                     "num_res_blocks": 2, "ffactor_spatial": 16, "ffactor_temporal": 4,
                     "downsample_match_channel": True, "upsample_match_channel": True, "z_channels": 32}
HV15_VAE_TINY = {"block_out_channels": [8, 8, 16, 32, 32], "num_res_blocks": 1}
_HV15_PARTS = ("comfy.ldm.hunyuan_video.vae_refiner.Encoder", "comfy.ldm.hunyuan_video.vae_refiner.Decoder")

# HunyuanVideo 1.0 VAE (Kandinsky 5's template): core's ddconfig with width 32 (GroupNorm's 32
# groups), one res block per level; 4 levels keep x8 space, time_compress keeps x4 time.
HUNYUAN_VAE_DDCONFIG = {"double_z": True, "z_channels": 16, "resolution": 256, "in_channels": 3, "out_ch": 3,
                        "ch": 128, "ch_mult": [1, 2, 4, 4], "num_res_blocks": 2, "attn_resolutions": [],
                        "dropout": 0.0, "conv3d": True, "time_compress": 4}
HUNYUAN_VAE_TINY = {"ch": 32, "ch_mult": [1, 1, 1, 1], "num_res_blocks": 1}


def _with_stats(sd: dict) -> dict:
    """Per-channel latent statistics as a trained VAE has them (std near 1, mean near 0)."""
    return {k: v + 1.0 if k.endswith("std-of-means") else v for k, v in sd.items()}


def ltx2_video_vae_metadata() -> dict:
    return {"config": json.dumps({"vae": LTX23_VAE_CONFIG})}


def ltx2_video_vae_state_dict(seed: int = SEED, dtype=torch.bfloat16) -> dict:
    """LTX-2.3's video VAE (``VideoVAE``) keys, unprefixed (a VAELoader file; save with
    ``ltx2_video_vae_metadata()``)."""
    from comfy.ldm.lightricks.vae.causal_video_autoencoder import VideoVAE

    with torch.device("meta"):
        module = VideoVAE(config=copy.deepcopy(LTX23_VAE_CONFIG))
    return _with_stats(fill_state_dict(module, seed, dtype))


def ltx2_audio_vae_metadata() -> dict:
    return {"config": json.dumps({"audio_vae": LTX23_AUDIO_VAE_CONFIG, "vocoder": LTX23_VOCODER_CONFIG})}


def ltx2_audio_vae_state_dict(seed: int = SEED, dtype=torch.float32) -> dict:
    """LTX-2.3's audio VAE + vocoder in checkpoint layout: ``audio_vae.*`` and ``vocoder.*`` (what
    ``LTXVAudioVAELoader`` reads; save with ``ltx2_audio_vae_metadata()``)."""
    from comfy.ldm.lightricks.vae.audio_vae import AudioVAE

    with torch.device("meta"):
        module = AudioVAE(metadata={"config": {"audio_vae": LTX23_AUDIO_VAE_CONFIG,
                                               "vocoder": LTX23_VOCODER_CONFIG}})
    sd = _with_stats(fill_state_dict(module, seed, dtype))
    return {("audio_vae." + k[len("autoencoder."):] if k.startswith("autoencoder.") else k): v
            for k, v in sd.items()}


def hv15_vae_state_dict(seed: int = SEED, dtype=torch.float16) -> dict:
    """HunyuanVideo 1.5's VAE (``vae_refiner`` Encoder/Decoder), narrow, + the hook's override."""
    from comfy.ldm.models.autoencoder import AutoencodingEngine

    dd = {**HV15_VAE_DDCONFIG, **HV15_VAE_TINY}
    with torch.device("meta"):
        module = AutoencodingEngine(
            regularizer_config={"target": "comfy.ldm.models.autoencoder.EmptyRegularizer"},
            encoder_config={"target": _HV15_PARTS[0], "params": dd}, decoder_config={"target": _HV15_PARTS[1], "params": dd})
    sd = fill_state_dict(module, seed, dtype)
    sd[VAE_CONFIG_KEY] = _bytes_tensor(json.dumps({p: HV15_VAE_TINY for p in _HV15_PARTS}).encode())
    return sd


def hunyuan_video_vae_state_dict(seed: int = SEED, dtype=torch.bfloat16) -> dict:
    """HunyuanVideo 1.0's conv3d ``AutoencoderKL`` (Kandinsky 5's VAE), narrow, + the hook's override."""
    from comfy.ldm.models.autoencoder import AutoencoderKL

    with torch.device("meta"):
        module = AutoencoderKL(ddconfig={**HUNYUAN_VAE_DDCONFIG, **HUNYUAN_VAE_TINY}, embed_dim=16)
    sd = fill_state_dict(module, seed, dtype)
    sd[VAE_CONFIG_KEY] = _bytes_tensor(json.dumps({"comfy.sd.AutoencoderKL": {"ddconfig": HUNYUAN_VAE_TINY}}).encode())
    return sd


def ltx23_checkpoint_parts(seed: int = SEED) -> tuple[dict, dict]:
    """``(state dict, config entries)`` of LTX-2.3's VAEs for a single CheckpointLoaderSimple file.

    Keys: ``vae.*`` (video VAE; ``LTXV.vae_key_prefix``), ``audio_vae.*`` + ``vocoder.*`` (what
    ``LTXVAudioVAELoader`` keeps). Config: ``{"vae", "audio_vae", "vocoder"}`` — merge with the
    DiT's entries and save as metadata ``{"config": json.dumps(merged)}``.
    """
    sd = {"vae." + k: v for k, v in ltx2_video_vae_state_dict(seed).items()}
    sd.update(ltx2_audio_vae_state_dict(seed))
    config = {"vae": LTX23_VAE_CONFIG, "audio_vae": LTX23_AUDIO_VAE_CONFIG, "vocoder": LTX23_VOCODER_CONFIG}
    return sd, copy.deepcopy(config)


TINY_VAE_KINDS: dict[str, ModelKind] = {
    "ltx2_video_vae": ModelKind("vae", "tiny_ltx2.3_video_vae.safetensors",
                                "LTX-2.3 VideoVAE layout, base width 8, 1 layer per block (config in metadata); "
                                "VAELoader → LTX-2 video VAE (x32 space, x8 time, 128 ch)"),
    "ltx2_audio_vae": ModelKind("checkpoints", "tiny_ltx2.3_audio_vae.safetensors",
                                "LTX-2.3 AudioVAE ch 8 + BWE vocoder, narrow (config in metadata); "
                                "LTXVAudioVAELoader (checkpoints folder)"),
    "hv15_vae": ModelKind("vae", "tiny_hunyuanvideo15_vae.safetensors",
                          "HunyuanVideo 1.5 VAE, block_out_channels 8..32, 1 res block (tiny-VAE hook); "
                          "VAELoader → x16 space, x4 time, 32 ch"),
    "hunyuan_video_vae": ModelKind("vae", "tiny_hunyuan_video_vae.safetensors",
                                   "HunyuanVideo 1.0 conv3d AutoencoderKL, ch 32, 1 res block (tiny-VAE hook); "
                                   "VAELoader → x8 space, x4 time, 16 ch (Kandinsky 5's VAE)"),
}

_METADATA = {"ltx2_video_vae": ltx2_video_vae_metadata, "ltx2_audio_vae": ltx2_audio_vae_metadata}
TINY_VAE_BUILDERS = {
    "ltx2_video_vae": lambda s: ltx2_video_vae_state_dict(s),
    "ltx2_audio_vae": lambda s: ltx2_audio_vae_state_dict(s),
    "hv15_vae": lambda s: hv15_vae_state_dict(s),
    "hunyuan_video_vae": lambda s: hunyuan_video_vae_state_dict(s),
}


def tiny_vae_state_dict(kind: str, seed: int = SEED) -> tuple[dict, dict]:
    """``(state dict, safetensors metadata)`` of one of ``TINY_VAE_KINDS``, as its file holds them."""
    meta = _METADATA[kind]() if kind in _METADATA else {}
    return TINY_VAE_BUILDERS[kind](seed), meta


def write_tiny_vae(models_dir, kind: str, seed: int = SEED, name: str | None = None):
    """Write one tiny VAE file under ``models_dir/<folder>/`` and return its path."""
    from pathlib import Path

    from .tiny_models import save_file

    spec = TINY_VAE_KINDS[kind]
    path = Path(models_dir) / spec.folder / (name or spec.default_name)
    sd, meta = tiny_vae_state_dict(kind, seed)
    save_file(sd, path, {**meta, "sharddit_tiny_kind": kind, "sharddit_tiny_seed": str(seed)})
    return path


__all__ = [
    "LTX23_AUDIO_VAE_CONFIG",
    "LTX23_VAE_CONFIG",
    "LTX23_VOCODER_CONFIG",
    "TINY_VAE_KINDS",
    "hunyuan_video_vae_state_dict",
    "hv15_vae_state_dict",
    "ltx2_audio_vae_metadata",
    "ltx2_audio_vae_state_dict",
    "ltx2_video_vae_metadata",
    "ltx2_video_vae_state_dict",
    "ltx23_checkpoint_parts",
    "tiny_vae_state_dict",
    "write_tiny_vae",
]
