"""A worker's way into the host's lobby, and nothing more (pure PyTorch; ``distributed/worker`` serves).

``check_lobby`` reads the host's signed lobby entry before anything is registered: a secret that
is not the host's, or another protocol, is a ``WorkerRefused`` that says so. ``LobbyMember``
signs its offer into a registration slot (never one holding another member's valid offer),
writes it again when a stranger overwrote it, and takes only invitations signed with the secret,
bound to its offer's nonce and newer than the last one taken. ``bind_device`` makes the worker's
device current before anything touches CUDA.
"""
from __future__ import annotations

import logging
import math
import os
import time

import torch

from ..placement.devices import check_member_name
from .connect import connect_store
from .entries import member_key
from .lobby import MAX_LOGGED, lobby_id, require_secret
from . import entries as lobby_entries
from .entries import check_invite

__all__ = ["LOBBY_WAIT_S", "SLOT_CHECK_S", "LobbyMember", "WorkerRefused", "bind_device", "check_lobby", "connect",
           "device_free_bytes", "make_offer"]

log = logging.getLogger("sharddit")


def connect(host: str, port: int, timeout_s: float, wait_s: float = math.inf, say=print):
    """A client of the host's lobby store (``distributed/connect.connect_store``): the name resolved
    first, progress said within seconds, waiting up to ``wait_s``."""
    return connect_store(host, port, timeout_s, wait_s, say,
                         hint=f"is ComfyUI running there with SHARDDIT_DIST_ADDR={host}:{port}?")


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
    import, the free-memory reading, NCCL): else every worker process makes a context on cuda:0,
    reports that GPU's memory and may launch kernels there. ``cuda``: ``torch.cuda`` (tests pass a
    recorder)."""
    if str(device).startswith("cuda"):
        (cuda or torch.cuda).set_device(int(str(device).split(":")[1]))


def make_offer(name: str, device: str, overrides: dict | None = None, comfyui: str = "") -> dict:
    """What one serving process registers (``distributed/entries.OFFER_FIELDS``); ``overrides``
    (tests, a stated ``free``) replace measured fields."""
    overrides = dict(overrides or {})
    free = overrides.pop("free") if "free" in overrides else device_free_bytes(device)
    return {**lobby_entries.make_offer(name, str(device), free, comfyui), **overrides}


class WorkerRefused(ValueError):
    """The host's lobby refuses this worker (wrong or missing secret, another protocol): the
    message says which and the fix; the worker stops without joining anything."""


LOBBY_WAIT_S = 5.0
"""How long a worker waits for the host's signed lobby entry once the port answers."""
SLOT_CHECK_S = 1.0
"""How often a waiting worker checks that its registration is still in the lobby."""


def check_lobby(store, key: bytes, member: str, where: str = "the host") -> str:
    """The host's lobby id from its signed entry (waiting up to ``LOBBY_WAIT_S`` for it);
    WorkerRefused saying why ``member`` may not join: no ShardDiT lobby there, another protocol, or
    a secret that is not the host's."""
    deadline = time.monotonic() + LOBBY_WAIT_S
    while (raw := lobby_entries.read_key(store, lobby_entries.LOBBY_KEY)) is None and time.monotonic() < deadline:
        time.sleep(0.2)
    if raw is None:
        raise WorkerRefused(f"[ShardDiT] worker {member!r}: {where} has no signed ShardDiT lobby: it runs an older "
                            "ShardDiT (protocol 1) or is not a ShardDiT host; run the same ShardDiT version there "
                            f"(this worker speaks protocol {lobby_entries.PROTOCOL})")
    try:
        return lobby_id(store, key)
    except lobby_entries.BadEntry as e:
        why = str(e)
        if "signature" in why:
            why = ("this worker's SHARDDIT_DIST_SECRET is not the host's (the host's signed lobby entry does not "
                   "verify with it); give the worker the same secret as the host")
        raise WorkerRefused(f"[ShardDiT] worker {member!r} refused by {where}: {why}") from None


class LobbyMember:
    """A worker process's place in the host's lobby: its checked host, its signed registration,
    the invitations it takes (``distributed/entries.py`` for the entries)."""

    def __init__(self, store, name: str, device, offer: dict | None = None, say=print, key: bytes | None = None,
                 where: str = "the host", comfyui: str = ""):
        self.store, self.name, self.device, self.say = store, check_member_name(name), torch.device(device), say
        self.member = member_key(name, str(device))
        self.key = require_secret(key, f"worker {self.member!r}")
        self.where = where
        self._said: set[str] = set()
        self.lobby = check_lobby(store, self.key, self.member, where)
        self.offer = make_offer(name, str(device), offer, comfyui)
        self.nonce = lobby_entries.new_id()
        self.entry = lobby_entries.make_entry(self.key, "offer", self.lobby, self.nonce, self.offer)
        self.seen = 0  # the host's session count of the last invitation taken
        self.reg = self._claim()

    def _slot_state(self, raw) -> str:
        """``mine``, ``same`` (a valid offer of this member: an earlier run), ``other`` (another
        member's valid offer: never taken) or ``free`` (empty, unsigned, stale or foreign)."""
        if raw == self.entry:
            return "mine"
        try:
            entry = lobby_entries.open_entry(self.key, raw, "offer", session=self.lobby)
            member = lobby_entries.check_offer(entry["body"])["member"]
        except lobby_entries.BadEntry:
            return "free"
        return "same" if member == self.member else "other"

    def _claim(self) -> int:
        """A registration slot for this offer: this member's earlier one, else the first slot that
        holds no other member's valid offer (``compare_set``: two workers never take one slot)."""
        for _ in range(3):
            slots = [(i, lobby_entries.read_key(self.store, lobby_entries.slot_key(i)))
                     for i in range(lobby_entries.MAX_MEMBERS)]
            states = [(self._slot_state(raw), i, raw) for i, raw in slots]
            order = {"mine": 0, "same": 1, "free": 2}
            for state, i, raw in sorted((s for s in states if s[0] in order), key=lambda s: (order[s[0]], s[1])):
                got = self.store.compare_set(lobby_entries.slot_key(i), raw or "", self.entry)
                if got == self.entry:
                    return i
        raise WorkerRefused(f"[ShardDiT] worker {self.member!r}: {self.where}'s lobby is full (its "
                            f"{lobby_entries.MAX_MEMBERS} registration slots hold other members' offers)")

    def leave_lobby(self) -> None:
        """Take this registration out of the lobby (a clean stop), so ``devices=auto`` no longer lists it."""
        try:
            self.store.compare_set(lobby_entries.slot_key(self.reg), self.entry, "")
        except Exception as e:  # noqa: BLE001 - the host may be gone already
            log.debug("[ShardDiT] worker %r: could not leave the lobby: %s", self.member, e)

    def _say_once(self, text: str) -> None:
        """Say ``text`` once; at most ``MAX_LOGGED`` distinct lines (a stranger's invitations cannot flood the log)."""
        if text not in self._said and len(self._said) < MAX_LOGGED:
            self._said.add(text)
            self.say(text)

    def take_invite(self) -> dict | None:
        """The verified, fresh invitation to this member, or None (none yet; a forged, stale or
        altered one is ignored and said once)."""
        raw = lobby_entries.read_key(self.store, lobby_entries.invite_key(self.member))
        if raw is None:
            return None
        try:
            entry = lobby_entries.open_entry(self.key, raw, "invite")
            invite = check_invite(entry, self.lobby, self.nonce, self.member)
        except lobby_entries.BadEntry as e:
            self._say_once(f"[ShardDiT] worker {self.member!r}: ignored an invitation: {e}")
            return None
        if invite["n"] <= self.seen:
            return None  # taken already (or from before this registration)
        self.seen = invite["n"]
        return invite

    def check_slot(self) -> None:
        """Register again when the registration was overwritten (a stranger, or the lobby's own
        reset); WorkerRefused when another process registered as this member since."""
        raw = lobby_entries.read_key(self.store, lobby_entries.slot_key(self.reg))
        state = self._slot_state(raw)
        if state == "mine":
            return
        if state == "same":
            raise WorkerRefused(f"[ShardDiT] worker {self.member!r}: another worker process registered as "
                                f"{self.member!r} at {self.where}; this one stops")
        self.say(f"[ShardDiT] worker {self.member!r}: its registration was overwritten in the lobby; registering again")
        self.reg = self._claim()

    def wait_invite(self, poll_s: float = 0.2) -> dict:
        next_check = time.monotonic() + SLOT_CHECK_S
        while True:
            invite = self.take_invite()
            if invite is not None:
                return invite
            if time.monotonic() >= next_check:
                self.check_slot()
                next_check = time.monotonic() + SLOT_CHECK_S
            time.sleep(poll_s)
