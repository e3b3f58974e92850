"""Words of the planner: the plan table users read, notes, and error messages (pure).

Kept apart from ``planner.py`` so the rules stay short. Functions take the planner's private
context duck-typed (``inventory``, ``footprint``, ``request``, ``capacity()``, ``room()``).
"""
from __future__ import annotations

from ..units import format_gib
from ..errors import InputError

__all__ = [
    "PlacementError",
    "format_component_note",
    "format_dit_error",
    "format_plan_table",
    "format_skip_note",
    "format_weight_error",
]

_FIX = (
    "To fit: fewer frames or a smaller resolution (less activation memory), more devices, "
    "fp8 weights, or a lower reserve_vram_gb (now {reserve:g})."
)


class PlacementError(InputError):
    """The models do not fit the devices; the message gives GiB needed vs usable and the fix."""


def _format_usable(ctx, device: str, loads: dict, home: int = 0) -> str:
    """``cuda:0 (NAME) 24.0 free - 2.0 reserve - 3.0 activations = 19.0 GiB``."""
    fp = ctx.footprint
    w, a = loads.get(device, (0, 0))
    if device == "cpu" and (ctx.inventory.cpu is None or ctx.inventory.cpu.total_bytes == 0):
        return "cpu (RAM size unknown, assumed enough)"
    info = ctx.inventory.get(device)
    terms = [f"{format_gib(info.available_bytes)} free"]
    parts = [f"{format_gib(b)} {who}" for b, who in ((info.held_bytes, "held by ShardDiT"),
                                                      (info.releasable_bytes, "ComfyUI can release")) if b]
    if parts:
        terms[0] += f" (incl. {' and '.join(parts)})"
    if device != "cpu":
        terms.append(f"{format_gib(ctx.request.reserve_bytes)} reserve")
    terms.append(f"{format_gib(max(a, fp.dit_activation_bytes))} activations")
    if home:
        terms.append(f"{format_gib(home)} DiT home")
    if w:
        terms.append(f"{format_gib(w)} text encoder/VAE")
    usable = ctx.room(device, loads, home, fp.dit_activation_bytes)
    return f"{device} ({info.name}) {' - '.join(terms)} = {format_gib(usable)} GiB"


def format_skip_note(ctx, device: str, loads: dict, block_bytes: int) -> str:
    return (
        f"{_format_usable(ctx, device, loads)} usable: skipped for DiT blocks, "
        f"less than one block ({format_gib(block_bytes)} GiB)"
    )


def format_dit_error(ctx, devices, loads: dict) -> str:
    fp = ctx.footprint
    home = devices[0] if devices else None
    usable = [_format_usable(ctx, d, loads, fp.dit_home_bytes if d == home else 0) for d in devices]
    total = sum(max(ctx.room(d, loads, fp.dit_home_bytes if d == home else 0, fp.dit_activation_bytes), 0) for d in devices)
    return (
        f"the DiT does not fit: it needs {format_gib(fp.dit_bytes)} GiB of weights "
        f"({format_gib(fp.dit_home_bytes)} DiT home + {len(fp.block_bytes)} blocks of up to "
        f"{format_gib(max(fp.block_bytes))}) plus {format_gib(fp.dit_activation_bytes)} GiB of activations "
        f"on each device it runs on. Usable for blocks: {'; '.join(usable) or 'no device'}; "
        f"together {format_gib(total)} GiB for {format_gib(sum(fp.block_bytes))} GiB of blocks. "
        + _FIX.format(reserve=ctx.request.reserve_vram_gb) + _hidden(ctx)
    )


def _hidden(ctx) -> str:
    """The inventory's line on GPUs this process cannot use (ComfyUI's Windows default shows one GPU
    unless started with ``--cuda-device all``): they may be what the plan is missing."""
    note = ctx.inventory.hidden_note
    if not note:
        return ""
    fix = note.partition("To use them: ")[2] or note
    return f" This machine has more GPUs than this process sees; to use them: {fix}"


def format_weight_error(ctx, entry, start: int, stop: int, cap: int) -> str:
    size = sum(ctx.footprint.block_bytes[start:stop])
    return (
        f"devices {ctx.request.devices.text!r}: weight {entry.weight:g} gives {entry.device} blocks "
        f"{start}-{stop - 1} ({format_gib(size)} GiB) but it has {format_gib(max(cap, 0))} GiB usable "
        f"for blocks; change the weights or use devices 'auto'. "
        + _FIX.format(reserve=ctx.request.reserve_vram_gb)
    )


def format_component_note(name: str, device: str, kind: str, need: int, usable: int) -> str:
    if kind == "short":
        return (
            f"{name} on {device} as requested, but it needs {format_gib(need)} GiB and {device} has "
            f"{format_gib(usable)} GiB usable: ComfyUI will offload part of it (slower)"
        )
    if kind == "beside":
        return f"{name} beside the DiT on {device}: no other GPU has {format_gib(need)} GiB usable"
    return f"{name} on cpu (slow): it needs {format_gib(need)} GiB and no GPU has that much left"


def format_plan_table(plan, inventory) -> str:
    """Table: device | name | free GiB | holds | planned GiB, then the notes."""
    loads = {load.device: load for load in plan.loads}
    devices = list(inventory.names) + [d for d in loads if d not in inventory.names]
    rows = [("device", "name", "free GiB", "holds", "planned GiB")]
    for device in devices:
        info = inventory.get(device) if device in inventory.names else None
        load = loads.get(device)
        rows.append((
            device,
            info.name if info else "CPU",
            format_gib(info.free_bytes) if info else "?",
            ", ".join(_describe_holdings(plan, device)) or "-",
            format_gib(load.weight_bytes + load.activation_bytes) if load else "-",
        ))
    widths = [max(len(r[i]) for r in rows) for i in range(5)]
    lines = [" | ".join(c.rjust(w) if i in (2, 4) else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths))).rstrip()
             for r in rows]
    lines.insert(1, "-+-".join("-" * w for w in widths))
    lines += [f"- {note}" for note in plan.notes]
    return "\n".join(lines)


def _describe_holdings(plan, device: str) -> list[str]:
    held = []
    if plan.text_encoder_device == device:
        held.append("text encoder")
    if plan.vae_device == device:
        held.append("VAE")
    if plan.home_device == device:
        held.append("DiT home")
    ranges = [f"{r.start}-{r.stop - 1}" for r in plan.block_ranges if r.device == device]
    if ranges:
        held.append("blocks " + ", ".join(ranges))
    return held
