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
``NAME/cpu`` or ``NAME/cuda:N`` (``cuda:0,cuda:1,box2/cuda:0``): a plan's ``members``, kept apart
from the host's own ``entries``.

``parse_device_plan`` is the one parser of a ``devices`` input: the node and CLI entry points call it
once, and everything downstream (placement, sharding, sequence shares, VAE decode, the plan) takes
the ``DevicePlan`` it returns, never a string it parses again.
"""
from __future__ import annotations

import math
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from ..errors import InputError

__all__ = [
    "DEVICES_FORM",
    "DEVICE_FORM",
    "DeviceEntry",
    "DevicePlan",
    "MEMBER_NAME_FORM",
    "MEMBER_NAME_RE",
    "check_devices_exist",
    "check_member_name",
    "parse_component_device",
    "parse_device",
    "parse_device_plan",
    "split_members",
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
class DevicePlan:
    """A parsed ``devices`` input (``parse_device_plan``), checked once: this machine's devices
    (``auto`` or ``entries``) and the workers' (``members``)."""

    auto: bool
    """True for ``auto``: the planner picks this machine's devices."""
    entries: tuple[DeviceEntry, ...] = ()
    """This machine's devices in order (empty when ``auto``); repeats allowed."""
    members: tuple[tuple[str, str], ...] = ()
    """Devices of workers on other machines, ((NAME, DEVICE), ...) in order, each listed once."""
    text: str = field(default="", compare=False)
    """The input as given (messages and cache keys quote it); built from the fields when empty."""
    local: str = field(default="", compare=False)
    """This machine's part of ``text`` (``text`` without the worker entries)."""

    def __post_init__(self) -> None:
        host = "auto" if self.auto else ",".join(_entry_text(e) for e in self.entries)
        if not self.local:
            object.__setattr__(self, "local", self.text if self.text and not self.members else host)
        if not self.text:
            object.__setattr__(self, "text", ",".join([self.local, *(f"{n}/{d}" for n, d in self.members)]))

    @classmethod
    def of_devices(cls, devices) -> DevicePlan:
        """The plan of canonical device names already chosen (a planner's choice): no parsing."""
        return cls(auto=False, entries=tuple(DeviceEntry(d) for d in devices))

    @property
    def weighted(self) -> bool:
        """True when the user gave explicit weights."""
        return any(e.weight is not None for e in self.entries)

    @property
    def unique_devices(self) -> tuple[str, ...]:
        """Distinct devices in first-seen order."""
        return tuple(dict.fromkeys(e.device for e in self.entries))

    def with_members(self, members) -> DevicePlan:
        """This plan with the workers' ``members`` ((NAME, DEVICE), ...) after its own ones (``auto``
        resolved to this machine's choice plus every joined member)."""
        members = tuple(members)
        return DevicePlan(self.auto, self.entries, self.members + members, local=self.local,
                          text=",".join([self.text, *(f"{n}/{d}" for n, d in members)]))

    def with_worker_shares(self, n_workers: int | None = None) -> DevicePlan:
        """The device plan the host places when its worker ranks join its own ones: one ``cpu``
        entry per worker after the local entries. A worker's share of the blocks stays in this
        machine's RAM, where ComfyUI patches it (LoRA, casts) before it is sent; the worker keeps
        it. Every rank gets an equal share (sequence mode: every rank computes every block;
        ownership only decides who stores and sends it); local weights, if given, stay, and each
        worker gets their mean. No worker: this machine's part alone. ``n_workers``: how many
        worker ranks when they are not this plan's ``members`` (the dry run's)."""
        n_workers = len(self.members) if n_workers is None else n_workers
        if not n_workers:
            return DevicePlan(self.auto, self.entries, text=self.local)
        if self.auto:
            raise InputError("devices 'auto' with worker devices: resolve this machine's devices first")
        weights = [e.weight if e.weight is not None else 1.0 for e in self.entries]
        worker_weight = sum(weights) / len(weights)
        entries = [DeviceEntry(e.device, w) for e, w in zip(self.entries, weights, strict=True)]
        return DevicePlan(False, tuple(entries + [DeviceEntry("cpu", worker_weight)] * n_workers))


def _entry_text(entry: DeviceEntry) -> str:
    return entry.device if entry.weight is None else f"{entry.device}:{entry.weight:g}"


def parse_device(text: str) -> str:
    """``"cpu"`` / ``"cuda:N"`` (any case, spaces ignored) -> canonical name; ValueError otherwise."""
    device, weight = _parse_entry(text, context=text)
    if weight is not None:
        raise InputError(f"device {text.strip()!r} has a weight; expected 'cpu' or 'cuda:N'")
    return device


def parse_component_device(text: str) -> str:
    """Device of a single component: ``"auto"``, ``"cpu"`` or ``"cuda:N"``."""
    if not isinstance(text, str):
        raise InputError(f"device {text!r} is not a string; accepted: {DEVICE_FORM}")
    if text.strip().lower() == "auto":
        return "auto"
    try:
        return parse_device(text)
    except ValueError:
        raise InputError(f"device {text.strip()!r} is not valid; accepted: {DEVICE_FORM}") from None


def parse_device_plan(text: str, workers: bool = True) -> DevicePlan:
    """THE parser of a ``devices`` input (see module docstring): the workers' ``NAME/DEVICE`` entries
    first (each listed once, at least one device of this machine), then this machine's part.
    ``workers=False`` (a text encoder's device list): no worker entry, a ``/`` is not a device.
    Malformed -> ValueError quoting the part."""
    if not isinstance(text, str):
        raise InputError(f"devices {text!r} is not a string; accepted: {DEVICES_FORM}")
    local, members = split_members(text) if workers else (text, ())
    host = _parse_local(local)
    return DevicePlan(host.auto, host.entries, members, text=text, local=local)


def _parse_local(text: str) -> DevicePlan:
    """This machine's part of a ``devices`` input: ``auto`` or a (weighted) device list."""
    if text.strip().lower() == "auto":
        return DevicePlan(auto=True)
    parts = [p.strip() for p in text.split(",")]
    entries = tuple(DeviceEntry(*_parse_entry(p, context=text)) for p in parts)
    weights = [e.weight is not None for e in entries]
    if any(weights) and not all(weights):
        unweighted = [p for p, w in zip(parts, weights) if not w]
        raise InputError(
            f"devices {text.strip()!r}: {unweighted[0]!r} has no weight while others do; "
            f"give every device a weight or none; accepted: {DEVICES_FORM}"
        )
    return DevicePlan(auto=False, entries=entries)


def _parse_entry(part: str, context: str) -> tuple[str, float | None]:
    """One ``cpu[:W]`` / ``cuda:N[:W]`` part -> (device, weight)."""
    bits = [b.strip() for b in part.strip().lower().split(":")]
    bad = InputError(f"devices {context.strip()!r}: {part.strip()!r} is not a device; accepted: {DEVICES_FORM}")
    if bits[0] == "cpu" and len(bits) <= 2:
        return "cpu", _parse_weight(bits[1], part, context) if len(bits) == 2 else None
    if bits[0] != "cuda" or len(bits) not in (2, 3) or not (bits[1].isascii() and bits[1].isdigit()):
        if part.strip().lower() == "auto":
            raise InputError(f"devices {context.strip()!r}: 'auto' cannot be mixed with a device list; accepted: {DEVICES_FORM}")
        raise bad
    device = f"cuda:{int(bits[1])}"
    return device, _parse_weight(bits[2], part, context) if len(bits) == 3 else None


def _parse_weight(text: str, part: str, context: str) -> float:
    try:
        weight = float(text)
    except ValueError:
        weight = math.nan
    if not math.isfinite(weight) or weight <= 0:
        raise InputError(
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
            hidden = f" {hidden_note}" if hidden_note else ""
            raise InputError(f"device {device!r} does not exist; this machine has {has}; {fix}.{hidden}")


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
        raise InputError(f"{what} {name!r} is not {MEMBER_NAME_FORM}")
    return name


def split_members(text: str) -> tuple[str, tuple[tuple[str, str], ...]]:
    """``"cpu,w1/cpu"`` -> (``"cpu"``, ((``"w1"``, ``"cpu"``),)): the host's own part of the text
    and the workers' (name, device), in order, checked. No worker entry: (text, ()).
    ``parse_device_plan``'s first half; called alone only where the host's part is not a device
    list (the plan CLI's ``--devices`` spec with sizes, ``cost.workers.split_worker_spec``)."""
    if "/" not in text:
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
            raise InputError(f"devices {text.strip()!r}: {part!r} is not NAME/DEVICE (NAME: {MEMBER_NAME_FORM}; "
                             "e.g. 'box2/cuda:0')") from None
        device, weight = _parse_entry(dev, context=text)
        if weight is not None:
            raise InputError(f"devices {text.strip()!r}: {part!r}: worker devices take no weight (every rank "
                             "computes every block in sequence mode)")
        remote.append((name, device))
    _check_members_once(text, remote)
    if not local:
        raise InputError(f"devices {text.strip()!r} lists only worker devices; add at least one device of this "
                         "machine (the host is rank 0), e.g. 'cpu," + text.strip() + "'")
    return ",".join(local), tuple(remote)


def _check_members_once(text: str, remote) -> None:
    """A worker serves each device as one rank (member ``NAME/DEVICE``): listed twice, it cannot run.
    Checked before the other rules so that the fix they suggest is one that runs."""
    members = [f"{name}/{dev}" for name, dev in remote]
    for member in dict.fromkeys(members):
        if members.count(member) > 1:
            raise InputError(f"devices {text.strip()!r} lists the worker device {member!r} {members.count(member)} "
                             "times: a worker serves each of its devices as one rank; list it once (for more ranks "
                             "on that machine, start its worker with --devices cuda:0,cuda:1 and list "
                             "NAME/cuda:0,NAME/cuda:1)")
