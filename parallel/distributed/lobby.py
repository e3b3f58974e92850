"""The host's lobby: where workers register and are invited (pure PyTorch).

A ``torch.distributed.TCPStore`` served on the one address the user chose (``SHARDDIT_DIST_ADDR``;
the listening socket is bound here, so nothing listens on other interfaces). It opens only with
the shared secret (``distributed/secret.py``). The store has no authorization, so the host
trusts nothing in it that it did not write or that does not verify (``distributed/entries.py``):

- it reads only the ``MAX_MEMBERS`` registration slots, each with one non-blocking call; an entry
  that is missing, too long, unsigned, signed with another secret, of another protocol or of a bad
  member name is skipped and logged once, never waited on;
- it never ``add``s to a key: session ids are its own count, so a stranger's ``set("sessions",
  b"abc")`` or a counter raised by millions changes nothing here;
- its reads go through its own store client, rebuilt once when its connection drops (torch
  closes a client's connection after a bad request).
"""
from __future__ import annotations

import datetime
import json
import logging
import socket

import torch.distributed as dist

from .connect import join_address
from .entries import (
    LOBBY_KEY,
    MAX_MEMBERS,
    MEMBER_FORM,
    PROTOCOL,
    BadEntry,
    check_member,
    check_offer,
    invite_key,
    local_versions,
    make_entry,
    new_id,
    open_entry,
    read_key,
    slot_key,
    split_member,
)
from .host import HostSession
from .secret import HOW_TO_MAKE, dist_secret
from ..units import format_gib

__all__ = ["MEMBER_FORM", "READ_TIMEOUT_S", "Lobby", "describe_workers", "lobby_id", "read_workers",
           "require_secret"]

log = logging.getLogger("sharddit")

READ_TIMEOUT_S = 5.0
"""Timeout of the host's own store client (its reads never wait for a key; this bounds a stuck
connection)."""


def require_secret(key: bytes | None = None, what: str = "the host's lobby") -> bytes:
    """``key``, or the secret from the environment; ValueError saying how to make one when there is none."""
    key = key if key is not None else dist_secret()
    if not key:
        raise ValueError(f"[ShardDiT] {what} needs a shared secret, and none is set: {HOW_TO_MAKE}. Without it "
                         "anyone who reaches the address could join as a worker")
    return key


_LOGGED: set[str] = set()
"""Reasons already logged for skipped entries (once each per process)."""
MAX_LOGGED = 100
"""Distinct skipped entries logged per process; a stranger writing ever new ones cannot flood the log."""


def _skip_once(slot: int, reason: str) -> None:
    if reason in _LOGGED or len(_LOGGED) > MAX_LOGGED:
        return
    _LOGGED.add(reason)
    if len(_LOGGED) > MAX_LOGGED:
        log.warning("[ShardDiT] more than %d bad worker registrations: further ones are ignored without a log line "
                    "(is a stranger writing to the lobby? keep SHARDDIT_DIST_ADDR on a private network)", MAX_LOGGED)
        return
    log.warning("[ShardDiT] a worker registration (slot %d) was ignored, not enrolled: %s", slot, reason)


def lobby_id(store, key: bytes) -> str:
    """The id of the lobby behind ``store`` from its signed entry; BadEntry saying why not."""
    entry = open_entry(key, read_key(store, LOBBY_KEY), "lobby")
    if entry["body"].get("protocol") != PROTOCOL:
        raise BadEntry(f"the host speaks ShardDiT protocol {entry['body'].get('protocol')}, this side {PROTOCOL}")
    return entry["session"]


def read_workers(store, key: bytes | None = None, lobby: str | None = None) -> dict[str, dict]:
    """Verified offers in a lobby store: member ``NAME/DEVICE`` -> offer (``lobby.OFFER_FIELDS``
    plus ``nonce`` and ``slot``). Reads the ``MAX_MEMBERS`` slots only, without waiting; a bad
    entry is skipped and logged once (see the module docstring). Two slots of one member: the
    lower one counts (a worker re-registers in its own slot)."""
    key = require_secret(key, "reading the lobby")
    lobby = lobby if lobby is not None else lobby_id(store, key)
    out: dict[str, dict] = {}
    for i in range(MAX_MEMBERS):
        raw = read_key(store, slot_key(i))
        if not raw:
            continue
        try:
            entry = open_entry(key, raw, "offer", session=lobby)
            offer = check_offer(entry["body"])
        except BadEntry as e:
            _skip_once(i, f"{_who(raw)}{e}")
            continue
        out.setdefault(offer["member"], {**offer, "nonce": entry["nonce"], "slot": i})
    return dict(sorted(out.items()))


def _who(raw: bytes) -> str:
    """The member an entry claims to be, for the log (from the body when it parses)."""
    try:
        member = json.loads(raw)["body"]["member"]
        return f"{check_member(member)!r}: "
    except Exception:  # noqa: BLE001 - only for the log line
        return ""


def describe_workers(store, host: str, port: int, key: bytes | None = None, lobby: str | None = None) -> str:
    """Lines for the Plan node and ``plan --workers``: the joined workers, each device with its free memory."""
    by_name: dict[str, list[tuple[str, dict]]] = {}
    for member, offer in read_workers(store, key, lobby).items():
        by_name.setdefault(split_member(member)[0], []).append((member, offer))
    head = f"Workers at {host}:{port} (devices NAME/DEVICE, parallel=sequence):"
    if not by_name:
        return head + " none joined yet"
    lines = [head]
    for name, members in sorted(by_name.items()):
        devs = ", ".join(f"{m} {format_gib(o['free'])} GiB free" for m, o in sorted(members))
        hosts = sorted({o["host"] for _, o in members})
        lines.append(f"  {name} on {', '.join(hosts)}: {devs}")
    return "\n".join(lines)


class Lobby:
    """Where workers join (one per ComfyUI process, made on first use)."""

    def __init__(self, host: str, port: int, timeout_s: float, key: bytes | None = None, comfyui: str = ""):
        self.key = require_secret(key)
        self.host, self.port, self.timeout_s = host, port, float(timeout_s)
        self.id = new_id()
        """This lobby's id: offers and session ids are bound to it (a restarted host is a new lobby)."""
        self.versions = local_versions(comfyui)
        self._server = _listen(host, port, self.timeout_s)
        self._client = None
        self._count = 0
        self.session = None
        self._entry = make_entry(self.key, "lobby", self.id, self.id, {"protocol": PROTOCOL, "versions": self.versions})
        self.store.set(LOBBY_KEY, self._entry)
        self.join = join_address(host, port)
        """What workers pass to ``--join`` (this machine's address when ``host`` is a wildcard)."""
        where = f"{host}:{port}" if self.join == f"{host}:{port}" else (
            f"{host}:{port} (every interface; from other machines join this machine's reachable address, "
            f"not {host})")
        log.info("[ShardDiT] workers can join at %s (python <pack-dir> worker --join %s --name NAME "
                 "--devices DEV[,DEV...], with the same SHARDDIT_DIST_SECRET)", where, self.join)

    @property
    def store(self):
        """The host's own client of its lobby store (made again after its connection dropped)."""
        if self._client is None:
            local = {"0.0.0.0": "127.0.0.1", "::": "::1"}.get(self.host, self.host)
            self._client = dist.TCPStore(local, self.port, None, False, datetime.timedelta(seconds=READ_TIMEOUT_S),
                                         use_libuv=False)
        return self._client

    def _call(self, fn):
        """``fn(store)``, once more on a fresh client when the connection failed (a stranger's bad
        request makes torch close it)."""
        try:
            return fn(self.store)
        except (BadEntry, ValueError):
            raise
        except Exception as e:  # noqa: BLE001 - DistNetworkError, RuntimeError: the connection is gone
            log.warning("[ShardDiT] the lobby's store connection failed (%s: %s); reconnecting", type(e).__name__,
                        (str(e).splitlines() or [""])[0])
            self._client = None
            return fn(self.store)

    def workers(self) -> dict[str, dict]:
        """Verified offers of the joined members (``NAME/DEVICE`` -> offer). Writes the lobby entry
        again first if someone changed it (workers check it before they register)."""
        def read(store):
            if read_key(store, LOBBY_KEY) != self._entry:
                log.warning("[ShardDiT] the lobby's own entry was changed by another client; written again")
                store.set(LOBBY_KEY, self._entry)
            return read_workers(store, self.key, self.id)

        return self._call(read)

    def describe(self) -> str:
        return self._call(lambda store: describe_workers(store, self.host, self.port, self.key, self.id))

    def next_session(self) -> tuple[int, str]:
        """(n, id) of the next session: the host's own count (never a store counter)."""
        self._count += 1
        return self._count, f"{self.id}.{self._count}"

    def invite(self, member: str, offer: dict, sid: str, body: dict) -> None:
        """Write the signed invite of ``member`` (bound to ``sid`` and its offer's nonce)."""
        entry = make_entry(self.key, "invite", sid, offer["nonce"], {"member": member, **body})
        self._call(lambda store: store.set(invite_key(member), entry))

    def session_store(self, timeout_s: float):
        """A fresh client for one session's process group (its own connection and timeout)."""
        local = {"0.0.0.0": "127.0.0.1", "::": "::1"}.get(self.host, self.host)
        return dist.TCPStore(local, self.port, None, False, datetime.timedelta(seconds=timeout_s), use_libuv=False)

    def check_names(self, members) -> dict[str, dict]:
        """Every member (``NAME/DEVICE``) has joined: their offers; ValueError naming the joined ones
        and the command that starts the missing one."""
        joined = self.workers()
        for member in members:
            if member in joined:
                continue
            name, device = split_member(member)
            have = ", ".join(sorted(joined)) or "none yet"
            same = sorted(m for m in joined if split_member(m)[0] == name)
            start = f"python <pack-dir> worker --join {self.join} --name {name} --devices"
            if same:
                devs = ",".join([split_member(m)[1] for m in same] + [device])
                raise ValueError(f"[ShardDiT] worker {name!r} has joined {self.host}:{self.port} without device "
                                 f"{device!r} (it serves {', '.join(same)}; joined: {have}); restart it with: "
                                 f"{start} {devs}")
            raise ValueError(f"[ShardDiT] no worker named {name!r} has joined {self.host}:{self.port} with "
                             f"{member!r} (joined: {have}); start it with: {start} {device} (and this host's "
                             "SHARDDIT_DIST_SECRET)")
        return {m: joined[m] for m in members}

    def session_for(self, names: tuple[str, ...], groups: tuple[tuple[int, ...], ...], backend: str,
                    devices: dict[str, str]):
        """The open session with exactly these workers and groups, or a fresh one."""

        s = self.session
        if s is not None and (s.broken or s.idle() or s.names != names or s.group_keys != groups
                              or s.backend != backend):
            self.close_session()
        if self.session is None:
            offers = self.check_names(names)
            self.session = HostSession(self, names, groups, backend, devices, offers)
        return self.session

    def close_session(self) -> None:
        s, self.session = self.session, None
        if s is not None:
            s.close()

    def close(self) -> None:
        self.close_session()


def _listen(host: str, port: int, timeout_s: float):
    """The store's server on a socket bound to ``host:port`` only."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as e:
        sock.close()
        raise OSError(f"[ShardDiT] cannot listen for workers on {host}:{port} ({e}); choose another "
                      f"SHARDDIT_DIST_ADDR") from e
    sock.listen(128)
    fd = sock.detach()  # the store's daemon owns the socket from now on
    return dist.TCPStore(host, port, None, True, datetime.timedelta(seconds=timeout_s), wait_for_workers=False,
                         master_listen_fd=fd, use_libuv=False)

