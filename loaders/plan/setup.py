"""The dry run's first stage: what was asked, checked and settled before anything is built.

``check_simulation`` resolves the model once (``presets.resolve_spec``: a preset, a ``.safetensors``
header, or a model ComfyUI loaded), takes its family and shape from the registry once, checks every
argument (InputError naming the value and the fix), settles the batch, the size on the model's token
grid and the dtypes, and reads or takes the devices once; the result, ``SimulationSetup``, is all
``dry_run.run_simulation`` needs. A bad argument is thus refused before ``plan`` contacts a cluster
(``--workers``) or builds a model.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass

import torch

from ...parallel.cost.inputs import DEFAULT_CFG, GpuTable, check_cfg, gpu_names, gpu_table, link_bandwidth
from ...parallel.cost.mode import check_parallel
from ...parallel.errors import InputError
from ...parallel.families import get_family, shape_from_spec
from ...parallel.placement.devices import DevicePlan, parse_device_plan
from ...parallel.placement.inventory import Inventory, inventory_from_spec, read_inventory
from ...parallel.placement.plan_types import DEFAULT_DEVICES, DEFAULT_RESERVE_VRAM_GB, PlacementRequest
from .presets import ModelSpec, resolve_spec

log = logging.getLogger("sharddit")

__all__ = ["DTYPES", "SimulationSetup", "check_simulation", "torch_dtypes"]

DTYPES = ("bf16", "fp16", "fp8")
_TORCH_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp8": torch.float8_e4m3fn, "fp32": torch.float32}


@dataclass(frozen=True)
class SimulationSetup:
    """What ``check_simulation`` checked and settled; ``run_simulation`` runs from it."""

    spec: ModelSpec
    family: object
    """The family's registry entry (``parallel/families.Family``), looked up once."""
    shape: object
    """The model's cost shape (``parallel/cost/inputs.ModelShape``), from the registry once."""
    inventory: Inventory
    request: PlacementRequest
    devices: str
    size: tuple
    """(width, height, frames) on the model's token grid."""
    dtype: str
    """The weight dtype asked, or the file's own (``bf16`` by default)."""
    dtypes: tuple
    """(weight, compute) torch dtypes simulated for ``dtype``."""
    batch: int | None
    parallel: str | None
    cfg: float | None
    n_workers: int
    size_note: str | None = None
    """How the asked size was rounded to the model's token grid (None: it was on the grid)."""
    gpus: GpuTable | None = None
    """The throughput table's name and rate of each GPU (``--gpu``, else their own names), settled once."""
    every_gpu: DevicePlan | None = None
    """The devices `sequence` runs on: every GPU of the inventory, listed."""
    usable: dict | None = None
    """Per inventory device: the bytes a plan may put there (``Inventory.usable_bytes``); a device
    missing from it (or None): no limit known."""


def check_simulation(model, devices: DevicePlan | str = DEFAULT_DEVICES, width: int = 832, height: int = 480,
                     frames: int = 81, batch: int | None = None, dtype: str | None = "bf16",
                     reserve_vram_gb: float = DEFAULT_RESERVE_VRAM_GB, inventory: Inventory | None = None,
                     parallel: str | None = None, cfg: float | None = None, gpu: str | None = None, link_gbps=None,
                     n_workers: int = 0) -> SimulationSetup:
    """Every check ``dry_run.simulate`` makes before it builds or runs anything (reads a model file's
    header, not its weights). ``devices``: a ``DevicePlan`` parsed by the caller, or the text of one
    (``auto``, a list, or an inventory spec of imagined GPUs) parsed here; ``n_workers``: how many
    worker devices will be given to ``run_simulation``. Other arguments: ``dry_run.simulate``'s."""
    _check_asked(batch, dtype, parallel, n_workers)
    spec = resolve_spec(model)
    family, shape = get_family(spec.family), shape_from_spec(spec)
    if cfg is None:  # the guidance core's templates sample this family with (MiniMax H3: the prompt alone)
        cfg = family.default_cfg
    if parallel is not None:
        parallel = check_parallel(parallel)
    if parallel is not None or n_workers:
        cfg = check_cfg(DEFAULT_CFG if cfg is None else cfg)
        if gpu:
            gpu_names(gpu)
        link_bandwidth(link_gbps)
    batch, size, size_note, dtype, dtypes = _settle(spec, family, shape, batch, cfg, parallel, n_workers,
                                                    (width, height, frames), dtype)
    inventory, plan, shown, every_gpu = _devices(devices, inventory, n_workers)
    if n_workers:
        parallel = None  # the worker report stands in for the strategy rows
    if parallel == "sequence" and len(inventory.gpus) < 2:
        raise InputError(f"parallel 'sequence' needs two or more GPUs; devices {shown!r} has "
                         f"{len(inventory.gpus)}: list more (e.g. 'cuda:0=24GiB,cuda:1=24GiB') or use 'auto'")
    request = PlacementRequest(devices=plan, reserve_vram_gb=float(reserve_vram_gb))
    gpus = gpu_table([(g.device, g.name) for g in inventory.gpus], gpu)
    return SimulationSetup(spec, family, shape, inventory, request, shown, size, dtype, dtypes, batch, parallel, cfg,
                           n_workers, size_note, gpus, every_gpu, inventory.usable_bytes(request.reserve_bytes))


def torch_dtypes(dtype: str, runs_fp16: bool = True) -> tuple[torch.dtype, torch.dtype]:
    """(weight dtype, compute dtype) of a dtype name. fp8: 1-byte weights, bf16 compute (ComfyUI's
    manual cast); fp16 for a family that does not run in fp16 (``runs_fp16`` False): bf16."""
    weight = _TORCH_DTYPES[dtype]
    if dtype == "fp8":
        return weight, torch.bfloat16
    if dtype == "fp16" and not runs_fp16:
        return torch.bfloat16, torch.bfloat16
    return weight, weight


def _check_asked(batch, dtype, parallel, n_workers: int) -> None:
    """The arguments that need no model: batch, dtype name, workers with `blocks`."""
    if batch not in (None, 1, 2):
        raise InputError(f"batch {batch!r} is not valid: 1 (cond and uncond one after the other), "
                         f"2 (together, as ComfyUI does when it fits) or None/'auto' (2 if it fits, else 1)")
    if dtype is not None and dtype not in _TORCH_DTYPES:
        raise InputError(f"dtype {dtype!r} is not one of {', '.join(DTYPES)}")
    if n_workers and parallel == "blocks":
        raise InputError("worker devices run in parallel 'sequence' only; use --parallel sequence "
                         "or auto, or list this machine's devices only")


def _settle(spec, family, shape, batch, cfg, parallel, n_workers: int, size: tuple, dtype):
    """(batch, size, size note, dtype name, (weight, compute) dtypes) for this model."""
    if n_workers:
        batch = 1 if cfg <= 1 else 2  # sequence runs cond + uncond together, split over the ranks
    elif parallel is not None and batch is None and cfg <= 1:
        batch = 1
    most = family.max_batch  # what ComfyUI gives this family's DiT in one call
    if batch is not None and batch > most:
        if most == 1 and batch == 2:
            log.info("[ShardDiT] %s: ComfyUI runs cond and uncond one after the other (batch 1)", spec.name)
        batch = most
    elif batch is None and most == 1:
        batch = most
    (width, height), size_note = _check_size(spec, shape.patch[1], *size)
    dtype = dtype or spec.file_dtype or "bf16"  # a file's own: one of _TORCH_DTYPES (presets._DTYPE_NAMES)
    if dtype == "fp16" and not family.runs_fp16:
        log.info("[ShardDiT] %s does not run in fp16 in ComfyUI: simulating bf16 (same size)", spec.name)
    return batch, (width, height, size[2]), size_note, dtype, torch_dtypes(dtype, family.runs_fp16)


def _check_size(spec, patch: int, width: int, height: int, frames: int) -> tuple:
    """``((width, height), note)``: the size ComfyUI ends up computing, and what was changed (None
    when nothing). ComfyUI's latent nodes floor the pixel size to the VAE's stride; the DiT then
    pads the latent to whole patches (Wan, HunyuanVideo 1.0: 2x2 latent cells). The size planned is
    the one with that token grid; ``note`` says so, e.g. 1280x720 -> 1280x704 for LTX-2.3."""
    g = spec.geometry
    if width < g.spatial or height < g.spatial or frames < 1:
        raise InputError(f"size {width}x{height}x{frames} is too small for {spec.name}: "
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


def _devices(devices, inventory, n_workers: int) -> tuple[Inventory, DevicePlan, str, DevicePlan]:
    """(inventory, device plan, the devices as said in messages, every GPU listed): ``devices``
    parsed once where it is still text (an inventory spec of imagined GPUs is planned ``auto`` over
    them); with workers, the host's own devices (``auto``: this machine's) and one ``cpu`` entry per
    worker. Every GPU, listed, is where `sequence` runs."""
    shown = devices.text if isinstance(devices, DevicePlan) else str(devices).strip() or "auto"
    if not isinstance(devices, DevicePlan):
        devices = shown
        if "=" in devices:
            inventory, devices = inventory_from_spec(devices), "auto"
        devices = parse_device_plan(devices)  # the dry run's devices, parsed once
    if inventory is None:
        inventory = read_inventory()
    every_gpu = DevicePlan.of_devices([g.device for g in inventory.gpus] or ["cpu"])
    if n_workers:
        if devices.auto:
            devices = DevicePlan.of_devices([g.device for g in inventory.gpus] or ["cpu"])
        devices = devices.with_worker_shares(n_workers)
        shown = devices.text
    return inventory, devices, shown, every_gpu
