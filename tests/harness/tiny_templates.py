"""Tiny random-weight files for core's 2026 video templates, under the templates' own file names.

The templates load their models by file name (``properties.models`` of each loader); the tests
write tiny models of the same ComfyUI classes under those names (tests/test_templates_comfy.py):

- HunyuanVideo 1.5 720p t2v: the DiT (``HunyuanVideo`` detected as ``HunyuanVideo15``: 32 latent
  channels, cond-type embedding, vision projection, byT5 mapper), Qwen2.5-VL + byT5 text encoders
  (``harness.tiny_encoders``). Its VAE only decodes after the compared latent: never loaded.
- Kandinsky 5 t2v: the DiT (``Kandinsky5``: 2 text + 2 visual blocks), Qwen2.5-VL + CLIP-L
  (``harness.tiny_encoders``) and the HunyuanVideo VAE it names (``harness.tiny_vaes``), which
  ``Kandinsky5ImageToVideo`` takes (and uses only with a start image).
- LTX-2.3 t2v: one checkpoint with the DiT (``LTXAVModel``), the text projection that
  ``LTXAVTextEncoderLoader`` reads beside Gemma 3, the video VAE and the audio VAE + vocoder, each
  under core's prefix (``comfy/supported_models.py`` LTXV/LTXAV: ``model.diffusion_model.``,
  ``vae.``; ``comfy_extras/nodes_lt_audio.py``: ``audio_vae.``, ``vocoder.``) and the configs in
  the safetensors metadata ``config`` as the published checkpoints carry them; the x2 latent
  upscaler (``LatentUpsampler``, config in its metadata) and the distilled LoRA on the DiT.

Every tensor comes from ``parallel/random_weights.py`` (seeded by key name): same bits anywhere.
"""
from __future__ import annotations

import functools
import json
import zlib
from pathlib import Path

import torch

from .pack import import_pack

import_pack()
from sharddit.loaders.comfy.models.model_params import fit_params
from sharddit.parallel.random_weights import random_generator, random_state_dict

SEED = 0
DIT = "model.diffusion_model."

# HunyuanVideo 1.5 as comfy/model_detection.py reads it: 32 latent channels + 32 image + 1 mask
# in, heads = hidden // 128, double blocks only, vision width 1152 (HunyuanVideo15's unet_config).
HV15_CONFIG = {"image_model": "hunyuan_video", "in_channels": 65, "out_channels": 32, "vec_in_dim": None,
               "hidden_size": 256, "mlp_ratio": 4.0, "num_heads": 2, "depth": 2, "depth_single_blocks": 0,
               "axes_dim": [16, 56, 56], "theta": 256, "patch_size": [1, 2, 2], "qkv_bias": True,
               "guidance_embed": False, "byt5": True, "meanflow": False, "use_cond_type_embedding": True,
               "vision_in_dim": 1152, "meanflow_sum": True}
# Kandinsky 5 Lite video as detected: model_dim 64 keeps the detector's default rope axes
# (16, 24, 24) -> one 64-wide head; text widths stay core's fixed 3584 (Qwen2.5-VL) and 768
# (CLIP-L pooled); visual_embed_dim 132 = (16 latent + 16 image + 1 mask) x 1 x 2 x 2.
K5_CONFIG = {"time_dim": 32, "model_dim": 64, "ff_dim": 128, "num_text_blocks": 2, "num_visual_blocks": 2}
# The x2 spatial latent upscaler of LTX-2 (comfy/ldm/lightricks/latent_upsampler.py); GroupNorm
# takes 32 groups, so 32 channels is the least width.
UPSAMPLER_CONFIG = {"_class_name": "LatentUpsampler", "in_channels": 128, "mid_channels": 32, "num_blocks_per_stage": 1,
                    "dims": 3, "spatial_upsample": True, "temporal_upsample": False, "spatial_scale": 2.0,
                    "rational_resampler": False}
LORA_RANK = 4


def _ops():
    import comfy.ops

    return comfy.ops.disable_weight_init


def hv15_dit_state_dict(context_dim: int, seed: int = SEED) -> dict:
    """HunyuanVideo 1.5 DiT whose text input is ``context_dim`` wide (the tiny Qwen2.5-VL's hidden size)."""
    from comfy.ldm.hunyuan_video.model import HunyuanVideo

    cfg = fit_params(HunyuanVideo, {**HV15_CONFIG, "context_in_dim": context_dim})
    return random_state_dict(HunyuanVideo(**cfg, device="meta", operations=_ops()), seed)


def k5_dit_state_dict(seed: int = SEED) -> dict:
    from comfy.ldm.kandinsky5.model import Kandinsky5

    return random_state_dict(Kandinsky5(**K5_CONFIG, device="meta", operations=_ops()), seed)


def upsampler_file(seed: int = SEED) -> tuple:
    """``(state dict, metadata)`` of the tiny x2 latent upscaler."""
    from comfy.ldm.lightricks.latent_upsampler import LatentUpsampler

    model = LatentUpsampler.from_config(UPSAMPLER_CONFIG, operations=_ops())
    return random_state_dict(model, seed), {"config": json.dumps(UPSAMPLER_CONFIG)}


def ltxav_dit(config: dict):
    """``LTXAVModel`` of ``config`` on meta (``config`` is the checkpoint's ``transformer`` section)."""
    from comfy.ldm.lightricks.av_model import LTXAVModel

    return LTXAVModel(**config, device="meta", dtype=torch.float32, operations=_ops())


def lora_state_dict(dit_sd: dict, targets: list, seed: int = SEED, rank: int = LORA_RANK) -> dict:
    """A LoRA over the DiT weights ``targets`` (names without ``.weight``), in the
    ``diffusion_model.<name>.lora_up/lora_down/alpha`` form core's LoRA loader maps onto them;
    ``lora_up`` non-zero so the patch changes the output."""
    out = {}
    for name in targets:
        w = dit_sd[f"{name}.weight"]
        key = f"diffusion_model.{name}"
        g = random_generator(seed, key)
        out[f"{key}.lora_down.weight"] = torch.randn(rank, w.shape[1], generator=g) / w.shape[1] ** 0.5
        out[f"{key}.lora_up.weight"] = torch.randn(w.shape[0], rank, generator=g) * 0.1
        out[f"{key}.alpha"] = torch.tensor(float(rank))
    return out


def prefixed(sd: dict, prefix: str) -> dict:
    return {prefix + k: v for k, v in sd.items()}


def save(path: Path, sd: dict, metadata: dict | None = None) -> Path:
    from .tiny_models import save_file

    save_file({k: v.contiguous() for k, v in sd.items()}, path, metadata)
    return path


def ltx23_transformer_config(video_context: int, audio_context: int) -> dict:
    """The checkpoint's ``transformer`` metadata for a tiny LTX-2.3 ``LTXAVModel`` whose text input
    is the text projection's ``video_context + audio_context`` features (LTX-2.3's dual linear
    projection; ``preprocess_text_embeds`` splits them): the connectors and cross-attention keep
    those widths, the streams are 4 x 16 (video) and 2 x 16 (audio) wide, 2 dual-stream blocks;
    LTX-2.3's gated attention and cross-attention AdaLN are on."""
    return {"in_channels": 128, "audio_in_channels": 128, "num_attention_heads": 4, "attention_head_dim": 16,
            "audio_num_attention_heads": 2, "audio_attention_head_dim": 16, "cross_attention_dim": video_context,
            "audio_cross_attention_dim": audio_context, "caption_channels": video_context, "num_layers": 2,
            "connector_attention_head_dim": video_context // 4, "connector_num_attention_heads": 4,
            "audio_connector_attention_head_dim": audio_context // 2, "audio_connector_num_attention_heads": 2,
            "connector_num_layers": 1, "caption_proj_before_connector": True, "caption_projection_first_linear": False,
            "cross_attention_adaln": True, "apply_gated_attention": True}


# The distilled LoRA patches every attention projection and feed-forward of both blocks, in both streams.
LTX23_LORA_TARGETS = [f"transformer_blocks.{b}.{m}" for b in (0, 1) for m in (
    "attn1.to_q", "attn1.to_k", "attn1.to_v", "attn1.to_out.0", "attn2.to_q", "attn2.to_out.0",
    "audio_attn1.to_q", "audio_attn1.to_out.0", "audio_to_video_attn.to_q", "video_to_audio_attn.to_out.0",
    "ff.net.0.proj", "ff.net.2", "audio_ff.net.0.proj", "audio_ff.net.2")]


def ltx23_checkpoint(text_projection: dict, vae_parts: tuple, seed: int = SEED) -> tuple:
    """``(state dict, metadata, DiT state dict)`` of the single LTX-2.3 file: DiT under
    ``model.diffusion_model.``, ``text_projection`` (``text_embedding_projection.*``, read by
    ``LTXAVTextEncoderLoader``) as is, the VAE parts with their prefixes; ``vae_parts`` is
    ``(state dict, metadata config dict)`` of the video VAE (``vae.*``) and audio VAE + vocoder
    (``audio_vae.*``, ``vocoder.*``)."""
    video = text_projection["text_embedding_projection.video_aggregate_embed.weight"].shape[0]
    audio = text_projection["text_embedding_projection.audio_aggregate_embed.weight"].shape[0]
    config = ltx23_transformer_config(video, audio)
    dit_sd = random_state_dict(ltxav_dit(config), seed)
    vae_sd, vae_config = vae_parts
    sd = {**prefixed(dit_sd, DIT), **text_projection, **vae_sd}
    return sd, {"config": json.dumps({"transformer": config, **vae_config})}, dit_sd


# The file names the templates load (``properties.models``), per folder.
QWEN = "qwen_2.5_vl_7b_fp8_scaled.safetensors"   # HunyuanVideo 1.5's and Kandinsky 5's, one file
HV15_DIT = "hunyuanvideo1.5_720p_t2v_fp16.safetensors"
BYT5 = "byt5_small_glyphxl_fp16.safetensors"
K5_DIT = "kandinsky5lite_t2v_sft_5s.safetensors"
CLIP_L = "clip_l.safetensors"
K5_VAE = "hunyuan_video_vae_bf16.safetensors"
LTX23 = "ltx-2.3-22b-dev-fp8.safetensors"
GEMMA = "gemma_3_12B_it_fp4_mixed.safetensors"
LTX23_UPSCALER = "ltx-2.3-spatial-upscaler-x2-1.1.safetensors"
LTX23_LORA = "ltx_2.3_22b_distilled_1.1_lora_dynamic_fro09_avg_rank_111_bf16.safetensors"


def _cache_dir() -> Path | None:
    """Built files are kept between sessions as ``harness.tiny_models`` keeps its own (same
    ``SHARDDIT_TINY_MODELS_CACHE`` rule), in a folder per hash of the builders and ComfyUI version."""
    import comfyui_version

    from .tiny_models import default_cache_dir

    base = default_cache_dir()
    if base is None:
        return None
    here = Path(__file__).parent
    digest = zlib.crc32(b"".join((here / f).read_bytes() for f in
                                 ("tiny_templates.py", "tiny_encoders.py", "tiny_vaes.py", "tiny_te_hook.py")))
    return base.parent / f"templates-{comfyui_version.__version__}-{digest:08x}"


@functools.lru_cache(maxsize=1)
def _ltx23_files(seed: int) -> dict:
    """The LTX-2.3 template's checkpoint, upscaler and LoRA (the LoRA is over this DiT's weights)."""
    from . import tiny_encoders as enc
    from . import tiny_vaes

    ckpt, metadata, dit_sd = ltx23_checkpoint(enc.ltxav_text_projection_state_dict(seed),
                                              tiny_vaes.ltx23_checkpoint_parts(seed), seed)
    return {("checkpoints", LTX23): (ckpt, metadata),
            ("latent_upscale_models", LTX23_UPSCALER): upsampler_file(seed),
            ("loras", LTX23_LORA): (lora_state_dict(dit_sd, LTX23_LORA_TARGETS, seed), None)}


def _builders(seed: int) -> dict:
    """``{(folder, template's file name): () -> (state dict, metadata)}``."""
    from . import tiny_encoders as enc
    from . import tiny_vaes

    return {("text_encoders", QWEN): lambda: (enc.qwen25_7b_state_dict(seed), None),
            ("text_encoders", BYT5): lambda: (enc.byt5_small_glyph_state_dict(seed), None),
            ("text_encoders", CLIP_L): lambda: (enc.clip_l_state_dict(seed), None),
            ("text_encoders", GEMMA): lambda: (enc.gemma3_12b_state_dict(seed), None),
            ("diffusion_models", HV15_DIT): lambda: (hv15_dit_state_dict(enc.QWEN25_7B_CONFIG["hidden_size"], seed), None),
            ("diffusion_models", K5_DIT): lambda: (k5_dit_state_dict(seed), None),
            ("vae", K5_VAE): lambda: (tiny_vaes.hunyuan_video_vae_state_dict(seed), None),
            **{key: (lambda key=key: _ltx23_files(seed)[key])
               for key in [("checkpoints", LTX23), ("latent_upscale_models", LTX23_UPSCALER), ("loras", LTX23_LORA)]}}


def write_template_models(root: Path, seed: int = SEED) -> dict:
    """Write every file the HunyuanVideo 1.5, Kandinsky 5 and LTX-2.3 templates load into
    ``root/<folder>/<template's name>`` (built once into the cache, then linked), put those
    folders first in ComfyUI's search paths and return ``{(folder, name): path}``. Names the
    templates only validate (HunyuanVideo 1.5's VAE and super-resolution models, the prompt
    enhancer's LoRA) are not written here."""
    import folder_paths

    root, cache = Path(root), _cache_dir()
    written = {}
    for (folder, name), build in _builders(seed).items():
        path = root / folder / name
        built = cache / f"seed{seed}" / folder / name if cache else path
        if not built.exists():
            save(built, *build())
        if built != path:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.symlink_to(built)
        written[(folder, name)] = path
    for folder in {f for f, _ in written}:
        folder_paths.add_model_folder_path(folder, str(root / folder), is_default=True)
    getattr(folder_paths, "filename_list_cache", {}).clear()
    return written
