"""Sampling glue: shard when needed, then run core's own KSampler code path unchanged."""
import nodes as comfy_nodes  # ComfyUI's nodes.py (the pack's nodes/ is never on sys.path)

from ...parallel.parallel_mode import DEFAULT_PARALLEL
from ...parallel.plan_types import DEFAULT_RESERVE_VRAM_GB
from .model_loading import check_devices
from .sharded_model import is_sharded, set_parallel_mode, shard_model


def validate_devices(devices: str):
    """``validate_inputs`` form of ``check_devices``: True or the message."""
    try:
        check_devices(devices)
    except ValueError as e:
        return str(e)
    return True


def ksample(model, devices, seed, steps, cfg, sampler_name, scheduler, positive, negative, latent, denoise=1.0,
            parallel: str = DEFAULT_PARALLEL):
    """Core KSampler maths (``nodes.common_ksampler``, ProgressBar per step) on a sharded model.
    An unsharded MODEL is sharded as ``ShardDiTShardModel`` does with its default reserve;
    ``parallel`` other than ``auto`` also switches the mode of a MODEL sharded upstream."""
    if not is_sharded(model):
        model = shard_model(model, devices=devices, reserve_vram_gb=DEFAULT_RESERVE_VRAM_GB, parallel=parallel)
    elif parallel != "auto":
        model = set_parallel_mode(model.clone(), parallel)
    return comfy_nodes.common_ksampler(model, seed, steps, cfg, sampler_name, scheduler, positive, negative,
                                       latent, denoise=denoise)[0]
