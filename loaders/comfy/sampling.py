"""Sampling glue: shard when needed, then run core's own KSampler code path unchanged."""
import nodes as comfy_nodes  # ComfyUI's nodes.py (the pack's nodes/ is never on sys.path)

from .checks import check_latent
from .model_loading import check_placement
from .sharded_model import is_current_state, is_sharded, shard_model

# On an incoming (unsharded) ModelPatcher: its sharded clone per ``devices``, so that repeated
# prompts sample the SAME clone and ComfyUI finds it loaded (nothing unloads or reloads). ComfyUI
# keeps a loader's output object between prompts; a changed upstream (new LoRA...) is a new object.
_CLONES_ATTR = "_sharddit_sampler_clones"


def validate_devices(devices: str, reserve_vram_gb=0.0):
    """``validate_inputs`` form of ``check_placement``: True or the message."""
    try:
        check_placement(devices, reserve_vram_gb)
    except ValueError as e:
        return str(e)
    return True


def shard(model, devices: str, reserve_vram_gb: float = 1.0):
    return shard_model(model, devices=devices, reserve_vram_gb=reserve_vram_gb)


def ksample(model, devices, seed, steps, cfg, sampler_name, scheduler, positive, negative, latent, denoise=1.0):
    """Core KSampler maths (``nodes.common_ksampler``, ProgressBar per step) on a sharded model."""
    check_latent(model, latent)
    if not is_sharded(model):
        model = sharded_for_sampler(model, devices)
    return comfy_nodes.common_ksampler(model, seed, steps, cfg, sampler_name, scheduler, positive, negative,
                                       latent, denoise=denoise)[0]


def sharded_for_sampler(model, devices: str):
    """The sharded clone of an unsharded ``model`` for ``devices``, made once per incoming model
    (while its shard state is the live one for these weights) and reused by every later prompt."""
    clones = model.__dict__.setdefault(_CLONES_ATTR, {})
    key = str(devices).strip()
    cached = clones.get(key)
    if cached is not None and is_current_state(cached):
        return cached
    clones[key] = shard_model(model, devices=devices)
    return clones[key]
