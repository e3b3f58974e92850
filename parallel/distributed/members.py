"""Members of a distributed session: their names, devices and offers (pure).

A member is one device of one worker machine, named ``NAME/DEVICE`` (``box2/cuda:1``) in devices
strings; its rank reports an offer (``make_offer``: device, free bytes, physical GPU, versions) the
host reads to plan and to choose the backend (``choose_backend``).
"""
from __future__ import annotations

import os
import re
import socket
import sys

import torch

from ..placement.devices import MEMBER_NAME_FORM as NAME_FORM
from ..placement.devices import MEMBER_NAME_RE as NAME_RE
from .protocol import PROTOCOL

__all__ = ["MAX_FREE_BYTES", "MEMBER_FORM", "bind_device", "check_member", "choose_backend", "device_free_bytes",
           "gpu_uuid", "local_versions", "make_offer", "member_key", "normal_uuid", "split_member"]

MAX_FREE_BYTES = 2**50
"""Free memory an offer may state (1 PiB)."""
MAX_CUDA_INDEX = 1023
MEMBER_FORM = f"NAME/DEVICE (NAME: {NAME_FORM}; DEVICE: cpu or cuda:N)"
_DEVICE_RE = re.compile(r"cpu|cuda:(0|[1-9][0-9]{0,3})")


def check_member(member) -> str:
    """``member`` if it is exactly ``NAME/DEVICE`` (``MEMBER_FORM``), else ValueError naming it."""
    if isinstance(member, str) and len(member) <= 48:
        name, slash, device = member.partition("/")
        if slash and NAME_RE.fullmatch(name) and _DEVICE_RE.fullmatch(device) and (
                not device.startswith("cuda") or int(device[5:]) <= MAX_CUDA_INDEX):
            return member
    raise ValueError(f"[ShardDiT] {str(member)[:64]!r} is not {MEMBER_FORM}")


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


def device_free_bytes(device: str) -> int:
    """Free memory of ``device``: the GPU's free bytes, or the system's available RAM for ``cpu`` (0 if unknown)."""
    if str(device).startswith("cuda"):
        return int(torch.cuda.mem_get_info(torch.device(device))[0])
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError):
        return 0


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
