"""Device inventory: what GPUs torch can use, their free memory, and system RAM.

The ONLY module that touches NVML (``pynvml``, from the ``nvidia-ml-py`` package, imported lazily
inside functions). Order of sources in ``read_inventory``:

1. NVML (free memory as the driver sees it, all processes), mapped to torch's device numbers by
   UUID / PCI bus id (``visible.py``);
2. ``torch.cuda.mem_get_info`` when NVML is missing or fails (ROCm, no driver, a container);
3. CPU only when there is no GPU.

``inventory_from_spec`` builds an inventory from a string for dry runs and tests.
"""
from __future__ import annotations

import logging
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, replace

from ..units import GiB, MiB
from .visible import (
    PhysicalGpu,
    hidden_gpus_note,
    infer_visible_gpus,
    match_torch_devices,
    normalize_pci_bus_id,
)
from ..errors import InputError, reason_of

__all__ = [
    "SPEC_FORM",
    "DeviceInfo",
    "Inventory",
    "inventory_from_spec",
    "parse_bytes",
    "read_cpu_info",
    "read_hidden_note",
    "read_inventory",
    "read_nvml_gpu_count",
]

log = logging.getLogger("sharddit")
SPEC_FORM = (
    "'cuda:0=24GiB,cuda:1=12GiB' (free memory per device; optional total as in 'cuda:0=20GiB/24GiB'; "
    "units GiB, GB, MiB, MB or bytes; 'cpu=64GiB' sets system RAM)"
)
_UNITS = {"gib": GiB, "gb": 10**9, "mib": MiB, "mb": 10**6, "bytes": 1, "b": 1}
_SIZE_RE = re.compile(r"^(\d+(?:\.\d+)?)\s*([a-z]+)$")


@dataclass(frozen=True)
class DeviceInfo:
    """One device the planner may use."""

    device: str
    """``"cuda:N"`` in torch's numbering (what ``torch.device`` takes), or ``"cpu"``."""
    name: str
    """Human name: the GPU model, ``"CPU"``, or ``"spec"`` for spec inventories."""
    total_bytes: int
    """Total memory (system RAM for ``cpu``)."""
    free_bytes: int
    """Free memory when read (available RAM for ``cpu``)."""
    uuid: str = ""
    """NVML UUID (``"GPU-..."``); empty when unknown."""
    pci_bus_id: str = ""
    """``"dddd:bb:dd"`` PCI bus id; empty when unknown."""
    held_bytes: int = 0
    """Bytes ShardDiT itself already holds there (see ``Inventory.with_held_bytes``)."""
    releasable_bytes: int = 0
    """Bytes ComfyUI's memory manager holds there and gives back on demand (comfy-aimdo's
    reclaimable pages, torch's cached blocks): NVML counts them as used
    (``Inventory.with_releasable_bytes``)."""

    @property
    def available_bytes(self) -> int:
        """Free plus what ShardDiT holds (re-planning the same models may reuse that memory) plus
        what ComfyUI can release for it."""
        return self.free_bytes + self.held_bytes + self.releasable_bytes

    @property
    def is_cuda(self) -> bool:
        return self.device.startswith("cuda:")

    @property
    def torch_index(self) -> int | None:
        """N of ``cuda:N``; None for ``cpu``."""
        return int(self.device.split(":")[1]) if self.is_cuda else None


@dataclass(frozen=True)
class Inventory:
    """Devices available to this process (GPUs in torch order, then ``cpu`` if known)."""

    devices: tuple[DeviceInfo, ...]
    """Every device; device names are unique."""
    source: str
    """Where the numbers came from: ``"nvml"``, ``"torch"``, ``"cpu"`` or ``"spec"``."""
    hidden_note: str = ""
    """When NVML sees GPUs torch does not (``CUDA_VISIBLE_DEVICES``, ComfyUI's Windows default):
    one line naming them and the fix (``visible.hidden_gpus_note``; no log prefix: messages embed it);
    empty otherwise."""

    def __post_init__(self) -> None:
        names = [d.device for d in self.devices]
        assert len(set(names)) == len(names), f"duplicate devices in inventory: {names}"
        assert self.source in ("nvml", "torch", "cpu", "spec"), self.source

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(d.device for d in self.devices)

    @property
    def gpus(self) -> tuple[DeviceInfo, ...]:
        return tuple(d for d in self.devices if d.is_cuda)

    @property
    def cpu(self) -> DeviceInfo | None:
        return next((d for d in self.devices if d.device == "cpu"), None)

    def get(self, device: str) -> DeviceInfo:
        """The entry for ``device``; ValueError naming what exists when absent."""
        for info in self.devices:
            if info.device == device:
                return info
        raise InputError(f"device {device!r} is not in the inventory ({', '.join(self.names) or 'empty'})")

    def usable_bytes(self, reserve: int) -> dict[str, int | None]:
        """Per device, what a plan may put there: free + held - ``reserve`` (a GPU), the available
        RAM (``cpu``, no reserve; None where its size is unknown: then enough)."""
        return {d.device: (d.available_bytes if d.total_bytes else None) if d.device == "cpu"
                else d.available_bytes - reserve for d in self.devices}

    def with_held_bytes(self, held: Mapping[str, int]) -> Inventory:
        """Copy with ``held_bytes`` set per device (bytes ShardDiT already placed there).

        Free memory read while ShardDiT's own models are loaded is low by exactly those bytes; the
        planner counts ``free + held`` so that queueing the same workflow twice plans the same
        placement and moves nothing. Devices missing from ``held`` get 0.
        """
        return self._with_bytes("held_bytes", held)

    def with_releasable_bytes(self, releasable: Mapping[str, int]) -> Inventory:
        """Copy with ``releasable_bytes`` set per device: memory ComfyUI holds and can release
        (comfy-aimdo's dynamic VRAM keeps it for ComfyUI; NVML reports it as used, so free memory
        alone would plan too little). Devices missing from ``releasable`` get 0."""
        return self._with_bytes("releasable_bytes", releasable)

    def _with_bytes(self, field: str, per_device: Mapping[str, int]) -> Inventory:
        what = field.replace("_", " ")
        unknown = set(per_device) - set(self.names)
        if unknown:
            raise InputError(f"{what} for {sorted(unknown)}, which are not in the inventory ({', '.join(self.names)})")
        if any(v < 0 for v in per_device.values()):
            raise InputError(f"{what} must be >= 0, got {dict(per_device)}")
        return replace(self, devices=tuple(replace(d, **{field: int(per_device.get(d.device, 0))})
                                           for d in self.devices))


def parse_bytes(text: str) -> int:
    """``"24GiB"``, ``"12 GB"``, ``"512MiB"``, ``"1000bytes"`` -> bytes; ValueError otherwise."""
    match = _SIZE_RE.match(str(text).strip().lower())
    if not match or match.group(2) not in _UNITS:
        raise InputError(f"size {str(text).strip()!r} is not a size like '24GiB', '12GB', '512MiB', '500MB' or '1000bytes'")
    return int(float(match.group(1)) * _UNITS[match.group(2)])


def inventory_from_spec(spec: str) -> Inventory:
    """Inventory from ``"cuda:0=24GiB,cuda:1=20GiB/24GiB,cpu=64GiB"`` (free[/total] per device)."""
    if not isinstance(spec, str) or not spec.strip():
        raise InputError(f"inventory spec {spec!r} is empty; accepted: {SPEC_FORM}")
    devices = [_parse_spec_part(part, spec) for part in spec.split(",")]
    names = [d.device for d in devices]
    for name in names:
        if names.count(name) > 1:
            raise InputError(f"inventory spec {spec.strip()!r} lists {name!r} twice; accepted: {SPEC_FORM}")
    devices.sort(key=lambda d: (d.torch_index is None, d.torch_index or 0))
    return Inventory(devices=tuple(devices), source="spec")


def _parse_spec_part(part: str, spec: str) -> DeviceInfo:
    from .devices import parse_device

    where = f"inventory spec {spec.strip()!r}: {part.strip()!r}"
    if part.count("=") != 1:
        raise InputError(f"{where} is not 'device=size'; accepted: {SPEC_FORM}")
    name, sizes = (s.strip() for s in part.split("="))
    try:
        device = parse_device(name)
        free, _, total = sizes.partition("/")
        free_bytes = parse_bytes(free)
        total_bytes = parse_bytes(total) if total else free_bytes
    except ValueError as err:
        raise InputError(f"{where}: {reason_of(err)}; accepted: {SPEC_FORM}") from None
    if free_bytes > total_bytes:
        raise InputError(f"{where}: free {free.strip()} is more than total {total.strip()}; accepted: {SPEC_FORM}")
    return DeviceInfo(device=device, name="CPU" if device == "cpu" else "spec", total_bytes=total_bytes, free_bytes=free_bytes)


def read_cpu_info() -> DeviceInfo:
    """System RAM as a ``cpu`` entry (psutil when installed, else ``os.sysconf``; 0 if unknown)."""
    try:
        import psutil

        mem = psutil.virtual_memory()
        total, free = int(mem.total), int(mem.available)
    except ImportError:
        try:
            page = os.sysconf("SC_PAGE_SIZE")
            total, free = page * os.sysconf("SC_PHYS_PAGES"), page * os.sysconf("SC_AVPHYS_PAGES")
        except (AttributeError, ValueError, OSError):
            total = free = 0
    return DeviceInfo(device="cpu", name="CPU", total_bytes=total, free_bytes=free)


_LOGGED: set = set()
"""Messages (template, first argument's type) logged already: the inventory is read on every
prompt, its fallbacks are logged once per process."""


def _log_once(level: int, msg: str, *args) -> None:
    key = (msg, type(args[0]).__name__ if args else None)
    if key not in _LOGGED:
        _LOGGED.add(key)
        log.log(level, msg, *args)


def read_inventory() -> Inventory:
    """Read the devices now: NVML, else torch, else CPU only. Never raises for a missing GPU.
    GPUs the driver has but this process cannot use are named once in the log (``hidden_note``)."""
    cpu = read_cpu_info()
    gpus, note = None, ""
    try:
        physical = _read_nvml_physical()
    except Exception as err:  # pynvml missing, no driver, NVML_ERROR_*: all mean "ask torch"
        _log_once(logging.INFO, "[ShardDiT] NVML unavailable (%s: %s); reading free memory from torch",
                  type(err).__name__, err)
    else:
        gpus, note = _nvml_gpus(physical)
    if gpus:
        inventory = Inventory(devices=gpus + (cpu,), source="nvml", hidden_note=note)
    elif gpus := _read_torch_gpus():
        inventory = Inventory(devices=gpus + (cpu,), source="torch", hidden_note=note)
    else:
        _log_once(logging.INFO, "[ShardDiT] no CUDA GPU visible to torch: CPU only")
        inventory = Inventory(devices=(cpu,), source="cpu", hidden_note=note)
    if note:  # INFO: ComfyUI's log shows it; ``plan`` and the Plan node print ``hidden_note`` themselves
        _log_once(logging.INFO, "[ShardDiT] " + note.replace("%", "%%"))
    return inventory


def read_hidden_note(devices: str) -> str:
    """``hidden_note`` of this machine's inventory, for a ``devices`` input that plans on it
    (``""`` for imagined GPUs, ``"cuda:0=24GiB,..."``): ``plan`` and the Plan node print it."""
    note = "" if "=" in str(devices) else read_inventory().hidden_note
    return f"[ShardDiT] {note}" if note else ""


def read_nvml_gpu_count() -> tuple[int | None, str]:
    """(GPUs NVML sees on this machine, all of them whatever ``CUDA_VISIBLE_DEVICES`` says; None and
    why when NVML cannot be read): what ``selftest`` sets beside torch's count."""
    try:
        return len(_read_nvml_physical()), ""
    except Exception as err:  # pynvml missing, no driver: the caller says so
        return None, f"{type(err).__name__}: {err}"


def _nvml_gpus(physical: tuple[PhysicalGpu, ...]) -> tuple[tuple[DeviceInfo, ...] | None, str]:
    """(GPUs from NVML in torch numbering, or None when torch's devices cannot be matched; the
    hidden-GPU note)."""
    torch_ids = _read_torch_ids()
    env = os.environ.get("CUDA_VISIBLE_DEVICES")
    if torch_ids is None:  # torch cannot tell (CPU build, CUDA not initialisable): trust the env
        visible = infer_visible_gpus(physical, env)
    else:
        visible = match_torch_devices(physical, torch_ids)
    n_visible = len(visible) if visible is not None else len(torch_ids)
    note = hidden_gpus_note(physical, visible, n_visible, env, windows=_on_windows())
    if visible is None:
        _log_once(logging.INFO, "[ShardDiT] torch's GPUs do not match NVML's by UUID/PCI bus id; using torch's numbers")
        return None, note
    gpus = tuple(
        DeviceInfo(f"cuda:{i}", g.name, g.total_bytes, g.free_bytes, g.uuid, normalize_pci_bus_id(g.pci_bus_id))
        for i, g in enumerate(visible)
    )
    return gpus, note


def _on_windows() -> bool:
    return os.name == "nt"


def _read_nvml_physical() -> tuple[PhysicalGpu, ...]:
    import pynvml

    pynvml.nvmlInit()
    try:
        gpus = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(i)
            mem = pynvml.nvmlDeviceGetMemoryInfo(handle)
            gpus.append(PhysicalGpu(
                nvml_index=i,
                name=_text(pynvml.nvmlDeviceGetName(handle)),
                total_bytes=int(mem.total),
                free_bytes=int(mem.free),
                uuid=_text(pynvml.nvmlDeviceGetUUID(handle)),
                pci_bus_id=_text(pynvml.nvmlDeviceGetPciInfo(handle).busId),
            ))
        return tuple(gpus)
    finally:
        pynvml.nvmlShutdown()


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _read_torch_ids() -> tuple[tuple[str, str], ...] | None:
    """(uuid, pci bus id) per torch device, or None when torch has no usable CUDA."""
    try:
        import torch

        if not torch.cuda.is_available():
            return None
        ids = []
        for i in range(torch.cuda.device_count()):
            p = torch.cuda.get_device_properties(i)
            bus = f"{p.pci_domain_id:04x}:{p.pci_bus_id:02x}:{p.pci_device_id:02x}" if hasattr(p, "pci_bus_id") else ""
            ids.append((str(getattr(p, "uuid", "")), bus))
        return tuple(ids)
    except Exception as err:  # a broken CUDA setup must not stop the inventory
        _log_once(logging.INFO, "[ShardDiT] torch could not list CUDA devices (%s)", err)
        return None


def _read_torch_gpus() -> tuple[DeviceInfo, ...]:
    """GPUs from ``torch.cuda.mem_get_info`` (no NVML); empty when torch has no CUDA."""
    try:
        import torch

        if not torch.cuda.is_available():
            return ()
        gpus = []
        for i in range(torch.cuda.device_count()):
            free, total = torch.cuda.mem_get_info(i)
            gpus.append(DeviceInfo(f"cuda:{i}", torch.cuda.get_device_name(i), int(total), int(free)))
        return tuple(gpus)
    except Exception as err:
        _log_once(logging.WARNING, "[ShardDiT] torch could not read CUDA memory (%s); planning for CPU only", err)
        return ()
