"""Text encoder and VAE loaders: core's loaders, with the device chosen by ShardDiT's plan.

Placement uses ComfyUI's own per-model devices (``model_options={"load_device", "offload_device"}``
for text encoders, ``comfy.sd.VAE(device=...)``); ``comfy.model_management`` is not patched.
"""
from __future__ import annotations

import logging
import os

import comfy.model_management as mm
import comfy.sd
import comfy.utils
import folder_paths
import torch

from ....parallel.placement.plan_types import DEFAULT_RESERVE_VRAM_GB
from ..core.component_placement import (
    SHARDDIT_ATTR,
    current_inventory,
    plan_component_device,
    record_component,
)
from ..models.checks import check_model_file, read_safetensors_header
from ..models.file_kinds import (
    check_text_encoder_file,
    check_text_encoder_pair,
    check_vae_file,
)
from . import text_encoder_split as te_split
from .model_loading import check_component_device, check_file_name
from ....parallel.errors import InputError

log = logging.getLogger("sharddit")


def clip_types() -> list[str]:
    """Core CLIPLoader's ``type`` list, read from core so new model types appear automatically."""
    import nodes as comfy_nodes

    return list(comfy_nodes.CLIPLoader.INPUT_TYPES()["required"]["type"][0])


def dual_clip_types() -> list[str]:
    """Core DualCLIPLoader's ``type`` list (0.29: ``hunyuan_video_15``, ``kandinsky5``, ``ltxv`` ...),
    read from core: the 2026 video encoders are pairs that core's single CLIPLoader does not offer."""
    import nodes as comfy_nodes

    return list(comfy_nodes.DualCLIPLoader.INPUT_TYPES()["required"]["type"][0])


def default_dual_clip_type() -> str:
    """HunyuanVideo 1.5's pair where this ComfyUI has it (0.29), else the first of core's list (0.3.64)."""
    types = dual_clip_types()
    return "hunyuan_video_15" if "hunyuan_video_15" in types else types[0]


# Keys of an LTX-2 checkpoint that its text encoder loads (comfy/text_encoders/lt.py
# LTXAVTEModel.load_sd): the Gemma features' projection; the rest is the DiT, VAE and audio VAE.
LTXAV_TEXT_PREFIX = "text_embedding_projection."


def load_text_encoder(clip_name: str, clip_type: str, device: str, reserve_vram_gb: float = DEFAULT_RESERVE_VRAM_GB):
    """Core CLIPLoader's load, on the device planned for the file's size."""
    path = check_file_name("text_encoders", clip_name)
    te_split.check_text_encoder_device(device, current_inventory())
    check_model_file(path, clip_name)
    _check_type(clip_type, clip_types(), "CLIPLoader")
    check_text_encoder_file(path, clip_name, clip_type, "Load Text Encoder (ShardDiT)")
    return _load_placed([path], [clip_name], clip_type, os.path.getsize(path), device, reserve_vram_gb)


def load_dual_text_encoder(clip_name1: str, clip_name2: str, clip_type: str, device: str,
                           reserve_vram_gb: float = DEFAULT_RESERVE_VRAM_GB):
    """Core DualCLIPLoader's load; the pair is placed as one model (core builds one CLIP from both
    files), sized by the sum of the files."""
    names = [clip_name1, clip_name2]
    paths = [check_file_name("text_encoders", n) for n in names]
    te_split.check_text_encoder_device(device, current_inventory())
    for path, name in zip(paths, names):
        check_model_file(path, name)
    _check_type(clip_type, dual_clip_types(), "DualCLIPLoader")
    check_text_encoder_pair(paths, names, clip_type, "Load Dual Text Encoder (ShardDiT)")
    return _load_placed(paths, names, clip_type, sum(os.path.getsize(p) for p in paths), device, reserve_vram_gb)


def load_ltxav_text_encoder(text_encoder: str, ckpt_name: str, device: str,
                            reserve_vram_gb: float = DEFAULT_RESERVE_VRAM_GB):
    """Core LTXAVTextEncoderLoader's load (Gemma 3 12B + the LTX-2 checkpoint's text projection,
    ``CLIPType.LTXV``), sized by the Gemma file plus only the projection's bytes of the checkpoint."""
    te_path = check_file_name("text_encoders", text_encoder)
    ckpt_path = check_file_name("checkpoints", ckpt_name)
    te_split.check_text_encoder_device(device, current_inventory())
    check_model_file(te_path, text_encoder)
    check_model_file(ckpt_path, ckpt_name)
    check_text_encoder_file(te_path, text_encoder, "ltxav", "Load LTXV Audio Text Encoder (ShardDiT)")
    projection = ltxav_text_bytes(ckpt_path, ckpt_name)
    if projection == 0:
        raise InputError(f"checkpoint {ckpt_name!r} holds no {LTXAV_TEXT_PREFIX}* tensors, so it is not an "
                         f"LTX-2 checkpoint: pick the LTX-2 / LTX-2.3 checkpoint the DiT comes from (e.g. "
                         f"ltx-2.3-22b-dev-fp8.safetensors) as ckpt_name.")
    nbytes = os.path.getsize(te_path) + projection
    return _load_placed([te_path, ckpt_path], [text_encoder, ckpt_name], "ltxv", nbytes, device, reserve_vram_gb)


def ltxav_text_bytes(path: str, name: str) -> int:
    """Bytes of the checkpoint's tensors the text encoder takes, from the safetensors header (a
    22B checkpoint holds ~0.6 GB of them); the whole file where there is no header to read."""
    if not path.lower().endswith((".safetensors", ".sft")):
        return os.path.getsize(path)
    header = read_safetensors_header(path, name)
    return sum(v["data_offsets"][1] - v["data_offsets"][0] for k, v in header.items()
               if k != "__metadata__" and k.startswith(LTXAV_TEXT_PREFIX))


def _check_type(clip_type: str, types: list[str], loader: str) -> None:
    if clip_type not in types:
        raise InputError(f"text encoder type {clip_type!r} is not one of core {loader}'s types: "
                         f"{', '.join(types)}. Pick one of those (for a pair of files use the dual loader).")


def _load_placed(paths: list[str], names: list[str], clip_type: str, nbytes: int, device: str, reserve_vram_gb: float):
    """``comfy.sd.load_clip`` with the device ShardDiT's plan picks for ``nbytes``; a device list,
    or ``auto`` when no single device holds it, splits its layers (``text_encoder_split``)."""
    inventory = current_inventory()
    split = te_split.is_device_list(device)
    if split:
        te_split.check_text_encoder_device(device, inventory)
        chosen = "cpu"
    else:
        chosen = plan_component_device("text_encoder", nbytes, device, reserve_vram_gb, inventory)
        split = chosen == "cpu" and str(device).strip().lower() == "auto" and bool(inventory.gpus)
    dev = torch.device(chosen)
    options = {"load_device": dev, "offload_device": dev if dev.type == "cpu" else mm.text_encoder_offload_device()}
    clip = comfy.sd.load_clip(ckpt_paths=paths, embedding_directory=folder_paths.get_folder_paths("embeddings"),
                              clip_type=getattr(comfy.sd.CLIPType, clip_type.upper(), comfy.sd.CLIPType.STABLE_DIFFUSION),
                              model_options=options)
    setattr(clip.patcher.model, SHARDDIT_ATTR, "text_encoder")
    what = f"{' + '.join(names)} (type {clip_type}, {nbytes / 2**30:.2f} GiB in {'the files' if len(paths) > 1 else 'the file'})"
    done = te_split.split_loaded(clip, device, inventory, reserve_vram_gb) if split else None
    if done is not None:
        plan, on_cpu = done
        record_component("text_encoder", "cpu", on_cpu)
        log.info("[ShardDiT] text encoder %s split over %s: %s%s", what, ", ".join(plan.devices), plan.describe(),
                 "".join(f"; {n}" for n in plan.notes))
        return clip
    record_component("text_encoder", chosen, clip.patcher.model_size())
    log.info("[ShardDiT] text encoder %s on %s", what, chosen)
    return clip


def load_vae(vae_name: str, device: str, reserve_vram_gb: float = DEFAULT_RESERVE_VRAM_GB):
    path = check_file_name("vae", vae_name)
    check_component_device(device)
    check_model_file(path, vae_name)
    check_vae_file(path, vae_name)
    nbytes = os.path.getsize(path)
    chosen = plan_component_device("vae", nbytes, device, reserve_vram_gb, current_inventory())
    vae = comfy.sd.VAE(sd=comfy.utils.load_torch_file(path), device=torch.device(chosen))
    vae.throw_exception_if_invalid()
    setattr(vae.patcher.model, SHARDDIT_ATTR, "vae")
    record_component("vae", chosen, vae.patcher.model_size())
    return vae
