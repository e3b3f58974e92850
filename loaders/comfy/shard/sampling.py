"""Sampling glue: shard when needed, then run core's own KSampler code path unchanged."""
import nodes as comfy_nodes  # ComfyUI's nodes.py (the pack's nodes/ is never on sys.path)

from ....parallel.cost.mode import DEFAULT_PARALLEL
from ....parallel.placement.devices import parse_device_plan
from ....parallel.placement.plan_types import DEFAULT_RESERVE_VRAM_GB
from ..core.multigpu import check_home_device
from ..models.checks import check_latent
from ..remote.host_workers import auto_members
from .hooks import get_shard_state, is_current_state, is_sharded
from .pipeline import set_parallel_mode, shard_model

# On an incoming (unsharded) ModelPatcher: its sharded clone per ``devices``, so that repeated
# prompts sample the SAME clone and ComfyUI finds it loaded (nothing unloads or reloads). ComfyUI
# keeps a loader's output object between prompts; a changed upstream (new LoRA...) is a new object.
_CLONES_ATTR = "_sharddit_sampler_clones"


def ksample(model, devices, seed, steps, cfg, sampler_name, scheduler, positive, negative, latent, denoise=1.0,
            parallel: str = DEFAULT_PARALLEL):
    """Core KSampler maths (``nodes.common_ksampler``, ProgressBar per step) on a sharded model.
    An unsharded MODEL is sharded as ``ShardDiTShardModel`` does with its default reserve;
    ``parallel`` other than ``auto`` also switches the mode of a MODEL sharded upstream."""
    check_latent(model, latent)
    if not is_sharded(model):
        model = sharded_for_sampler(model, devices, parallel)
    else:
        check_home_device(model, get_shard_state(model).plan.home_device)  # e.g. Select Model Device after us
        if parallel != "auto":
            model = set_parallel_mode(model.clone(), parallel)
    return comfy_nodes.common_ksampler(model, seed, steps, cfg, sampler_name, scheduler, positive, negative,
                                       latent, denoise=denoise)[0]


def sharded_for_sampler(model, devices: str, parallel: str = DEFAULT_PARALLEL):
    """The sharded clone of an unsharded ``model`` for ``devices`` and ``parallel``, made once per
    incoming model (while its shard state is the live one for these weights) and reused by every
    later prompt."""
    clones = model.__dict__.setdefault(_CLONES_ATTR, {})
    devices = parse_device_plan(devices)  # the node's input, parsed once
    key = (devices.text.strip(), str(parallel).strip(), auto_members(devices))  # auto follows joins and leaves
    cached = clones.get(key)
    if cached is not None and is_current_state(cached):
        return cached
    clones[key] = shard_model(model, devices=devices, reserve_vram_gb=DEFAULT_RESERVE_VRAM_GB, parallel=parallel)
    return clones[key]
