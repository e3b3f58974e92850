"""Tiled VAE decode over batched tiles and several devices, with ComfyUI's VAE object.

The geometry and the runner are pure (``parallel/tiling``); this module adapts ComfyUI:

- tile parameters: core ``VAEDecodeTiled``'s defaults and unit conversions (``core_tile_params``),
  so the same widget values tile the same way;
- decoders: the VAE's own ``first_stage_model`` on its device, plus one replica per extra device
  entry. A replica is a ``comfy.sd.VAE`` whose ``first_stage_model`` is a private copy (Wan 2.2
  keeps its causal cache on the module, so replicas never share one) with its own
  ``ModelPatcher(load_device=device)``; ``comfy.model_management.load_models_gpu`` loads them, so
  ComfyUI accounts for their memory per device. Replicas are cached per VAE object (weakly);
- ``tile_batch_size="auto"``: ComfyUI's own ``vae.memory_used_decode`` for ONE tile, and the free
  memory per device after loading, as core's ``VAE.decode`` sizes its batches; capped so that
  every device gets work;
- one ``comfy.utils.ProgressBar`` step per tile batch, and
  ``throw_exception_if_processing_interrupted()`` between batches.

Latents of image VAEs (no temporal compression) and of VAEs that tile themselves go to core's
``vae.decode_tiled`` unchanged; an LTX-2 audio+video latent decodes its video part, audio VAEs are
refused (``latent_inputs``). Each decoded tile is cast to core's output dtype (``vae_output_dtype``).
Checked against core's ``VAEDecodeTiled`` for Wan 2.1/2.2, LTX-Video, LTX-2.3, HunyuanVideo 1.0
(Kandinsky 5's VAE) and 1.5 (tests/test_vae_decode_comfy.py).
"""
from __future__ import annotations

import copy
import itertools
import logging
import math
import weakref

import torch

import comfy.model_management as mm
import comfy.model_patcher
import comfy.utils

from ....parallel.tiling.replicas import check_decode_device_count, select_decoder_devices
from ....parallel.placement.devices import DevicePlan, check_devices_exist, parse_device_plan
from ....parallel.placement.inventory import read_inventory
from ..core.component_placement import current_inventory
from .latent_inputs import check_latent_channels, delegate_to_core, output_dtype, video_latent
from ....parallel.tiling import TilePlan, TileSpec, plan_decode, run_tiled
from ....parallel.errors import InputError

log = logging.getLogger("sharddit")

BATCH_FORM = "'auto' or a positive integer such as '4'"
_REPLICAS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def core_tile_params(vae, tile_size: int, overlap: int, temporal_size: int, temporal_overlap: int):
    """Core ``VAEDecodeTiled.decode`` + ``VAE.decode_tiled`` conversions -> latent ``(tile, overlap)``.

    Pixel/frame values become latent units; like core, an ``overlap`` above ``tile_size / 4`` is
    cut to ``tile_size // 4`` and a ``temporal_overlap`` above ``temporal_size / 2`` is halved.
    Returns 3-D tuples ``(t, h, w)`` for video VAEs, 2-D ``(h, w)`` for image VAEs.
    """
    if tile_size < overlap * 4:
        overlap = tile_size // 4
    if temporal_size < temporal_overlap * 2:
        temporal_overlap = temporal_overlap // 2
    comp = vae.spacial_compression_decode()
    tile_s, overlap_s = tile_size // comp, overlap // comp
    temporal = vae.temporal_compression_decode()
    if temporal is None:
        return (tile_s, tile_s), (overlap_s, overlap_s)
    tile_t = max(2, temporal_size // temporal)
    overlap_t = max(1, min(tile_t // 2, temporal_overlap // temporal))
    return (tile_t, tile_s, tile_s), (overlap_t, overlap_s, overlap_s)


def parse_tile_batch_size(value) -> int | None:
    """``"auto"`` -> None, ``"4"``/``4`` -> 4; ValueError naming the value otherwise."""
    text = str(value).strip().lower()
    if text == "auto":
        return None
    try:
        size = int(text)
    except ValueError:
        size = 0
    if size < 1:
        raise InputError(f"tile_batch_size {value!r} is not valid; use {BATCH_FORM} (tiles per decoder call)")
    return size


def check_decode_devices(devices: str) -> None:
    """``validate_inputs`` checks of a VAE ``devices`` input: syntax, length, devices exist."""
    parsed = parse_device_plan(devices, workers=False)
    if not parsed.auto:
        check_decode_device_count(len(parsed.entries))
        inventory = read_inventory()
        check_devices_exist(parsed.unique_devices, inventory.names, inventory.hidden_note)


def resolve_decode_devices(vae, parsed: DevicePlan) -> list[torch.device]:
    """Devices for the decode (the node's ``devices``, parsed once), one replica each, first = the
    VAE's own device when listed."""
    if parsed.auto:
        return _auto_devices(vae)
    check_decode_device_count(len(parsed.entries))
    if parsed.weighted:
        log.warning("[ShardDiT] VAE decode ignores device weights in %r: each device takes the next batch "
                    "when it is free", parsed.text)
    names = [e.device for e in parsed.entries]
    inventory = read_inventory()
    check_devices_exist(dict.fromkeys(names), inventory.names, inventory.hidden_note)
    return [torch.device(n) for n in names]


def _auto_devices(vae) -> list[torch.device]:
    """The VAE's device, plus every other GPU with room for a replica now (free VRAM, counting what
    ShardDiT itself holds there) when the VAE runs on a GPU (never CPU replicas)."""
    own = torch.device(vae.device)
    if own.type != "cuda":
        return [own]
    need = mm.module_size(vae.first_stage_model)
    others = [torch.device(g.device) for g in current_inventory().gpus
              if torch.device(g.device) != own and g.available_bytes > need]
    return [own] + others


def replicas_for(vae, devices: list[torch.device]) -> list:
    """One ``comfy.sd.VAE`` per device entry: the VAE itself for the first entry on its device."""
    own = torch.device(vae.device)
    cache = _REPLICAS.setdefault(vae, {})
    out, used_own, seen = [], False, {}
    for dev in devices:
        if dev == own and not used_own:
            out.append(vae)
            used_own = True
            continue
        nth = seen[dev] = seen.get(dev, -1) + 1  # the nth copy on this device
        key = (str(dev), nth)
        if key not in cache:
            cache[key] = make_replica(vae, dev)
        out.append(cache[key])
    return out


def bound_devices(vae, devices: list[torch.device], work: int, one_tile: int) -> list[torch.device]:
    """The entries of ``devices`` that get a decoder: at most ``work`` (decoder calls), and only
    where a new VAE copy (plus one tile's decode memory) fits in the memory free now. Logs the
    entries left out."""
    own, cached = torch.device(vae.device), _REPLICAS.get(vae, {})
    need = mm.module_size(vae.first_stage_model) + one_tile
    costs, seen, used_own = [], {}, False
    for dev in devices:
        if dev == own and not used_own:
            used_own = True
            costs.append(0)
            continue
        nth = seen[dev] = seen.get(dev, -1) + 1
        costs.append(0 if (str(dev), nth) in cached else need)
    free = {str(d): mm.get_free_memory(d) for d in set(devices)}
    kept, left_out = select_decoder_devices([str(d) for d in devices], costs, work, free)
    if left_out:
        reasons = {}
        for dev, why in left_out:
            reasons.setdefault(why, []).append(dev)
        log.warning("[ShardDiT] VAE decode: %d of %d listed devices left out: %s", len(left_out), len(devices),
                    "; ".join(f"{_counted(d)} ({why})" for why, d in reasons.items()))
    return [devices[i] for i in kept]


def _counted(devices: list[str]) -> str:
    counts = dict.fromkeys(devices, 0)
    for d in devices:
        counts[d] += 1
    return ", ".join(d if n == 1 else f"{d} x{n}" for d, n in counts.items())


def make_replica(vae, device: torch.device):
    """A ``comfy.sd.VAE`` sharing everything but the module; weights copied through CPU RAM."""
    rep = copy.copy(vae)
    rep.first_stage_model = _cpu_deepcopy(vae.first_stage_model)
    rep.device = device
    rep.patcher = comfy.model_patcher.ModelPatcher(rep.first_stage_model, load_device=device,
                                                   offload_device=vae.patcher.offload_device)
    log.info("[ShardDiT] VAE replica for %s (%.0f MiB)", device, mm.module_size(rep.first_stage_model) / 2**20)
    return rep


def _cpu_deepcopy(module: torch.nn.Module) -> torch.nn.Module:
    """``copy.deepcopy`` with parameters and buffers copied to CPU (no second copy on the GPU)."""
    memo = {}
    for t in itertools.chain(module.parameters(), module.buffers()):
        if id(t) not in memo:
            c = t.detach().to("cpu", copy=True)
            memo[id(t)] = torch.nn.Parameter(c, requires_grad=False) if isinstance(t, torch.nn.Parameter) else c
    return copy.deepcopy(module, memo)


def _decoder(rep):
    model, dtype, device, out_dtype = rep.first_stage_model, rep.vae_dtype, rep.device, output_dtype(rep)
    return lambda a: model.decode(a.to(dtype).to(device)).to(dtype=out_dtype)  # core's decode_fn


def _tile_memory(vae, latent_shape, tile) -> int:
    """ComfyUI's decode-memory estimate for one tile of latent size ``tile.size``."""
    return max(1, int(vae.memory_used_decode((1, latent_shape[1]) + tuple(tile.size), vae.vae_dtype)))


def probe_tiles(vae, latent_shape, spec: TileSpec, batch: int | None) -> tuple[int, int]:
    """(decoder calls at ``batch`` tiles per call, None: 1; ComfyUI's decode-memory estimate of the
    largest tile): what choosing the decoders and loading them needs, computed once per decode."""
    probe = plan_decode(latent_shape, spec, vae.output_channels, batch or 1)
    return len(probe.batches), max(_tile_memory(vae, latent_shape, t) for t in probe.tiles)


def plan_video_decode(vae, reps, latent_shape, spec: TileSpec, batch: int | None, one_tile: int) -> TilePlan:
    """Load the replicas (ComfyUI accounting: ``one_tile`` bytes per tile of a call, ``probe_tiles``)
    and cut tiles into batches (``batch`` None = auto)."""
    mm.load_models_gpu([r.patcher for r in reps], memory_required=one_tile * (batch or 1),
                       force_full_load=vae.disable_offload)
    if batch is not None:
        return plan_decode(latent_shape, spec, vae.output_channels, batch)
    devs = [torch.device(r.device) for r in reps]
    free = min(mm.get_free_memory(d) / devs.count(d) for d in devs)  # replicas sharing a device share it

    def auto(group) -> int:
        fit = max(1, int(free // _tile_memory(vae, latent_shape, group[0])))
        return max(1, min(fit, math.ceil(len(group) / len(reps))))

    return plan_decode(latent_shape, spec, vae.output_channels, auto)


@torch.inference_mode()
def decode_tiled(vae, samples: dict, tile_size: int, overlap: int, temporal_size: int, temporal_overlap: int,
                 tile_batch_size="auto", devices: str = "auto") -> torch.Tensor:
    """Node entry: IMAGE ``(frames, H, W, C)`` exactly as core ``VAEDecodeTiled`` returns it.

    Runs under ``torch.inference_mode()`` as ComfyUI's executor runs nodes, so callers outside the
    executor (``selftest``, scripts) work too: core's VAE post-processes in place
    (``process_output``: ``add_().div_().clamp_()`` since ComfyUI 0.18), which raises on an
    inference tensor outside inference mode."""
    vae.throw_exception_if_invalid()
    latent = video_latent(vae, samples["samples"])
    batch = parse_tile_batch_size(tile_batch_size)
    tile, overlap_l = core_tile_params(vae, tile_size, overlap, temporal_size, temporal_overlap)
    if delegate_to_core(vae):
        return _decode_core(vae, latent, tile, overlap_l, tile_batch_size, devices)
    if latent.ndim != 5:
        raise InputError(
            f"latent of shape {tuple(latent.shape)} is {latent.ndim}-D, but this is a video VAE "
            f"(temporal compression {vae.temporal_compression_decode()}): it needs a 5-D latent "
            f"(batch, channels, frames, height, width). Connect the video latent from the sampler."
        )
    check_latent_channels(vae, latent)
    spec = TileSpec.build(tile, overlap_l, vae.upscale_ratio, vae.upscale_index_formula)
    calls, one_tile = probe_tiles(vae, tuple(latent.shape), spec, batch)
    reps = replicas_for(vae, bound_devices(vae, resolve_decode_devices(vae, parse_device_plan(devices, workers=False)),
                                           calls, one_tile))
    plan = plan_video_decode(vae, reps, tuple(latent.shape), spec, batch, one_tile)
    reps = reps[:len(plan.batches)]
    log.info("[ShardDiT] VAE decode: %d tiles in %d decoder calls on %s", len(plan.tiles), len(plan.batches),
             ", ".join(str(r.device) for r in reps))
    pbar = comfy.utils.ProgressBar(len(plan.batches))
    out = run_tiled(latent, plan, [_decoder(r) for r in reps], [r.device for r in reps],
                    output_device=vae.output_device,
                    on_batch=lambda done, total: pbar.update_absolute(done, total),
                    check_interrupt=mm.throw_exception_if_processing_interrupted)
    images = vae.process_output(out).movedim(1, -1)
    return images.reshape(-1, images.shape[-3], images.shape[-2], images.shape[-1])


def _decode_core(vae, latent, tile, overlap, tile_batch_size, devices) -> torch.Tensor:
    """Image VAEs (core's 2-D tiled decode, three passes) and VAEs that tile themselves: core's own
    ``vae.decode_tiled`` with core's node's arguments, same result as core's node."""
    if str(tile_batch_size).strip().lower() != "auto" or str(devices).strip().lower() != "auto":
        log.warning("[ShardDiT] %s VAE: tile_batch_size/devices are ignored; decoding with core's tiler",
                    "image" if len(tile) == 2 else "self-tiling")
    tile_t, overlap_t = (None, None) if len(tile) == 2 else (tile[0], overlap[0])
    images = vae.decode_tiled(latent, tile_x=tile[-1], tile_y=tile[-2], overlap=overlap[-1], tile_t=tile_t,
                              overlap_t=overlap_t)
    if len(images.shape) == 5:
        images = images.reshape(-1, images.shape[-3], images.shape[-2], images.shape[-1])
    return images


__all__ = ["BATCH_FORM", "core_tile_params", "decode_tiled", "make_replica",
           "parse_tile_batch_size", "replicas_for", "resolve_decode_devices"]
