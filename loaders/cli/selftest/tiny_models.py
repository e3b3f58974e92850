"""Tiny random-weight models for ``selftest``, built from ComfyUI's own classes (nothing downloaded).

- A Wan 2.1 t2v DiT: ``comfy.ldm.wan.model.WanModel`` built on ``meta`` for its key names and
  shapes, every tensor filled from its own generator seeded by ``(seed, key name)``, then loaded
  back through ``comfy.sd.load_diffusion_model_state_dict`` (ComfyUI detects it as Wan 2.1 t2v).
- A Wan 2.1 VAE: ``comfy.sd.VAE`` always builds the full-width Wan 2.1 VAE (dim 96, 127M
  parameters; tens of seconds per decode on CPU), so for the one constructor call the VAE class is
  built at dim 8 with one residual block per stage; detection, compression ratios, memory
  estimates and ``process_output`` stay core's.

Scales keep activations finite: matrices ~ N(0, 1/fan_in), norm weights 1 + N(0, 0.02^2), biases
and the rest ~ N(0, 0.02^2). Same seed, same weights, on any machine.
"""
from __future__ import annotations

import contextlib

import torch

from ....parallel.random_weights import random_state_dict as _random_state_dict

import comfy.ldm.wan.model
import comfy.ldm.wan.vae
import comfy.ops
import comfy.sd
from ....parallel.errors import RunError

__all__ = ["SEED", "WAN_DIT", "build_wan_dit", "build_wan_vae"]

SEED = 0
# ComfyUI infers heads = dim // 128 and always builds text_dim 4096 (it is not detected).
WAN_DIT = dict(model_type="t2v", patch_size=(1, 2, 2), text_len=512, in_dim=16, dim=256, ffn_dim=512,
               freq_dim=256, text_dim=4096, out_dim=16, num_heads=2, num_layers=4, window_size=(-1, -1),
               qk_norm=True, cross_attn_norm=True, eps=1e-6)
# What ComfyUI's VAE() passes for a Wan 2.1 VAE, and what the selftest builds instead.
WAN_VAE = dict(dim=96, z_dim=16, dim_mult=[1, 2, 4, 4], num_res_blocks=2, attn_scales=[],
               temperal_downsample=[False, True, True], dropout=0.0)
WAN_VAE_SMALL = dict(dim=8, num_res_blocks=1)


def random_state_dict(module: torch.nn.Module, seed: int = SEED) -> dict:
    """Deterministic fp32 tensors for every state-dict entry of ``module`` (which may be on meta)."""
    return _random_state_dict(module, seed)


def build_wan_dit(num_layers: int = 4, seed: int = SEED):
    """A ComfyUI ModelPatcher of a tiny Wan 2.1 t2v DiT (dim 256, fp32), loaded as a file would be."""
    cfg = {**WAN_DIT, "num_layers": num_layers}
    cfg["num_heads"] = cfg["dim"] // 128
    meta = comfy.ldm.wan.model.WanModel(**cfg, device="meta", operations=comfy.ops.disable_weight_init)
    sd = random_state_dict(meta, seed)
    model = comfy.sd.load_diffusion_model_state_dict(sd, model_options={"dtype": torch.float32})
    if model is None:
        raise RunError("ComfyUI did not recognise the tiny Wan 2.1 state dict as a diffusion model")
    return model


@contextlib.contextmanager
def _small_wan_vae_class():
    """``comfy.ldm.wan.vae.WanVAE`` builds ``WAN_VAE_SMALL`` for the duration of the block."""
    original = comfy.ldm.wan.vae.WanVAE

    def build(*args, **kwargs):
        return original(*args, **{**kwargs, **WAN_VAE_SMALL})

    comfy.ldm.wan.vae.WanVAE = build
    try:
        yield build
    finally:
        comfy.ldm.wan.vae.WanVAE = original


def build_wan_vae(device: torch.device, seed: int = SEED):
    """A ``comfy.sd.VAE`` detected as Wan 2.1, at reduced width, fp32, on ``device``."""
    with _small_wan_vae_class() as build:
        with torch.device("meta"):
            meta = build(**WAN_VAE)
        vae = comfy.sd.VAE(sd=random_state_dict(meta, seed), device=device, dtype=torch.float32)
    if vae.first_stage_model is None or vae.temporal_compression_decode() != 4:
        raise RunError("ComfyUI did not build the tiny state dict as a Wan 2.1 VAE")
    return vae
