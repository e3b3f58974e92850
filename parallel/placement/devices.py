"""Parse and check device strings typed by users (pure: no torch, no NVML).

Accepted forms (whitespace around parts is ignored, case-insensitive):

- ``auto``: let the planner choose from free memory;
- a comma-separated list of ``cpu`` / ``cuda:N``, devices may repeat (``cpu,cpu`` = two shards on
  the CPU, ``cuda:0,cuda:0,cuda:1`` = two shards on cuda:0);
- the same list with a positive weight per device, ``cuda:N:W`` / ``cpu:W``
  (``cuda:0:3,cuda:1:1`` = three quarters of the blocks on cuda:0). Either every entry has a
  weight or none has.

A single component device (text encoder, VAE) is ``auto``, ``cpu`` or ``cuda:N``.

Devices of ShardDiT workers on other machines (distributed `sequence` mode) are written
``NAME/cpu`` or ``NAME/cuda:N`` (``cuda:0,cuda:1,box2/cuda:0``); ``split_worker_devices`` takes
them out of the list before the host's own devices are planned.
"""
from __future__ import annotations

import math
import re
from collections.abc import Iterable
from dataclasses import dataclass

__all__ = [
    "DEVICES_FORM",
    "DEVICE_FORM",
    "DeviceEntry",
    "DeviceList",
    "MEMBER_NAME_FORM",
    "MEMBER_NAME_RE",
    "check_devices_exist",
    "check_member_name",
    "parse_component_device",
    "parse_device",
    "parse_devices",
    "split_worker_devices",
]

DEVICES_FORM = "'auto', or a list like 'cuda:0,cuda:1' or 'cpu,cpu', optionally weighted like 'cuda:0:3,cuda:1:1'"
DEVICE_FORM = "'auto', 'cpu' or 'cuda:N' (N = 0, 1, ...)"


@dataclass(frozen=True)
class DeviceEntry:
    """One entry of a device list."""

    device: str
    """Canonical device name: ``"cpu"`` or ``"cuda:N"``."""
    weight: float | None = None
    """Explicit share of the DiT blocks (``cuda:0:3``); None = proportional to usable memory."""


@dataclass(frozen=True)
class DeviceList:
    """A parsed ``devices`` input."""

    auto: bool
    """True for ``auto``: the planner picks the devices."""
    entries: tuple[DeviceEntry, ...] = ()
    """The listed devices in order (empty when ``auto``); repeats allowed."""

    @property
    def weighted(self) -> bool:
        """True when the user gave explicit weights."""
        return any(e.weight is not None for e in self.entries)

    @property
    def unique_devices(self) -> tuple[str, ...]:
        """Distinct devices in first-seen order."""
        return tuple(dict.fromkeys(e.device for e in self.entries))


def parse_device(text: str) -> str:
    """``"cpu"`` / ``"cuda:N"`` (any case, spaces ignored) -> canonical name; ValueError otherwise."""
    device, weight = _parse_entry(text, context=text)
    if weight is not None:
        raise ValueError(f"device {text.strip()!r} has a weight; expected 'cpu' or 'cuda:N'")
    return device


def parse_component_device(text: str) -> str:
    """Device of a single component: ``"auto"``, ``"cpu"`` or ``"cuda:N"``."""
    if not isinstance(text, str):
        raise ValueError(f"device {text!r} is not a string; accepted: {DEVICE_FORM}")
    if text.strip().lower() == "auto":
        return "auto"
    try:
        return parse_device(text)
    except ValueError:
        raise ValueError(f"device {text.strip()!r} is not valid; accepted: {DEVICE_FORM}") from None


def parse_devices(text: str) -> DeviceList:
    """Parse a ``devices`` input (see module docstring). Malformed -> ValueError quoting the part."""
    if not isinstance(text, str):
        raise ValueError(f"devices {text!r} is not a string; accepted: {DEVICES_FORM}")
    if text.strip().lower() == "auto":
        return DeviceList(auto=True)
    parts = [p.strip() for p in text.split(",")]
    entries = tuple(DeviceEntry(*_parse_entry(p, context=text)) for p in parts)
    weights = [e.weight is not None for e in entries]
    if any(weights) and not all(weights):
        unweighted = [p for p, w in zip(parts, weights) if not w]
        raise ValueError(
            f"devices {text.strip()!r}: {unweighted[0]!r} has no weight while others do; "
            f"give every device a weight or none; accepted: {DEVICES_FORM}"
        )
    return DeviceList(auto=False, entries=entries)


def _parse_entry(part: str, context: str) -> tuple[str, float | None]:
    """One ``cpu[:W]`` / ``cuda:N[:W]`` part -> (device, weight)."""
    bits = [b.strip() for b in part.strip().lower().split(":")]
    bad = ValueError(f"devices {context.strip()!r}: {part.strip()!r} is not a device; accepted: {DEVICES_FORM}")
    if bits[0] == "cpu" and len(bits) <= 2:
        return "cpu", _parse_weight(bits[1], part, context) if len(bits) == 2 else None
    if bits[0] != "cuda" or len(bits) not in (2, 3) or not (bits[1].isascii() and bits[1].isdigit()):
        if part.strip().lower() == "auto":
            raise ValueError(f"devices {context.strip()!r}: 'auto' cannot be mixed with a device list; accepted: {DEVICES_FORM}")
        raise bad
    device = f"cuda:{int(bits[1])}"
    return device, _parse_weight(bits[2], part, context) if len(bits) == 3 else None


def _parse_weight(text: str, part: str, context: str) -> float:
    try:
        weight = float(text)
    except ValueError:
        weight = math.nan
    if not math.isfinite(weight) or weight <= 0:
        raise ValueError(
            f"devices {context.strip()!r}: weight {text!r} in {part.strip()!r} must be a positive number; "
            f"accepted: {DEVICES_FORM}"
        )
    return weight


def check_devices_exist(devices: Iterable[str], available: Iterable[str], hidden_note: str = "") -> None:
    """Raise ValueError for the first device not in ``available`` (e.g. ``inventory.names``).

    ``hidden_note``: the inventory's line on GPUs the driver has but this process cannot use
    (``Inventory.hidden_note``: ComfyUI on Windows shows one GPU unless started with
    ``--cuda-device all``); appended to the error, since it is then the reason and names the fix."""
    existing = tuple(available)
    for device in devices:
        if device not in existing:
            gpus = [d for d in existing if d.startswith("cuda:")]
            has = ", ".join(existing) if existing else "nothing"
            fix = (
                f"use one of {', '.join(gpus)} or 'cpu', or 'auto'"
                if gpus
                else "no GPU is visible to torch here: use 'cpu' or 'auto' (check the driver and CUDA_VISIBLE_DEVICES)"
            )
            hidden = f" {hidden_note.removeprefix('[ShardDiT] ')}" if hidden_note else ""
            raise ValueError(f"device {device!r} does not exist; this machine has {has}; {fix}.{hidden}")


MEMBER_NAME_FORM = "1 to 32 ASCII letters, digits, '.', '_' or '-', starting with a letter or digit (e.g. box2)"
MEMBER_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,31}")
"""The one pattern of a worker's NAME (``parallel/distributed/entries.check_member`` reads members with
it): no separator of the devices string (``,`` ``/`` ``:``), no space, nothing a shell or a log
line could misread, no leading ``-`` or ``.``."""


def check_member_name(name, what: str = "worker name") -> str:
    """A worker's ``NAME`` (the part before ``/`` in ``NAME/DEVICE``): ``name`` if it matches
    ``MEMBER_NAME_FORM``, else ValueError naming ``what``, the value and the form. The one rule for
    every place a name enters: ``worker --name``, the cluster's members, the nodes' ``devices``."""
    if not isinstance(name, str) or not MEMBER_NAME_RE.fullmatch(name):
        raise ValueError(f"{what} {name!r} is not {MEMBER_NAME_FORM}")
    return name


def split_worker_devices(text: str) -> tuple[str, tuple[tuple[str, str], ...]]:
    """``"cpu,w1/cpu"`` -> (``"cpu"``, ((``"w1"``, ``"cpu"``),)): the host's own devices (as a device
    string) and the workers' (name, device), in order. No worker entry: (text, ())."""
    if not isinstance(text, str) or "/" not in text:
        return text, ()
    local, remote = [], []
    for part in (p.strip() for p in text.split(",")):
        if "/" not in part:
            local.append(part)
            continue
        name, _, dev = part.partition("/")
        try:
            name = check_member_name(name)
        except ValueError:
            raise ValueError(f"devices {text.strip()!r}: {part!r} is not NAME/DEVICE (NAME: {MEMBER_NAME_FORM}; "
                             "e.g. 'box2/cuda:0')") from None
        device, weight = _parse_entry(dev, context=text)
        if weight is not None:
            raise ValueError(f"devices {text.strip()!r}: {part!r}: worker devices take no weight (every rank "
                             "computes every block in sequence mode)")
        remote.append((name, device))
    _check_members_once(text, remote)
    if not local:
        raise ValueError(f"devices {text.strip()!r} lists only worker devices; add at least one device of this "
                         "machine (the host is rank 0), e.g. 'cpu," + text.strip() + "'")
    return ",".join(local), tuple(remote)


def _check_members_once(text: str, remote) -> None:
    """A worker serves each device as one rank (member ``NAME/DEVICE``): listed twice, it cannot run.
    Checked before the other rules so that the fix they suggest is one that runs."""
    members = [f"{name}/{dev}" for name, dev in remote]
    for member in dict.fromkeys(members):
        if members.count(member) > 1:
            raise ValueError(f"devices {text.strip()!r} lists the worker device {member!r} {members.count(member)} "
                             "times: a worker serves each of its devices as one rank; list it once (for more ranks "
                             "on that machine, start its worker with --devices cuda:0,cuda:1 and list "
                             "NAME/cuda:0,NAME/cuda:1)")


def with_worker_shares(local: str, n_workers: int) -> str:
    """The device list the host plans when ``n_workers`` worker ranks join its own ``local`` ones:
    one ``cpu`` entry per worker after the local entries. A worker's share of the blocks stays in
    this machine's RAM, where ComfyUI patches it (LoRA, casts) before it is sent; the worker keeps
    it. Every rank gets an equal share (sequence mode: every rank computes every block; ownership
    only decides who stores and sends it); local weights, if given, stay, and each worker gets
    their mean."""
    if not n_workers:
        return local
    parsed = parse_devices(local)
    if parsed.auto:
        raise ValueError("[ShardDiT] devices 'auto' with worker devices: resolve this machine's devices first")
    weights = [e.weight if e.weight is not None else 1.0 for e in parsed.entries]
    worker_weight = sum(weights) / len(weights)
    parts = [f"{e.device}:{w:g}" for e, w in zip(parsed.entries, weights, strict=True)]
    return ",".join(parts + [f"cpu:{worker_weight:g}"] * n_workers)
