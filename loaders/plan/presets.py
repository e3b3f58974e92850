"""Which model to simulate: a preset name or a ``.safetensors`` file (header only) -> ModelSpec.

A ``ModelSpec`` carries ComfyUI's own ``unet_config`` for the model, the latent geometry of its
family and the conditioning it needs, so ``context.build_meta_model`` can build ComfyUI's own class on
``meta`` (no weights, no GPU). For a file, only the JSON header is read (8-byte little-endian
length + JSON: name -> dtype, shape, offsets); the config then comes from ComfyUI's own
``comfy.model_detection.model_config_from_unet`` on a ``meta`` state dict of those shapes.

Wan 2.2 A14B is two experts of the Wan 2.1 14B shape (high noise, then low noise). In ComfyUI
they are two UNETLoader outputs used by two KSamplerAdvanced nodes one after the other; before the
second sampler runs, ``load_models_gpu`` frees what the first one loaded when memory is short. So
the peak is ONE expert's weights plus activations (``experts=2`` is reported, and keeping both
resident would need twice the weights).
"""
from __future__ import annotations

import importlib
import os
from dataclasses import dataclass, field

import torch

from ...parallel.families import Geometry, family_of, geometry_of
from ..comfy.models import checks
from ...parallel.errors import InputError

__all__ = ["ModelSpec", "PRESETS", "check_comfyui_has", "comfyui_has", "preset_names",
           "resolve_model", "resolve_spec", "spec_from_model_config"]


@dataclass(frozen=True)
class ModelSpec:
    """A model to simulate: ComfyUI config + geometry."""

    name: str
    family: str
    """The family's name in ``parallel/families.py`` (``wan``, ``ltxv``, ...): its geometry, cost
    shape and the forward's inputs (``loaders/comfy/models/comfy_families.py``)."""
    unet_config: dict
    geometry: Geometry
    experts: int = 1
    """Models of this shape loaded in turn (Wan 2.2 A14B: 2); the peak holds one."""
    file_dtype: str | None = None
    """Weight dtype stored in the file (``bf16``/``fp16``/``fp8``/``fp32``); for a preset, that of the
    published file it stands for where it is not bf16 (``ltx-2.3-fp8``), else None."""
    requires: str | None = None
    """``module:Class`` this ComfyUI must have to build the model (newer than some ComfyUI versions:
    ``check_comfyui_has`` refuses with the reason instead of building an older class's subset)."""
    state_dict: dict = field(default_factory=dict, compare=False, repr=False)
    """Meta state dict of a file (ComfyUI's config matching may look at keys)."""


_WAN = dict(image_model="wan2.1", model_type="t2v", patch_size=(1, 2, 2), freq_dim=256,
            window_size=(-1, -1), qk_norm=True, cross_attn_norm=True, eps=1e-6)
_WAN_14B = dict(_WAN, dim=5120, num_heads=40, ffn_dim=13824, num_layers=40, in_dim=16, out_dim=16)
_HUNYUAN = dict(image_model="hunyuan_video", in_channels=16, patch_size=[1, 2, 2], out_channels=16,
                vec_in_dim=768, axes_dim=[16, 56, 56], meanflow=False, context_in_dim=4096,
                hidden_size=3072, mlp_ratio=4.0, num_heads=24, depth=20, depth_single_blocks=40,
                theta=256, qkv_bias=True, byt5=False, guidance_embed=True)
# HunyuanVideo 1.5 (8.3B), the 720p t2v file core's template loads (hunyuanvideo1.5_720p_t2v_fp16.safetensors):
# 16 heads x 128 = 2048 wide, 54 double-stream blocks and no single-stream ones, patch 1x1x1, 65 input
# channels (32 latent + 32 image condition + 1 mask), 32 out, Qwen2.5-VL 7B text (3584), byT5 glyph text,
# SigLIP vision (1152), no guidance embedding: the published transformer config (diffusers
# ``HunyuanVideo15Transformer3DModel``: in_channels 65, out_channels 32, num_attention_heads 16,
# attention_head_dim 128, num_layers 54, text_embed_2_dim 1472, image_embed_dim 1152, rope_axes_dim 16/56/56)
# in the keys ComfyUI 0.29's model_detection.py (the "Hunyuan Video" branch) derives from the weights:
# hidden_size = img_in width, num_heads = hidden_size // 128, byt5 from ``byt5_in``, vision_in_dim from
# ``vision_in`` (1152, which supported_models.HunyuanVideo15 matches), use_cond_type_embedding,
# meanflow_sum set together with vision_in.
_HUNYUAN_15 = dict(_HUNYUAN, in_channels=65, patch_size=[1, 1, 1], out_channels=32, vec_in_dim=None,
                   context_in_dim=3584, hidden_size=2048, num_heads=16, depth=54, depth_single_blocks=0,
                   byt5=True, guidance_embed=False, use_cond_type_embedding=True, vision_in_dim=1152,
                   meanflow_sum=True)
# LTX-2.3 (ltx-2.3-22b-dev): ComfyUI 0.29's model_detection.py (the "Lightricks ltxv" branch) reads
# image_model "ltxav" (audio_adaln_single present), num_layers 48 (transformer_blocks), attention_head_dim
# 4096 // 32 = 128 and cross_attention_dim 4096 (attn2.to_k), then updates the config with the file's
# embedded ``config["transformer"]``. LTX-2.3's values (those of ltx-2.3-22b-dev, quoted in NVIDIA
# TensorRT-LLM's LTX-2 connector tests and Lightricks' LTX-2 ltx-core configurator): gated attention,
# cross-attention AdaLN, the caption projection before 8-layer gated connectors of 32 heads (video 128
# wide, audio 64), split rope, middle-index grid. Audio stream: LTXAVModel's defaults (32 heads x 64,
# cross 2048, 128 channels). ComfyUI's class then has 21.0B parameters; the published 22B adds the text
# projection (3840 x 49 -> 4096 + 2048, 1.16B) that ComfyUI loads with the text encoder (``dual_linear``).
_LTX_23 = dict(image_model="ltxav", num_layers=48, attention_head_dim=128, cross_attention_dim=4096,
               apply_gated_attention=True, cross_attention_adaln=True, caption_proj_before_connector=True,
               caption_projection_first_linear=False, caption_projection_second_linear=False,
               connector_num_layers=8, connector_num_attention_heads=32, connector_attention_head_dim=128,
               audio_connector_num_attention_heads=32, audio_connector_attention_head_dim=64,
               connector_apply_gated_attention=True, connector_num_learnable_registers=128,
               use_middle_indices_grid=True, rope_type="split")
# Kandinsky 5 Video (kandinskylab/kandinsky-5 configs/*.yaml ``dit_params``): Qwen2.5-VL 7B text (3584), CLIP-L
# pooled (768), 16 latent channels; ``visual_cond`` adds the image latent and a mask: (16 * 2 + 1) * 1*2*2 = 132
_KANDINSKY5 = dict(image_model="kandinsky5", visual_embed_dim=132, patch_size=(1, 2, 2), in_text_dim=3584,
                   in_text_dim2=768, in_visual_dim=16, out_visual_dim=16)

# MiniMax H3 (ComfyUI 0.33 comfy/ldm/minimax/model.py): ``MiniMaxH3Model``'s constructor defaults are the
# released configuration (5376 wide, 50 blocks, 56 heads of 128, SwiGLU 14336, Qwen3-VL text 5120 wide,
# full-width AdaLN from a 2688-wide time embedding): 33.12B parameters built on meta (the model card:
# "about 33B"). model_detection.py reads these from the weights; core's templates load an int8 file of it.
_MINIMAX_H3 = dict(image_model="minimax_h3", hidden_size=5376, num_layers=50, num_attention_heads=56,
                   attention_head_dim=128, ffn_hidden_size=14336, latents_dim=24, audio_latents_dim=32,
                   text_dim=5120, time_embed_dim=2688)

_K5, _LTXAV = "comfy.ldm.kandinsky5.model:Kandinsky5", "comfy.ldm.lightricks.av_model:LTXAVModel"
_H3 = "comfy.ldm.minimax.model:MiniMaxH3Model"


def _preset(name: str, unet: dict, experts: int = 1, dtype: str | None = None, requires: str | None = None) -> ModelSpec:
    """A preset of ``unet``'s family (``image_model``), with the family's geometry for that config;
    ``dtype``: the weight dtype of the published file (``ltx-2.3-fp8``), else None (bf16 unless told)."""
    family = family_of(unet, name)
    return ModelSpec(name, family, unet, geometry_of(family, unet), experts, dtype, requires)


def comfyui_has(requires: str | None) -> bool:
    """Whether the running ComfyUI has ``module:Class`` (None: nothing required)."""
    if requires is None:
        return True
    module, _, name = requires.partition(":")
    try:
        return hasattr(importlib.import_module(module), name)
    except ImportError:
        return False


def check_comfyui_has(spec: ModelSpec) -> None:
    """ValueError naming what this ComfyUI lacks for ``spec`` (a preset of a newer model)."""
    if not comfyui_has(spec.requires):
        raise InputError(f"{spec.name} needs ComfyUI's {spec.requires.replace(':', '.')}, which this "
                         "ComfyUI does not have (added after ComfyUI 0.3.64): update ComfyUI to plan it")


PRESETS: dict[str, ModelSpec] = {p.name: p for p in (
    _preset("wan2.1-t2v-14b", _WAN_14B),
    _preset("wan2.1-t2v-1.3b", dict(_WAN, dim=1536, num_heads=12, ffn_dim=8960, num_layers=30, in_dim=16,
                                    out_dim=16)),
    _preset("wan2.2-t2v-a14b", _WAN_14B, experts=2),
    _preset("wan2.2-ti2v-5b", dict(_WAN, dim=3072, num_heads=24, ffn_dim=14336, num_layers=30, in_dim=48,
                                   out_dim=48)),
    _preset("ltxv-13b", dict(image_model="ltxv", num_layers=48, attention_head_dim=128, cross_attention_dim=4096)),
    _preset("ltxv-2b", dict(image_model="ltxv", num_layers=28, attention_head_dim=64, cross_attention_dim=2048)),
    _preset("hunyuanvideo-13b", _HUNYUAN),
    # Wan 2.2 I2V A14B: the 14B shape with 36 input channels (16 latent + 4 mask + 16 image) and no CLIP
    # image embedding, which ComfyUI's model_detection.py reads as model_type "t2v", in_dim 36
    _preset("wan2.2-i2v-a14b", dict(_WAN_14B, in_dim=36), experts=2),
    # Kandinsky 5 Video Lite (2B): kandinskylab/kandinsky-5 configs/k5_lite_t2v_5s_distil_sd.yaml ``dit_params``,
    # also ComfyUI's Kandinsky5 constructor defaults (comfy/ldm/kandinsky5/model.py; model_detection.py:
    # model_dim 1792 = "lite video", axes 16/24/24)
    _preset("kandinsky5-lite", dict(_KANDINSKY5, model_dim=1792, ff_dim=7168, time_dim=512, num_text_blocks=2,
                                    num_visual_blocks=32, axes_dims=(16, 24, 24)), requires=_K5),
    # Kandinsky 5 Video Pro (19B): kandinskylab/kandinsky-5 configs/k5_pro_t2v_5s_sft_sd.yaml ``dit_params``
    # (model_dim 4096, ff_dim 16384, time_dim 1024, 4 text + 60 visual blocks, axes 32/48/48, visual_cond);
    # ComfyUI's model_detection.py reads model_dim 4096 as "pro video" with axes (32, 48, 48)
    _preset("kandinsky5-pro", dict(_KANDINSKY5, model_dim=4096, ff_dim=16384, time_dim=1024, num_text_blocks=4,
                                   num_visual_blocks=60, axes_dims=(32, 48, 48)), requires=_K5),
    _preset("hunyuanvideo-1.5", _HUNYUAN_15, requires="comfy.supported_models:HunyuanVideo15"),
    _preset("ltx-2.3", _LTX_23, requires=_LTXAV),
    # Lightricks/LTX-2.3-fp8 ltx-2.3-22b-dev-fp8.safetensors, the file core's video_ltx2_3_t2v.json template
    # loads with CheckpointLoaderSimple: the same DiT in 1-byte weights (ComfyUI computes in bf16)
    _preset("ltx-2.3-fp8", _LTX_23, dtype="fp8", requires=_LTXAV),
    _preset("minimax-h3", _MINIMAX_H3, requires=_H3),
    # the same DiT in 1-byte weights (fp8, or the int8 file core's video_minimax_h3_* templates load)
    _preset("minimax-h3-fp8", _MINIMAX_H3, dtype="fp8", requires=_H3),
)}

_DTYPE_NAMES = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32",
                torch.float8_e4m3fn: "fp8", torch.float8_e5m2: "fp8"}


def preset_names() -> list[str]:
    return list(PRESETS)


def resolve_spec(model) -> ModelSpec:
    """The spec of what the dry run was given: a ``ModelSpec``, a model ComfyUI loaded (its
    ``model_config``), a preset name or a ``.safetensors`` path; one ComfyUI can build (a preset of a
    model newer than this ComfyUI is refused, ``check_comfyui_has``)."""
    if isinstance(model, ModelSpec):
        check_comfyui_has(model)
        return model
    if hasattr(model, "model_config"):  # detected by this ComfyUI: nothing more to require
        return spec_from_model_config(model.model_config)
    return resolve_model(str(model))


def resolve_model(model: str) -> ModelSpec:
    """A preset name (one this ComfyUI can build), or a path to a ``.safetensors`` diffusion model
    (header read only; ComfyUI's own detection recognises it, or it is refused)."""
    if model in PRESETS:
        check_comfyui_has(PRESETS[model])
        return PRESETS[model]
    if model.endswith(".safetensors") or os.path.isfile(model):
        return spec_from_safetensors(model)
    raise InputError(
        f"model {model!r} is neither a preset ({', '.join(PRESETS)}) nor an existing "
        "'.safetensors' file: pass one of the presets or a path to a diffusion model file"
    )


def spec_from_safetensors(path: str) -> ModelSpec:
    """Detect the model with ComfyUI's own ``model_detection`` from a meta state dict."""
    import comfy.model_detection
    import comfy.utils

    if not os.path.isfile(path):
        raise InputError(f"model file {path!r} does not exist: give a path to a .safetensors file")
    header = checks.read_safetensors_header(path, path)  # empty, truncated, not safetensors: refused
    metadata = header.pop("__metadata__", None) or {}
    sd = checks.meta_state_dict(header, strict=True)
    prefix = comfy.model_detection.unet_prefix_from_state_dict(sd)
    stripped = comfy.utils.state_dict_prefix_replace(sd, {prefix: ""}, filter_keys=True)
    sd = stripped or sd
    config = comfy.model_detection.model_config_from_unet(sd, "", metadata=metadata)
    if config is None:
        raise InputError(f"ComfyUI does not recognise {path!r} as a diffusion model "
                         "(model_detection found no config): pass a DiT file or a preset")
    unet = {k: v for k, v in config.unet_config.items() if k not in ("dtype", "device", "operations")}
    family = family_of(unet, path)
    dtype = _DTYPE_NAMES.get(comfy.utils.weight_dtype(sd))
    return ModelSpec(os.path.basename(path), family, unet, geometry_of(family, unet), 1, dtype, state_dict=sd)


def spec_from_model_config(model_config) -> ModelSpec:
    """The spec of a model ComfyUI already loaded (``BaseModel.model_config``): config only."""
    unet = {k: v for k, v in model_config.unet_config.items() if k not in ("dtype", "device", "operations")}
    name = type(model_config).__name__
    family = family_of(unet, name)
    return ModelSpec(name, family, unet, geometry_of(family, unet))
