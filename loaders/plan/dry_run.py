"""Dry-run simulator: will this model fit these GPUs at this size? Answered on a CPU, no weights.

``simulate`` builds ComfyUI's own model class on ``meta`` (``presets.build_meta_model``), sizes it
with ``parallel/placement/sizing``, plans with ``parallel/placement/planner``, puts every block on its planned fake
device with the pack's own engine (``parallel/blocks/sharding.attach_block_sharding``), and runs ONE
forward under ``FakeTensorMode`` + ``no_grad`` (reference figure: tests/README.md). Attention runs as an
output-only stand-in (flash / memory-efficient semantics) while simulating (``fake_forward``).

Without ``batch``: cond+uncond in one batch of 2 when that fits, else one after the other (batch
1), which is what ComfyUI's ``calc_cond_batch`` does when memory is short.
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass, replace

import torch

from ...parallel.cost.inputs import link_bandwidth, gpu_names
from ...parallel.placement.devices import with_worker_shares
from ...parallel.placement.inventory import GiB, Inventory, inventory_from_spec, read_inventory
from ...parallel.cost.mode import check_parallel
from ...parallel.families import get_family, shape_from_spec
from ...parallel.placement.plan_types import DEFAULT_DEVICES, DEFAULT_RESERVE_VRAM_GB
from ...parallel.placement.planner import PlacementRequest
from . import presets
from .block_plan import plan_blocks, planned_devices
from .findings import DeviceReport, SimulationReport
from .fake_forward import SimContext, first_blocks_only, run_fake_forward
from .strategies import DEFAULT_CFG, check_cfg, compute_strategies
from .worker_shares import compute_worker_report
from .text_encoders import place_text_encoder

log = logging.getLogger("sharddit")

__all__ = ["simulate", "check_simulation", "run_simulation", "SimulationSetup", "SimulationReport", "DeviceReport",
           "DTYPES"]

DTYPES = ("bf16", "fp16", "fp8")
_WEIGHT_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp8": torch.float8_e4m3fn,
                  "fp32": torch.float32}


@dataclass(frozen=True)
class SimulationSetup:
    """What ``check_simulation`` checked and resolved; ``run_simulation`` runs from it."""

    spec: presets.ModelSpec
    inventory: Inventory
    request: PlacementRequest
    devices: str
    size: tuple
    dtype: str | None
    batch: int | None
    parallel: str | None
    cfg: float | None
    n_workers: int
    size_note: str | None = None
    """How the asked size was rounded to the model's token grid (None: it was on the grid)."""


def simulate(model, devices: str = DEFAULT_DEVICES, width: int = 832, height: int = 480, frames: int = 81,
             batch: int | None = None, dtype: str | None = "bf16", reserve_vram_gb: float = DEFAULT_RESERVE_VRAM_GB,
             inventory: Inventory | None = None, parallel: str | None = None, cfg: float | None = None,
             gpu: str | None = None, link_gbps=None, workers=(), dist_weights: str = "auto",
             net_gbps=None) -> SimulationReport:
    """Simulate one DiT forward on the planned devices; per-device weights, peak and verdict.

    ``model``: a preset name, a ``.safetensors`` path or a ``presets.ModelSpec``.
    ``devices``: an inventory spec (``"cuda:0=24GiB,cuda:1=24GiB"``, planned ``auto`` over it),
    ``"auto"`` (this machine's GPUs, read now) or a device list (``"cuda:0,cuda:1"``).
    ``batch``: 1, 2 (cond+uncond) or None (2 if it fits, else 1). ``dtype``: bf16, fp16 or fp8
    (1-byte weights, bf16 compute); None for a file's own dtype.
    ``parallel`` (``auto``, ``blocks``, ``sequence``): also simulate `sequence` and predict the speed
    of each strategy (``strategies``) at guidance ``cfg`` (1: batch 1; > 1: cond+uncond;
    default ``DEFAULT_CFG``) on ``gpu`` (throughput table name; default the inventory's names) over
    a ``link_gbps`` link (default PCIe 4.0 without P2P); ``report.fits`` is then the chosen one's.
    ``workers``: (name, device, free bytes or None) of worker devices (distributed `sequence`): the
    host's ``devices`` are planned with the workers' equal shares kept in RAM, and ``report.workers``
    (``worker_shares``) says what each worker must hold under ``dist_weights`` and what crosses
    the network per step at ``net_gbps`` Gbit/s; ``report.fits`` then also needs every worker to fit.
    """
    setup = check_simulation(model, devices, width, height, frames, batch, dtype, reserve_vram_gb, inventory,
                             parallel, cfg, gpu, link_gbps, len(workers))
    return run_simulation(setup, gpu, link_gbps, workers, dist_weights, net_gbps)


def check_simulation(model, devices: str = DEFAULT_DEVICES, width: int = 832, height: int = 480, frames: int = 81,
                     batch: int | None = None, dtype: str | None = "bf16",
                     reserve_vram_gb: float = DEFAULT_RESERVE_VRAM_GB, inventory: Inventory | None = None,
                     parallel: str | None = None, cfg: float | None = None, gpu: str | None = None, link_gbps=None,
                     n_workers: int = 0) -> SimulationSetup:
    """Every check ``simulate`` makes before it builds or runs anything (ValueError naming the value
    and the fix; reads a model file's header, not its weights), so that ``plan`` refuses a bad
    argument before it contacts a host (``--workers``) or simulates. Same arguments as ``simulate``;
    ``n_workers``: how many worker devices will be given to ``run_simulation``."""
    if batch not in (None, 1, 2):
        raise ValueError(f"[ShardDiT] batch {batch!r} is not valid: 1 (cond and uncond one after the other), "
                         f"2 (together, as ComfyUI does when it fits) or None/'auto' (2 if it fits, else 1)")
    if cfg is None:  # the guidance core's templates sample this family with (MiniMax H3: the prompt alone)
        cfg = _family_cfg(model)
    if parallel is not None:
        parallel, cfg = check_parallel(parallel), check_cfg(DEFAULT_CFG if cfg is None else cfg)
        if gpu:
            gpu_names(gpu)
        link_bandwidth(link_gbps)
        if batch is None and cfg <= 1:
            batch = 1
    if n_workers:
        if parallel == "blocks":
            raise ValueError("[ShardDiT] worker devices run in parallel 'sequence' only; use --parallel sequence "
                             "or auto, or list this machine's devices only")
        parallel, cfg = None, check_cfg(DEFAULT_CFG if cfg is None else cfg)
        batch = 1 if cfg <= 1 else 2  # sequence runs cond + uncond together, split over the ranks
        inventory, devices = _host_devices(devices, inventory, n_workers)
    spec = _resolve(model)
    presets.check_comfyui_has(spec)
    batch = _family_batch(spec, batch)
    (width, height), size_note = _check_size(spec, width, height, frames)
    _dtypes(dtype or spec.file_dtype or "bf16", spec)
    inventory, request = _inventory_and_request(devices, reserve_vram_gb, inventory)
    if parallel == "sequence" and len(inventory.gpus) < 2:
        raise ValueError(f"[ShardDiT] parallel 'sequence' needs two or more GPUs; devices {devices!r} has "
                         f"{len(inventory.gpus)}: list more (e.g. 'cuda:0=24GiB,cuda:1=24GiB') or use 'auto'")
    return SimulationSetup(spec, inventory, request, devices, (width, height, frames), dtype, batch, parallel, cfg,
                           n_workers, size_note)


def _family_cfg(model) -> float | None:
    """The family's ``Family.default_cfg`` for a preset or file; None (the default) when it has none
    or the model cannot be read yet (``_resolve`` then says why)."""
    try:
        return get_family(_resolve(model).family).default_cfg
    except ValueError:
        return None


def _family_batch(spec, batch: int | None) -> int | None:
    """``batch`` within what ComfyUI gives this family's DiT in one call (``Family.max_batch``)."""
    most = get_family(spec.family).max_batch
    if batch is not None and batch > most:
        if most == 1 and batch == 2:
            log.info("[ShardDiT] %s: ComfyUI runs cond and uncond one after the other (batch 1)", spec.name)
        return most
    return most if batch is None and most == 1 else batch


def run_simulation(setup: SimulationSetup, gpu: str | None = None, link_gbps=None, workers=(),
                   dist_weights: str = "auto", net_gbps=None) -> SimulationReport:
    """The simulation ``check_simulation`` checked (``workers``: as many as it was told)."""
    if len(workers) != setup.n_workers:
        raise ValueError(f"[ShardDiT] {len(workers)} worker devices given, {setup.n_workers} checked")
    started = time.monotonic()
    ctx = replace(_build_context(setup.spec, *setup.size, setup.dtype), inventory=setup.inventory,
                  request=setup.request)
    batch, parallel, cfg = setup.batch, setup.parallel, setup.cfg
    report = rejected = None
    for b in ([batch] if batch else [2, 1]):
        rejected, report = report, _simulate_batch(ctx, b, batch_given=bool(batch))
        if report.fits:
            break
    if rejected is not None:
        report.rejected = rejected.summarize_needs()
    if parallel is not None:
        report.strategies = compute_strategies(ctx, report, parallel, cfg, gpu, link_gbps)
    if workers:
        report.workers = compute_worker_report(ctx, report, workers, dist_weights, cfg, gpu, net_gbps)
    report.text_encoder = _text_encoder(ctx, report, gpu)
    report.size_note = setup.size_note
    report.seconds = time.monotonic() - started
    return report


def _text_encoder(ctx: SimContext, report: SimulationReport, gpu: str | None = None):
    """The model's text encoder, placed beside the DiT of the chosen strategy (``sequence``: every GPU
    it runs on; else the blocks plan's devices, home first) as ShardDiT's text encoder loader would."""
    st = report.strategies
    if st is not None and st.chosen == "sequence":
        devices = list(st.devices.get("sequence", []))
    elif report.plan is not None:
        devices = list(dict.fromkeys([report.plan.home_device, *report.plan.dit_devices]))
    else:
        devices = []
    activation = max((d.peak_activations for d in report.devices), default=0)
    return place_text_encoder(ctx.spec, ctx.inventory, ctx.request, ctx.block_bytes, ctx.home_bytes, activation,
                              devices, gpu)


def _host_devices(devices: str, inventory, n_workers: int) -> tuple[Inventory, str]:
    """(inventory, device list) of the host in a distributed run: its own devices (a spec's GPUs,
    ``auto``: this machine's) and one ``cpu`` entry per worker (``devices.with_worker_shares``)."""
    local = str(devices).strip() or "auto"
    if "=" in local:
        inventory, local = inventory_from_spec(local), "auto"
    elif inventory is None:
        inventory = read_inventory()
    if local.lower() == "auto":
        local = ",".join(g.device for g in inventory.gpus) or "cpu"
    return inventory, with_worker_shares(local, n_workers)


def _resolve(model):
    if isinstance(model, presets.ModelSpec):
        return model
    if hasattr(model, "model_config"):
        return presets.spec_from_model_config(model.model_config)
    return presets.resolve_model(str(model))


def _build_context(spec, width: int, height: int, frames: int, dtype: str | None) -> SimContext:
    """The meta DiT, its layout and sizes, and the run settings shared by every fake forward."""
    from ...parallel.placement.sizing import compute_block_bytes, compute_non_block_bytes
    from ..comfy.models.specs import get_arch_spec

    dtype = dtype or spec.file_dtype or "bf16"
    weight_dtype, compute_dtype = _dtypes(dtype, spec)
    manual_cast = None if compute_dtype == weight_dtype else compute_dtype
    dit = presets.build_meta_model(spec, weight_dtype, manual_cast).diffusion_model
    layout = get_arch_spec(dit)
    return SimContext(spec=spec, dit=dit, layout=layout, block_bytes=tuple(compute_block_bytes(dit, layout)),
                      home_bytes=compute_non_block_bytes(dit, layout), dtype=dtype, compute_dtype=compute_dtype,
                      size=(width, height, frames))


def _check_size(spec, width: int, height: int, frames: int) -> tuple:
    """``((width, height), note)``: the size ComfyUI ends up computing, and what was changed (None
    when nothing). ComfyUI's latent nodes floor the pixel size to the VAE's stride; the DiT then
    pads the latent to whole patches (Wan, HunyuanVideo 1.0: 2x2 latent cells). The size planned is
    the one with that token grid; ``note`` says so, e.g. 1280x720 -> 1280x704 for LTX-2.3."""
    g = spec.geometry
    patch = shape_from_spec(spec).patch[1]
    if width < g.spatial or height < g.spatial or frames < 1:
        raise ValueError(f"[ShardDiT] size {width}x{height}x{frames} is too small for {spec.name}: "
                         f"width and height >= {g.spatial} pixels, frames >= 1")
    cell = g.spatial * patch
    grid = tuple(-(-(v // g.spatial) // patch) * cell for v in (width, height))
    notes = []
    if g.frame_grid:  # the latent node snaps the length up (MiniMax H3): said with the size
        base, _, period, _ = g.frame_grid
        snapped = base + max(0, -(-(frames - base) // period)) * period
        if snapped != frames:
            notes.append(f"frames {frames} -> {snapped}: {spec.name}'s latent node snaps up to {period}*k+{base} frames")
    elif (frames - 1) % g.temporal:
        log.info("[ShardDiT] %s uses %d*k+1 frames; %d frames is rounded down to %d", spec.name,
                 g.temporal, frames, (frames - 1) // g.temporal * g.temporal + 1)
    if grid != (width, height):
        how = f"ComfyUI's latent node rounds down to {g.spatial}-pixel steps"
        if patch > 1:
            how += f" and {spec.name} pads the latent to whole {patch}x{patch} patches ({cell}-pixel steps in all)"
        notes.insert(0, f"size {width}x{height} -> {grid[0]}x{grid[1]}: {how}")
    return grid, "; ".join(notes) or None


def _dtypes(dtype: str, spec) -> tuple[torch.dtype, torch.dtype]:
    """(weight dtype, compute dtype). fp8: 1-byte weights, bf16 compute (ComfyUI's manual cast)."""
    if dtype not in _WEIGHT_DTYPES:
        raise ValueError(f"[ShardDiT] dtype {dtype!r} is not one of {', '.join(DTYPES)}")
    weight = _WEIGHT_DTYPES[dtype]
    if dtype == "fp8":
        return weight, torch.bfloat16
    if dtype == "fp16" and not get_family(spec.family).runs_fp16:
        log.info("[ShardDiT] %s does not run in fp16 in ComfyUI: simulating bf16 (same size)", spec.name)
        return torch.bfloat16, torch.bfloat16
    return weight, weight


def _inventory_and_request(devices: str, reserve_vram_gb: float, inventory):
    devices = str(devices).strip() or "auto"
    if "=" in devices:
        inventory = inventory_from_spec(devices)
        devices = "auto"
    elif inventory is None:
        inventory = read_inventory()
    return inventory, PlacementRequest(devices=devices, reserve_vram_gb=float(reserve_vram_gb))


def _simulate_batch(ctx: SimContext, batch: int, batch_given: bool) -> SimulationReport:
    """Probe the activation peak on one device, plan with it, then simulate the plan."""
    spec, inventory = ctx.spec, ctx.inventory
    first = inventory.gpus[0].device if inventory.gpus else "cpu"
    with first_blocks_only(ctx.dit, ctx.layout) as n_blocks:
        activation = run_fake_forward(ctx, batch, [first] * n_blocks, first)[first][1]
    plan, error, devices = _place_and_run(ctx, batch, activation)
    peak = max(d.peak_activations for d in devices)
    if plan is not None and any(d.shortfall for d in devices) and peak > activation:
        # the sharded run needs more than the probe (hops copy the hidden state): plan again with it
        plan, error, devices = _place_and_run(ctx, batch, peak)
    report = SimulationReport(
        model=spec.name, family=spec.family, dtype=ctx.dtype, size=ctx.size,
        latent_shape=spec.geometry.latent_shape(*ctx.size, batch), batch=batch,
        batch_given=batch_given, experts=spec.experts, inventory=inventory, plan=plan,
        plan_error=error, devices=devices, reserve_vram_gb=ctx.request.reserve_vram_gb,
        home_bytes=ctx.home_bytes)
    log.info("[ShardDiT] simulated %s batch %d: %s", spec.name, batch,
             "fits" if report.fits else "does not fit")
    return report


def _place_and_run(ctx: SimContext, batch: int, activation: int):
    """Plan with ``activation`` bytes of headroom per device, simulate the plan, report devices."""
    plan, error = plan_blocks(ctx, activation)
    block_devices, home = planned_devices(ctx, plan)
    measured = run_fake_forward(ctx, batch, block_devices, home)
    return plan, error, _device_reports(ctx, measured, block_devices, home)


def _device_reports(ctx, measured: dict, block_devices: list, home: str) -> list[DeviceReport]:
    reserve = int(ctx.request.reserve_vram_gb * GiB)
    names = list(dict.fromkeys([home] + block_devices))
    out = []
    for device in names:
        info = ctx.inventory.get(device) if device in ctx.inventory.names else None
        blocks = [i for i, d in enumerate(block_devices) if d == device]
        weights, peak = measured.get(device, (0, 0))
        usable = _usable(info, device, reserve)
        out.append(DeviceReport(device, info.name if info else "CPU", info.total_bytes if info else 0,
                                info.free_bytes if info else 0, usable, weights, peak,
                                blocks, device == home))
    return out


def _usable(info, device: str, reserve: int) -> int | None:
    """What the planner lets this device hold: free + held - reserve (GPU), available RAM (cpu,
    no reserve), None when the RAM size is unknown (the planner then assumes enough)."""
    if info is None or (device == "cpu" and not info.total_bytes):
        return None
    return info.available_bytes if device == "cpu" else info.available_bytes - reserve
