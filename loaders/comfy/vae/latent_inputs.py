"""What the tiled decode takes from a LATENT and a VAE, checked before any VAE copy or tile.

- **LTX-2 audio+video latents.** LTX-2's sampler works on one ``NestedTensor`` of (video, audio)
  latents (``LTXVConcatAVLatent``); core's templates split it with ``LTXVSeparateAVLatent`` and
  decode the video with ``VAEDecodeTiled`` and the audio with ``LTXVAudioVAEDecode``. Given the
  combined latent, this decode takes its video part (the one 5-D part with the VAE's latent
  channels) and logs that the audio part is left to core's audio decode.
- **Audio VAEs** (LTX-2's audio VAE, 1-D audio VAEs) decode audio, not IMAGE frames: a clear
  error names core's audio decode nodes.
- **VAEs that tile themselves** (``vae.handles_tiling``, ComfyUI 0.29, e.g. SeedVR2) and image
  VAEs go to core's own ``vae.decode_tiled`` (``delegate_to_core``).
"""
from __future__ import annotations

import logging

import torch
from ....parallel.errors import InputError

log = logging.getLogger("sharddit")

AUDIO_FIX = ("decode audio latents with core's audio nodes (LTX-2: 'LTXV Audio VAE Decode' after "
             "'LTXVSeparateAVLatent'; others: 'VAE Decode Audio')")


def is_nested(latent) -> bool:
    """ComfyUI's ``comfy.nested_tensor.NestedTensor`` (0.29; absent in 0.3.64) without importing it."""
    return getattr(latent, "is_nested", False) is True and isinstance(getattr(latent, "tensors", None), list)


def is_audio_vae(vae) -> bool:
    """Core's audio VAEs: 1-D latents, or 2-D latents read as 1-D (``extra_1d_channel``: LTX-2's)."""
    return getattr(vae, "latent_dim", 2) == 1 or getattr(vae, "extra_1d_channel", None) is not None


def video_latent(vae, latent) -> torch.Tensor:
    """The tensor to decode from ``samples["samples"]``; ValueError naming the fix otherwise."""
    if is_audio_vae(vae):
        raise InputError(f"this VAE ({type(vae.first_stage_model).__name__}) decodes audio, not "
                         f"frames; ShardDiT's tiled decode outputs IMAGE: {AUDIO_FIX}")
    if not is_nested(latent):
        return latent
    parts = latent.tensors
    shapes = ", ".join(str(tuple(t.shape)) for t in parts)
    channels = getattr(vae, "latent_channels", None)
    video = [i for i, t in enumerate(parts) if t.ndim == 5 and t.shape[1] == channels]
    if len(video) != 1:
        raise InputError(
            f"combined latent of {len(parts)} parts ({shapes}) has {len(video)} parts that are "
            f"5-D video latents with this VAE's {channels} channels, not one; split it with "
            f"'LTXVSeparateAVLatent' and connect its video_latent"
        )
    i = video[0]
    rest = ", ".join(str(tuple(t.shape)) for j, t in enumerate(parts) if j != i)
    log.info("[ShardDiT] VAE decode: audio+video latent: decoding its video part %s; the other part (%s) is "
             "left to core (%s)", tuple(parts[i].shape), rest, AUDIO_FIX)
    return parts[i]


# latent channels -> the video families whose VAEs make them (for the message of a mismatch)
CHANNEL_FAMILIES = {12: "Mochi", 16: "Wan 2.1 / Wan 2.2 14B / HunyuanVideo / Cosmos", 32: "HunyuanVideo 1.5",
                    48: "Wan 2.2 5B", 128: "LTX-Video / LTX-2"}


def check_latent_channels(vae, latent: torch.Tensor) -> None:
    """A video latent with the VAE's latent channels; else a ValueError naming both (before any
    VAE copy or tile; core's decode would end in a conv shape error)."""
    want = getattr(vae, "latent_channels", None)
    if want is None or latent.ndim < 2 or latent.shape[1] == want:
        return
    got = latent.shape[1]
    made = CHANNEL_FAMILIES.get(got)
    hint = f" (latents of {made} have {got})" if made else ""
    raise InputError(f"the latent has {got} channels (shape {tuple(latent.shape)}), but this VAE "
                     f"({type(vae.first_stage_model).__name__}) decodes {want}-channel latents{hint}: connect the VAE "
                     f"of the model that made the latent ({CHANNEL_FAMILIES.get(want, 'this VAE')}'s VAE takes "
                     f"{want} channels)")


def delegate_to_core(vae) -> bool:
    """True where core's own ``vae.decode_tiled`` must run: image VAEs, self-tiling VAEs."""
    return vae.temporal_compression_decode() is None or bool(getattr(vae, "handles_tiling", False))


def output_dtype(vae) -> torch.dtype:
    """The dtype core casts each decoded tile to: ``vae.vae_output_dtype()`` (0.29: fp32, fp16 under
    ``--fp16-intermediates``), fp32 where ComfyUI has no such method (0.3.64 casts with ``.float()``)."""
    method = getattr(vae, "vae_output_dtype", None)
    return method() if callable(method) else torch.float32
