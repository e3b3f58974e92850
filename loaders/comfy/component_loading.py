"""Text encoder and VAE loaders: core's loaders, with the device chosen by ShardDiT's plan.

Placement uses ComfyUI's own per-model devices (``model_options={"load_device", "offload_device"}``
for text encoders, ``comfy.sd.VAE(device=...)``); ``comfy.model_management`` is not patched.
"""
from __future__ import annotations

import os

import torch

import comfy.model_management as mm
import comfy.sd
import comfy.utils
import folder_paths

from ...parallel.placement.plan_types import DEFAULT_RESERVE_VRAM_GB
from .checks import check_model_file
from .model_loading import check_component_device, check_file_name
from .placement import SHARDDIT_ATTR, current_inventory, plan_component_device, record_component

def clip_types() -> list[str]:
    """Core CLIPLoader's ``type`` list, read from core so new model types appear automatically."""
    import nodes as comfy_nodes

    return list(comfy_nodes.CLIPLoader.INPUT_TYPES()["required"]["type"][0])


def load_text_encoder(clip_name: str, clip_type: str, device: str, reserve_vram_gb: float = DEFAULT_RESERVE_VRAM_GB):
    path = check_file_name("text_encoders", clip_name)
    check_component_device(device)
    check_model_file(path, clip_name)
    types = clip_types()
    if clip_type not in types:
        raise ValueError(f"[ShardDiT] text encoder type {clip_type!r} is not one of core's types: {', '.join(types)}")
    nbytes = os.path.getsize(path)
    chosen = plan_component_device("text_encoder", nbytes, device, reserve_vram_gb, current_inventory())
    dev = torch.device(chosen)
    options = {"load_device": dev, "offload_device": dev if dev.type == "cpu" else mm.text_encoder_offload_device()}
    clip = comfy.sd.load_clip(ckpt_paths=[path], embedding_directory=folder_paths.get_folder_paths("embeddings"),
                              clip_type=getattr(comfy.sd.CLIPType, clip_type.upper(), comfy.sd.CLIPType.STABLE_DIFFUSION),
                              model_options=options)
    setattr(clip.patcher.model, SHARDDIT_ATTR, "text_encoder")
    record_component("text_encoder", chosen, clip.patcher.model_size())
    return clip


def load_vae(vae_name: str, device: str, reserve_vram_gb: float = DEFAULT_RESERVE_VRAM_GB):
    path = check_file_name("vae", vae_name)
    check_component_device(device)
    check_model_file(path, vae_name)
    nbytes = os.path.getsize(path)
    chosen = plan_component_device("vae", nbytes, device, reserve_vram_gb, current_inventory())
    vae = comfy.sd.VAE(sd=comfy.utils.load_torch_file(path), device=torch.device(chosen))
    vae.throw_exception_if_invalid()
    setattr(vae.patcher.model, SHARDDIT_ATTR, "vae")
    record_component("vae", chosen, vae.patcher.model_size())
    return vae
