"""What the host and its workers write to the lobby store, and how each entry is read (pure).

The lobby is a ``torch.distributed.TCPStore``: anyone who reaches ``SHARDDIT_DIST_ADDR`` can read,
write and delete any key (PyTorch's SECURITY.md: c10d has no authorization). So every entry is
signed with the shared secret (``secret.sign``), every read is bounded and never blocks, and an
entry that does not verify or parse is skipped, not waited on:

- ``lobby`` (host): ``{"protocol", "versions"}`` signed under the lobby id, a random id per host
  process. A worker checks it before it registers: a wrong secret or protocol is refused there,
  with a message saying so, before the worker joins anything.
- ``reg/0`` .. ``reg/{MAX_MEMBERS - 1}`` (workers): one slot per serving process, claimed with
  ``compare_set`` (a worker never takes a slot holding another member's valid offer); the value is
  the signed offer (``OFFER_FIELDS``). The host reads exactly these slots: no counter.
- ``invite/NAME/DEVICE`` (host): the session a member joins, signed under the session id and the
  nonce of that member's offer, so an invite from an earlier session or registration is stale.

Entries are JSON ``{"kind", "session", "nonce", "body", "mac"}`` with
``mac = sign(secret, kind, session, nonce, canonical(body))``. Session ids are ``LOBBYID.N``,
counted by the host alone. Versions: ``PROTOCOL`` changes with any change of these entries or of
the control messages; a different protocol is refused naming both sides.
"""
from __future__ import annotations

import json
import os
import re
import secrets as _random
import sys

import torch

from ..placement.devices import MEMBER_NAME_FORM as NAME_FORM
from ..placement.devices import MEMBER_NAME_RE as NAME_RE
from .protocol import PROTOCOL  # one version for the lobby entries and the control messages
from .secret import sign, verify

__all__ = ["LOBBY_KEY", "MAX_ENTRY_BYTES", "MAX_FREE_BYTES", "MAX_MEMBERS", "MEMBER_FORM", "PROTOCOL", "BadEntry",
           "check_invite", "check_member", "check_offer", "choose_backend", "gpu_uuid", "invite_key", "local_versions",
           "make_entry", "make_offer", "member_key", "new_id", "open_entry", "read_key", "slot_key", "split_member"]

MAX_MEMBERS = 64
"""Registration slots the host reads: at most this many worker processes (devices) per lobby."""
MAX_ENTRY_BYTES = 8192
"""An entry longer than this is skipped unparsed (a real offer is a few hundred bytes)."""
MAX_FREE_BYTES = 2**50
"""Free memory an offer may state (1 PiB); more is refused as a lie that would skew the plan."""
MAX_CUDA_INDEX = 1023
MAX_TIMEOUT_S = 3600.0
"""Longest timeout an invitation may ask for (``distributed/config.TIMEOUT_RANGE_S``)."""
LOBBY_KEY = "lobby"
MEMBER_FORM = f"NAME/DEVICE (NAME: {NAME_FORM}; DEVICE: cpu or cuda:N)"
_DEVICE_RE = re.compile(r"cpu|cuda:(0|[1-9][0-9]{0,3})")
_ABSENT = "\x00sharddit-absent"
_TEXT_MAX = 128

OFFER_FIELDS = ("protocol", "member", "name", "device", "host", "pid", "free", "gpu_uuid", "versions")
INVITE_FIELDS = ("member", "rank", "world", "groups", "backend", "timeout_s")


class BadEntry(ValueError):
    """An entry that is not what it claims; the message says why (logged once by the reader)."""


def slot_key(i: int) -> str:
    return f"reg/{i}"


def invite_key(member: str) -> str:
    return f"invite/{member}"


def new_id() -> str:
    """A random id (lobby ids, offer nonces): 16 hex digits."""
    return _random.token_hex(8)


def check_member(member) -> str:
    """``member`` if it is exactly ``NAME/DEVICE`` (``MEMBER_FORM``), else BadEntry naming it: the
    one rule wherever a member name is read (the host's lobby, the nodes' ``devices``)."""
    if isinstance(member, str) and len(member) <= 48:
        name, slash, device = member.partition("/")
        if slash and NAME_RE.fullmatch(name) and _DEVICE_RE.fullmatch(device) and (
                not device.startswith("cuda") or int(device[5:]) <= MAX_CUDA_INDEX):
            return member
    raise BadEntry(f"{str(member)[:64]!r} is not {MEMBER_FORM}")


def read_key(store, key: str) -> bytes | None:
    """The value of ``key`` without ever waiting: ``compare_set`` with an expected value no entry
    holds sets nothing and answers the current value, or that expected value when the key is
    absent (``get`` would block for the store's timeout on a key a stranger just deleted)."""
    value = store.compare_set(key, _ABSENT, _ABSENT)
    return None if value == _ABSENT.encode() else value


def canonical(body: dict) -> str:
    return json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=True)


def make_entry(key: bytes, kind: str, session: str, nonce: str, body: dict) -> bytes:
    """A signed entry (see the module docstring), as the bytes to store."""
    mac = sign(key, kind, session, nonce, canonical(body))
    return json.dumps({"kind": kind, "session": session, "nonce": nonce, "body": body, "mac": mac}).encode()


def parse_entry(raw, kind: str) -> dict:
    """The entry's fields, checked for shape only (not the signature); BadEntry otherwise."""
    if raw is None:
        raise BadEntry("it is missing")
    if len(raw) > MAX_ENTRY_BYTES:
        raise BadEntry(f"it holds {len(raw)} bytes, more than {MAX_ENTRY_BYTES}")
    try:
        entry = json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        raise BadEntry("it is not a signed ShardDiT entry (an older ShardDiT, protocol 1, or not ShardDiT)") from None
    if not isinstance(entry, dict) or entry.get("kind") != kind or not isinstance(entry.get("body"), dict):
        raise BadEntry(f"it is not a signed {kind} (an older ShardDiT, protocol 1, or not ShardDiT)")
    if not all(isinstance(entry.get(k), str) and len(entry[k]) <= _TEXT_MAX for k in ("session", "nonce", "mac")):
        raise BadEntry("its session, nonce or signature is not a short string")
    return entry


def open_entry(key: bytes, raw, kind: str, session: str | None = None) -> dict:
    """The verified entry ``{"session", "nonce", "body"}`` (signed with ``key``, of ``kind``, and of
    ``session`` when given); BadEntry saying why not."""
    entry = parse_entry(raw, kind)
    if session is not None and entry["session"] != session:
        raise BadEntry(f"it belongs to another lobby or session ({entry['session']!r}, not {session!r})")
    if not verify(key, entry["mac"], kind, entry["session"], entry["nonce"], canonical(entry["body"])):
        raise BadEntry("its signature does not verify: it was made with another secret, or altered")
    return entry


def _text(value, what: str, limit: int = _TEXT_MAX) -> str:
    if not isinstance(value, str) or len(value) > limit or not value.isprintable():
        raise BadEntry(f"its {what} is not a short printable text")
    return value


def _count(value, what: str, low: int, high: int) -> int:
    if type(value) is not int or not low <= value <= high:
        raise BadEntry(f"its {what} {str(value)[:32]} is not a whole number from {low} to {high}")
    return value


def check_offer(body: dict) -> dict:
    """A worker's offer checked field by field (bounded); BadEntry naming the field. A different
    protocol is named with both sides' numbers."""
    if body.get("protocol") != PROTOCOL:
        raise BadEntry(f"it speaks ShardDiT protocol {str(body.get('protocol'))[:16]}, this host {PROTOCOL}: "
                       "run the same ShardDiT version on the host and the workers")
    member = check_member(body.get("member"))
    if member != f"{body.get('name')}/{body.get('device')}":
        raise BadEntry(f"its member {member!r} does not match its name and device")
    _text(body.get("host"), "host name", 255)
    _count(body.get("pid"), "pid", 0, 2**31)
    _count(body.get("free"), "free memory (bytes)", 0, MAX_FREE_BYTES)
    _text(body.get("gpu_uuid"), "GPU UUID", 64)
    versions = body.get("versions")
    if not isinstance(versions, dict) or set(versions) != {"sharddit", "torch", "comfyui"}:
        raise BadEntry("its versions are not {sharddit, torch, comfyui}")
    for k, v in versions.items():
        _text(v, f"{k} version", 64)
    return {k: body[k] for k in OFFER_FIELDS}


def check_invite(entry: dict, lobby: str, nonce: str, member: str) -> dict:
    """A verified invitation's fields for ``member`` (registered with offer ``nonce`` in ``lobby``),
    checked field by field; BadEntry naming what is wrong. Adds ``id`` (the session id) and ``n``
    (the host's session count, which only grows)."""
    head, dot, count = entry["session"].rpartition(".")
    if head != lobby or not dot or not count.isascii() or not count.isdigit() or len(count) > 12:
        raise BadEntry(f"it is for another lobby or session ({entry['session']!r}; this lobby: {lobby!r})")
    if entry["nonce"] != nonce:
        raise BadEntry("it answers an earlier registration of this member")
    body = entry["body"]
    if body.get("member") != member:
        raise BadEntry(f"it invites {str(body.get('member'))[:64]!r}, not {member!r}")
    world = _count(body.get("world"), "world size", 2, MAX_MEMBERS + 1)
    rank = _count(body.get("rank"), "rank", 1, world - 1)
    groups = body.get("groups")
    if not isinstance(groups, list) or len(groups) > MAX_MEMBERS or not all(
            isinstance(g, list) and 0 < len(g) <= world and all(type(r) is int and 0 <= r < world for r in g)
            for g in groups):
        raise BadEntry(f"its groups are not lists of ranks below {world}")
    if body.get("backend") not in ("gloo", "nccl"):
        raise BadEntry(f"its backend {str(body.get('backend'))[:16]!r} is not gloo or nccl")
    timeout = body.get("timeout_s")
    if not isinstance(timeout, (int, float)) or not 1 <= timeout <= MAX_TIMEOUT_S:
        raise BadEntry(f"its timeout {str(timeout)[:16]} is not 1 to {MAX_TIMEOUT_S:g} s")
    return {"id": entry["session"], "sid": int(count), "n": int(count), "rank": rank, "world": world,
            "groups": groups, "backend": body["backend"], "timeout_s": float(timeout)}


def local_versions(comfyui: str = "") -> dict[str, str]:
    """This process's versions for offers and the lobby entry: ShardDiT (the pack's ``__version__``,
    read from its already imported root package), torch, and ``comfyui`` as the caller knows it
    (``parallel`` imports no ComfyUI; '' outside one)."""
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


def this_host() -> str:
    import socket
    return socket.gethostname()[:255] or "unknown"


def make_offer(name: str, device: str, free: int, comfyui: str = "") -> dict:
    """The body of one serving process's offer (``OFFER_FIELDS``)."""
    return {"protocol": PROTOCOL, "member": f"{name}/{device}", "name": name, "device": str(device),
            "host": this_host(), "pid": os.getpid(), "free": int(min(max(free, 0), MAX_FREE_BYTES)),
            "gpu_uuid": gpu_uuid(device), "versions": local_versions(comfyui)}


def choose_backend(local: dict[str, str], offers: dict[str, dict]) -> tuple[str, str]:
    """(backend, why) of a session: ``nccl`` when every rank is a CUDA device, each on its own
    physical GPU; else ``gloo``. ``local``: the host's devices -> GPU UUID ('' unknown);
    ``offers``: member -> offer (its ``device`` and ``gpu_uuid``). NCCL refuses two ranks on one
    GPU ("Duplicate GPU detected"), as when a worker serves the host's own GPU: that session runs
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
                            "the worker another GPU for NCCL")
        seen.setdefault(uuid, who)
    return "nccl", "every rank is a CUDA device of its own"


def member_key(name: str, device: str) -> str:
    """The lobby key of one serving process: ``NAME/DEVICE`` (``box2/cuda:1``), as devices strings name it."""
    return f"{name}/{device}"


def split_member(member: str) -> tuple[str, str]:
    """``"box2/cuda:1"`` -> (``"box2"``, ``"cuda:1"``)."""
    name, _, device = member.partition("/")
    return name, device
