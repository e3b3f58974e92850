"""Logic of the ``ShardDiTPlan`` node: inventory with what ComfyUI and ShardDiT hold, then the
simulated plan for the chosen preset, as one text and as a picture (``picture``)."""
from __future__ import annotations

from ...parallel.placement.inventory import read_inventory
from ..comfy.core.component_placement import read_loaded
from ..comfy.core.running_state import with_releasable
from ..comfy.remote.host_workers import describe_workers
from ..comfy.shard.hooks import get_shard_state
from . import dry_run
from ...parallel.errors import InputError

__all__ = ["BATCH_CHOICES", "check_batch", "check_gpu", "check_strategy_inputs", "picture_tensor", "read_holdings",
           "run_plan"]

BATCH_CHOICES = ("auto", "1", "2")


def read_holdings() -> dict[str, tuple[int, int]]:
    """Per device: (bytes ComfyUI's other loaded models hold, bytes ShardDiT's models hold)."""
    out: dict[str, list[int]] = {}
    for loaded in read_loaded():
        held = out.setdefault(loaded.device, [0, 0])
        held[1 if loaded.sharddit else 0] += loaded.loaded_bytes
    return {d: (c, s) for d, (c, s) in out.items()}


def check_batch(batch) -> None:
    """The Plan node's ``batch`` is one of ``BATCH_CHOICES`` (V3 combos are not checked by core)."""
    if str(batch) not in BATCH_CHOICES:
        raise InputError(f"batch {batch!r} is not one of {', '.join(BATCH_CHOICES)}: 'auto', "
                         f"'1' (cond and uncond one after the other) or '2' (together)")


def check_strategy_inputs(parallel, cfg, gpu, link_gbps) -> None:
    """ValueError naming the bad value and the fix (``gpu`` '' and ``link_gbps`` 0 mean the defaults)."""
    from ...parallel.cost.inputs import check_cfg, parse_link_gbps
    from ...parallel.cost.mode import check_parallel

    check_parallel(parallel)
    check_cfg(cfg)
    check_gpu(gpu)
    if link_gbps:
        parse_link_gbps(link_gbps)


def check_gpu(gpu) -> None:
    """The Plan node's ``gpu``: '' (the devices' own names) or a name in the throughput table."""
    from ...parallel.cost.inputs import gpu_names

    if str(gpu or "").strip():
        gpu_names(gpu)


def run_plan(model: str, devices: str, width: int, height: int, frames: int, batch: str,
             dtype: str, reserve_vram_gb: float, parallel: str = "auto", cfg: float = 6.0, gpu: str = "",
             link_gbps: float = 0.0) -> tuple[str, object]:
    """(text, SimulationReport). ``devices``: ``auto``, a list, or an inventory spec (imagined GPUs);
    ``gpu`` '' and ``link_gbps`` 0: the devices' names and the PCIe 4.0 no-P2P default."""
    check_batch(batch)
    check_strategy_inputs(parallel, cfg, gpu, link_gbps)
    holdings = read_holdings()
    devices = str(devices).strip() or "auto"
    inventory = None
    if "=" not in devices:
        inventory = read_inventory()
        held = {d: s for d, (_, s) in holdings.items() if d in inventory.names and s}
        inventory = with_releasable(inventory.with_held_bytes(held))  # as the loaders count free memory
    report = dry_run.simulate(model, devices=devices, width=width, height=height, frames=frames,
                                batch=None if batch == "auto" else int(batch), dtype=dtype,
                                reserve_vram_gb=reserve_vram_gb, inventory=inventory, parallel=parallel, cfg=cfg,
                                gpu=str(gpu or "").strip() or None, link_gbps=link_gbps or None)
    text = report.to_text(holdings if inventory is not None else None)
    extra = [part for part in (describe_current_placements(inventory), describe_workers()) if part]
    return "\n\n".join([text, *extra]), report


def picture_tensor(report):
    """The plan picture as a ComfyUI IMAGE batch (1 x H x W x 3 float in [0, 1])."""
    import numpy as np
    import torch

    from .picture import draw_plan_picture, picture_from_report

    pixels = np.asarray(draw_plan_picture(picture_from_report(report)), dtype=np.float32) / 255.0
    return torch.from_numpy(pixels).unsqueeze(0)


def describe_current_placements(inventory) -> str:
    """The plans of the models ShardDiT has sharded and ComfyUI holds loaded now ('' if none)."""
    parts, seen = [], set()
    for loaded in read_loaded():
        state = get_shard_state(loaded.patcher)
        if state is None or id(state.plan) in seen:
            continue
        seen.add(id(state.plan))
        patcher = loaded.patcher
        plan = state.plan
        name = type(patcher.model.diffusion_model).__name__ if hasattr(patcher.model, "diffusion_model") else "model"
        body = plan.to_text(inventory) if inventory is not None else str(plan.to_dict())
        parts.append(f"Loaded now, sharded by ShardDiT: {name}\n{body}")
    return "\n\n".join(parts)
