"""Latent and conditioning geometry of the video DiT families, from ComfyUI's ``unet_config`` (pure).

One place for what the simulator's presets, the ``plan`` of a file and ``auto`` at sampling time
all need: which family a config is (``wan``, ``ltxv``, ``hunyuan_video``), pixels per latent cell,
frames per latent frame and the text tokens ComfyUI's encoders produce.
"""
from __future__ import annotations

from dataclasses import dataclass

__all__ = ["FAMILIES", "LTXV_CTX", "WAN_CTX", "Geometry", "family_of", "geometry_of"]

FAMILIES = {"wan2.1": "wan", "ltxv": "ltxv", "hunyuan_video": "hunyuan_video"}
"""``unet_config["image_model"]`` -> family."""
WAN_CTX = dict(context_tokens=512, context_dim=4096)
LTXV_CTX = dict(context_tokens=128, context_dim=4096)


@dataclass(frozen=True)
class Geometry:
    """Latent and conditioning shapes of a model family (what the sampler feeds the DiT)."""

    in_channels: int
    """Channels of the DiT input (latent channels, plus concatenated image channels for i2v)."""
    spatial: int
    """Pixels per latent cell along width and height."""
    temporal: int
    """Frames per latent frame after the first: latent frames = (frames - 1) // temporal + 1."""
    context_tokens: int
    """Text tokens the text encoder produces (ComfyUI pads to at least this many)."""
    context_dim: int
    """Width of each text token."""
    pooled_dim: int = 0
    """Width of the pooled text vector (HunyuanVideo's CLIP-L ``y``), 0 when none."""
    clip_tokens: int = 0
    """Image-encoder tokens (Wan 2.1 i2v ``clip_fea``), 0 when none."""

    def latent_shape(self, width: int, height: int, frames: int, batch: int) -> tuple:
        t = (frames - 1) // self.temporal + 1
        return (batch, self.in_channels, t, height // self.spatial, width // self.spatial)


def family_of(unet: dict, what: str) -> str:
    """The family of a ``unet_config``; ValueError naming ``what`` (a file, a class) otherwise."""
    image_model = unet.get("image_model")
    if image_model in FAMILIES:
        return FAMILIES[image_model]
    raise ValueError(f"[ShardDiT] {what!r} is a {image_model!r} model; the simulator knows Wan, "
                     "LTX-Video and HunyuanVideo")


def geometry_of(family: str, unet: dict) -> Geometry:
    if family == "wan":
        spatial = 16 if unet.get("out_dim") == 48 else 8  # Wan 2.2 5B's VAE
        clip = 257 if unet.get("model_type") == "i2v" else 0
        return Geometry(unet.get("in_dim", 16), spatial, 4, clip_tokens=clip, **WAN_CTX)
    if family == "ltxv":
        return Geometry(unet.get("in_channels", 128), 32, 8, **LTXV_CTX)
    pooled = 768 if unet.get("vec_in_dim") else 0
    return Geometry(unet.get("in_channels", 16), 8, 4, context_tokens=256,
                    context_dim=unet.get("context_in_dim", 4096), pooled_dim=pooled)
