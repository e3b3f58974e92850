"""Members of a distributed session: their names, devices and offers (pure).

A member is one device of one worker machine, named ``NAME/DEVICE`` (``box2/cuda:1``) in devices
strings; its rank reports an offer (``make_offer``: device, free bytes, physical GPU, versions) the
host reads to plan, to choose the backend (``choose_backend``) and to check that the members have
room for their share of the weights (``choose_worker_weights``, ``SHARDDIT_DIST_WEIGHTS``).
"""
from __future__ import annotations

import os
import re
import socket
import sys

import torch

from ..cost.workers import compute_worker_needs
from ..placement.devices import MEMBER_NAME_FORM as NAME_FORM
from ..placement.devices import MEMBER_NAME_RE as NAME_RE
from ..units import format_gib
from .protocol import PROTOCOL
from ..errors import InputError, RunError

__all__ = ["MAX_FREE_BYTES", "MEMBER_FORM", "DistWorkerError", "bind_device", "check_member", "check_worker_room",
           "choose_backend", "choose_worker_weights", "gpu_uuid", "local_versions", "make_offer", "member_key",
           "normal_uuid", "offer_free", "split_member"]

MAX_FREE_BYTES = 2**50
"""Free memory an offer may state (1 PiB)."""
MAX_CUDA_INDEX = 1023
MEMBER_FORM = f"NAME/DEVICE (NAME: {NAME_FORM}; DEVICE: cpu or cuda:N)"
_DEVICE_RE = re.compile(r"cpu|cuda:(0|[1-9][0-9]{0,3})")


class DistWorkerError(RunError):
    """A member failed, died or stayed silent; the message names it and what it was doing."""


def check_member(member) -> str:
    """``member`` if it is exactly ``NAME/DEVICE`` (``MEMBER_FORM``), else ValueError naming it."""
    if isinstance(member, str) and len(member) <= 48:
        name, slash, device = member.partition("/")
        if slash and NAME_RE.fullmatch(name) and _DEVICE_RE.fullmatch(device) and (
                not device.startswith("cuda") or int(device[5:]) <= MAX_CUDA_INDEX):
            return member
    raise InputError(f"{str(member)[:64]!r} is not {MEMBER_FORM}")


def member_key(name: str, device: str) -> str:
    """``NAME/DEVICE`` (``box2/cuda:1``), as devices strings name a member."""
    return f"{name}/{device}"


def split_member(member: str) -> tuple[str, str]:
    """``"box2/cuda:1"`` -> (``"box2"``, ``"cuda:1"``)."""
    name, _, device = member.partition("/")
    return name, device


def local_versions(comfyui: str = "") -> dict[str, str]:
    """This process's versions for offers: ShardDiT (the pack's ``__version__``, read from its
    already imported root package), torch, and ``comfyui`` as the caller knows it ('' outside one)."""
    root = sys.modules.get(__name__.rsplit(".parallel.", 1)[0])
    return {"sharddit": str(getattr(root, "__version__", "unknown")), "torch": str(torch.__version__),
            "comfyui": comfyui or ""}


def gpu_uuid(device: str) -> str:
    """The physical GPU behind ``device`` (``cuda:N``) as torch reports it, lower case without
    NVML's ``GPU-`` prefix, so NVML's and torch's forms compare equal; '' for cpu or unknown."""
    if not str(device).startswith("cuda") or not torch.cuda.is_available():
        return ""
    try:
        uuid = str(torch.cuda.get_device_properties(torch.device(device)).uuid)
    except Exception:  # noqa: BLE001 - older torch has no uuid: the duplicate-GPU rule then cannot apply
        return ""
    return normal_uuid(uuid)


def normal_uuid(uuid: str) -> str:
    uuid = (uuid or "").strip().lower()
    return uuid.removeprefix("gpu-")


def bind_device(device: str, cuda=None) -> None:
    """Make ``device`` this process's current CUDA device before anything touches CUDA (ComfyUI's
    import, the free-memory reading, NCCL): else every rank makes a context on cuda:0, reports
    that GPU's memory and may launch kernels there. ``cuda``: ``torch.cuda`` (tests pass a recorder)."""
    if str(device).startswith("cuda"):
        (cuda or torch.cuda).set_device(int(str(device).split(":")[1]))


def make_offer(name: str, device: str, free: int, comfyui: str = "") -> dict:
    """What a member offers: its device, free bytes, physical GPU and versions."""
    return {"protocol": PROTOCOL, "member": f"{name}/{device}", "name": name, "device": str(device),
            "host": socket.gethostname()[:255] or "unknown", "pid": os.getpid(),
            "free": int(min(max(free, 0), MAX_FREE_BYTES)), "gpu_uuid": gpu_uuid(device),
            "versions": local_versions(comfyui)}


def choose_backend(local: dict[str, str], offers: dict[str, dict]) -> tuple[str, str]:
    """(backend, why) of a session: ``nccl`` when every rank is a CUDA device, each on its own
    physical GPU; else ``gloo``. ``local``: the host's devices -> GPU UUID ('' unknown);
    ``offers``: member -> offer (its ``device`` and ``gpu_uuid``). NCCL refuses two ranks on one
    GPU ("Duplicate GPU detected"), as when a member serves the host's own GPU: that session runs
    on gloo (its tensors go through host memory), and ``why`` names the pair."""
    ranks = [(f"this machine's {d}", d, normal_uuid(u)) for d, u in local.items()]
    ranks += [(m, o.get("device", ""), normal_uuid(o.get("gpu_uuid", ""))) for m, o in sorted(offers.items())]
    if not all(str(d).startswith("cuda") for _, d, _ in ranks):
        return "gloo", "a rank is not a CUDA device"
    seen: dict[str, str] = {}
    for who, _, uuid in ranks:
        if uuid and uuid in seen:
            return "gloo", (f"{seen[uuid]} and {who} are the same physical GPU ({uuid}); NCCL refuses two ranks on "
                            "one GPU, so this session uses gloo (slower: tensors pass through host memory); give "
                            "the member another GPU for NCCL")
        seen.setdefault(uuid, who)
    return "nccl", "every rank is a CUDA device of its own"


def offer_free(offer: dict, device: str) -> int | None:
    """Free bytes a worker's offer states for ``device`` (None: not stated)."""
    if "free" in offer and offer.get("device", device) == device:
        return int(offer["free"])
    free = offer.get("devices", {}).get(device)
    return int(free) if free is not None else None


def check_worker_room(needs: dict[str, tuple[int, str]], offers: dict[str, dict], devices: dict[str, str]) -> None:
    """Every worker has room for its share: ``needs[name] = (bytes, what)``, the offers it joined
    with. ValueError naming each worker short of memory, the GiB missing and the fix; before any
    weight moves. A device whose offer states no free memory is not checked."""
    short = []
    for name, (need, what) in needs.items():
        free = offer_free(offers.get(name, {}), devices[name])
        if free and free < need:
            short.append(f"{name} ({devices[name]}): needs {format_gib(need, 2)} GiB ({what}), has "
                         f"{format_gib(free, 2)} GiB free: {format_gib(need - free, 2)} GiB missing")
    if short:
        raise InputError("not enough memory on worker devices: " + "; ".join(short)
                         + ". Add worker devices (each takes an equal share), free memory there, or use fewer "
                         "blocks per device (more devices in the devices string)")


def choose_worker_weights(mode: str, remote, ranges, block_bytes, offers: dict[str, dict]) -> tuple[bool, str]:
    """(keep_all, why): whether every worker keeps every block, for ``SHARDDIT_DIST_WEIGHTS``
    ``mode`` (``cost/workers.compute_worker_needs``: the one rule ``plan`` shows too), checked
    against the free memory the joined workers offer: ValueError naming the GiB missing per
    worker when the chosen mode does not fit."""
    workers = [(name, dev, offer_free(offers.get(name, {}), dev)) for name, dev in remote]
    keep_all, why, needs = compute_worker_needs(mode, workers, [(r.start, r.stop) for r in ranges], block_bytes)
    check_worker_room({n.name: (n.need_bytes, n.what) for n in needs}, offers, dict(remote))
    return keep_all, why
