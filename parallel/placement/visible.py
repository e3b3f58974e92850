"""Map NVML's physical GPUs to torch's visible device numbers (pure, MIG-free).

NVML enumerates every physical GPU in PCI bus order and ignores ``CUDA_VISIBLE_DEVICES``; torch
numbers only the visible GPUs, in the order that variable lists them. Two pure mappings:

- ``infer_visible_gpus``: from ``CUDA_VISIBLE_DEVICES`` alone (index form ``"1,0"`` or UUID form
  ``"GPU-8932f937,GPU-1d2e..."``, UUID prefixes allowed when unique, as CUDA does). Index form
  assumes ``CUDA_DEVICE_ORDER=PCI_BUS_ID`` numbering; CUDA's default ``FASTEST_FIRST`` can differ
  on mixed GPUs, which is why the inventory prefers ``match_torch_devices`` when torch can say;
- ``match_torch_devices``: from the UUID / PCI bus id torch reports for each visible device.

``hidden_gpus_note`` says when the driver has GPUs this process cannot use, and the fix: ComfyUI on
Windows sets ``CUDA_VISIBLE_DEVICES=0`` unless started with ``--cuda-device all`` (core #15737).
"""
from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from ..errors import InputError


__all__ = ["PhysicalGpu", "hidden_gpus_note", "infer_visible_gpus", "match_torch_devices", "normalize_pci_bus_id",
           "normalize_uuid"]

log = logging.getLogger("sharddit")


@dataclass(frozen=True)
class PhysicalGpu:
    """One GPU as NVML reports it."""

    nvml_index: int
    """NVML's index (physical, PCI bus order, ignores CUDA_VISIBLE_DEVICES)."""
    name: str
    """Marketing name, e.g. ``"NVIDIA GeForce RTX 4090"``."""
    total_bytes: int
    """Total memory."""
    free_bytes: int
    """Free memory now (other processes' use already subtracted)."""
    uuid: str
    """``"GPU-xxxxxxxx-...."`` as NVML spells it."""
    pci_bus_id: str
    """PCI bus id as NVML spells it, e.g. ``"00000000:01:00.0"``."""


def normalize_uuid(uuid: str) -> str:
    """``"GPU-8932F937-..."`` / ``"8932f937-..."`` -> ``"8932f937-..."`` (lowercase, no prefix)."""
    text = str(uuid).strip().lower()
    return text.removeprefix("gpu-")


def normalize_pci_bus_id(bus_id: str) -> str:
    """``"00000000:01:00.0"`` / ``"0000:01:00.0"`` -> ``"0000:01:00"`` (domain:bus:device, hex)."""
    parts = str(bus_id).strip().lower().split(".")[0].split(":")
    if len(parts) != 3:
        raise InputError(f"PCI bus id {bus_id!r} is not in the form 'domain:bus:device.function'")
    domain, bus, device = (int(p, 16) for p in parts)
    return f"{domain:04x}:{bus:02x}:{device:02x}"


def infer_visible_gpus(physical: Sequence[PhysicalGpu], cuda_visible_devices: str | None) -> tuple[PhysicalGpu, ...]:
    """GPUs torch will number 0, 1, ... given ``CUDA_VISIBLE_DEVICES`` (None = unset = all).

    As CUDA does, the list stops at the first entry that is invalid (unknown index, unknown or
    ambiguous UUID prefix, a repeat, a ``MIG-`` id, which this pack does not support).
    """
    ordered = tuple(sorted(physical, key=lambda g: normalize_pci_bus_id(g.pci_bus_id)))
    if cuda_visible_devices is None:
        return ordered
    visible: list[PhysicalGpu] = []
    for entry in (e.strip() for e in cuda_visible_devices.split(",")):
        gpu = _find_entry(ordered, entry)
        if gpu is None or gpu in visible:
            if entry:
                log.info("[ShardDiT] CUDA_VISIBLE_DEVICES entry %r ends the visible list (invalid, repeated or MIG)", entry)
            break
        visible.append(gpu)
    return tuple(visible)


def _find_entry(ordered: Sequence[PhysicalGpu], entry: str) -> PhysicalGpu | None:
    if entry.isdigit():
        index = int(entry)
        return ordered[index] if index < len(ordered) else None
    if not entry.lower().startswith("gpu-") or len(entry) <= 4:
        return None
    prefix = normalize_uuid(entry)
    matches = [g for g in ordered if normalize_uuid(g.uuid).startswith(prefix)]
    return matches[0] if len(matches) == 1 else None


def match_torch_devices(
    physical: Sequence[PhysicalGpu], torch_ids: Sequence[tuple[str, str]]
) -> tuple[PhysicalGpu, ...] | None:
    """Physical GPU for each torch device, given torch's ``(uuid, pci_bus_id)`` per device.

    Matches by UUID, else by PCI bus id (either may be ``""`` when unknown). None when any torch
    device has no unique match (the caller then falls back to torch's own memory numbers).
    """
    found: list[PhysicalGpu] = []
    for uuid, bus in torch_ids:
        match = [g for g in physical if uuid and normalize_uuid(g.uuid) == normalize_uuid(uuid)]
        if not match and bus:
            match = [g for g in physical if normalize_pci_bus_id(g.pci_bus_id) == normalize_pci_bus_id(bus)]
        if len(match) != 1 or match[0] in found:
            return None
        found.append(match[0])
    return tuple(found)


def hidden_gpus_note(physical: Sequence[PhysicalGpu], visible: Sequence[PhysicalGpu] | None, n_visible: int,
                     cuda_visible_devices: str | None, windows: bool) -> str:
    """One line when NVML sees more GPUs than this process's torch (``""`` otherwise), with the fix.

    ``visible``: the physical GPUs torch uses (None when unmatched: only ``n_visible`` is known).
    """
    n_hidden = len(physical) - n_visible
    if n_hidden <= 0:
        return ""
    if visible is not None:
        which = ", ".join(f"{g.name} (NVML {g.nvml_index})" for g in physical if g not in visible)
    else:
        which = f"{n_hidden} of them"
    env = "unset" if cuda_visible_devices is None else repr(cuda_visible_devices)
    every = ",".join(str(i) for i in range(len(physical)))
    if windows:
        fix = ("start ComfyUI with --cuda-device all (on Windows ComfyUI sets CUDA_VISIBLE_DEVICES=0 without it, "
               "e.g. add it to run_nvidia_gpu.bat; add --disable-pinned-memory too where ComfyUI's start-up warning "
               "asks for it), and do not set CUDA_VISIBLE_DEVICES yourself")
    elif cuda_visible_devices is not None:
        fix = (f"unset CUDA_VISIBLE_DEVICES or list every GPU in it (CUDA_VISIBLE_DEVICES={every}; "
               f"ComfyUI: --cuda-device {every})")
    else:
        fix = ("CUDA_VISIBLE_DEVICES is unset, so check that every GPU works (nvidia-smi) and, in a container, "
               "that it gets them all (docker run --gpus all)")
    return (f"NVML sees {len(physical)} GPUs, torch {n_visible}: {which} hidden from this process "
            f"(CUDA_VISIBLE_DEVICES {env}). To use them: {fix}.")
