"""Logic of the ``ShardDiTPlan`` node: inventory with what ComfyUI and ShardDiT hold, then the
simulated plan for the chosen preset, as one text."""
from __future__ import annotations

from ...parallel.inventory import read_inventory
from . import simulator

__all__ = ["BATCH_CHOICES", "read_holdings", "run_plan"]

BATCH_CHOICES = ("auto", "1", "2")


def read_holdings() -> dict[str, tuple[int, int]]:
    """Per device: (bytes ComfyUI's other loaded models hold, bytes ShardDiT's models hold).

    From ``comfy.model_management.current_loaded_models`` (each entry: a ModelPatcher loaded on
    one device; ``loaded_size()`` is what sits on that device now).
    """
    import comfy.model_management as mm

    from ..comfy.placement import is_sharddit_patcher

    out: dict[str, list[int]] = {}
    for loaded in list(mm.current_loaded_models):
        patcher = loaded.model
        if patcher is None:
            continue
        size = int(patcher.loaded_size())
        slot = out.setdefault(str(loaded.device), [0, 0])
        slot[1 if is_sharddit_patcher(patcher) else 0] += size
    return {d: (c, s) for d, (c, s) in out.items()}


def check_batch(batch) -> None:
    """The Plan node's ``batch`` is one of ``BATCH_CHOICES`` (V3 combos are not checked by core)."""
    if str(batch) not in BATCH_CHOICES:
        raise ValueError(f"[ShardDiT] batch {batch!r} is not one of {', '.join(BATCH_CHOICES)}: 'auto', "
                         f"'1' (cond and uncond one after the other) or '2' (together)")


def run_plan(model: str, devices: str, width: int, height: int, frames: int, batch: str,
             dtype: str, reserve_vram_gb: float) -> tuple[str, bool]:
    """(text, fits). ``devices``: ``auto``, a list, or an inventory spec (imagined GPUs)."""
    check_batch(batch)
    holdings = read_holdings()
    devices = str(devices).strip() or "auto"
    inventory = None
    if "=" not in devices:
        inventory = read_inventory()
        held = {d: s for d, (_, s) in holdings.items() if d in inventory.names and s}
        inventory = inventory.with_held_bytes(held)
    report = simulator.simulate(model, devices=devices, width=width, height=height, frames=frames,
                                batch=None if batch == "auto" else int(batch), dtype=dtype,
                                reserve_vram_gb=reserve_vram_gb, inventory=inventory)
    text = report.to_text(holdings if inventory is not None else None)
    current = describe_current_placements(inventory)
    return (text + "\n\n" + current if current else text), report.fits


def describe_current_placements(inventory) -> str:
    """The plans of the models ShardDiT has sharded and ComfyUI holds loaded now ('' if none)."""
    import comfy.model_management as mm

    parts, seen = [], set()
    for loaded in list(mm.current_loaded_models):
        patcher = loaded.model
        get = getattr(patcher, "get_attachment", None)
        state = get("sharddit") if callable(get) else None
        plan = getattr(state, "plan", None)
        if plan is None or id(plan) in seen:
            continue
        seen.add(id(plan))
        name = type(patcher.model.diffusion_model).__name__ if hasattr(patcher.model, "diffusion_model") else "model"
        body = plan.to_text(inventory) if inventory is not None else str(plan.to_dict())
        parts.append(f"Loaded now, sharded by ShardDiT: {name}\n{body}")
    return "\n\n".join(parts)
