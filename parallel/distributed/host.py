"""The host side of distributed `sequence` mode: its sessions with the workers (pure PyTorch).
The lobby that invites workers into them is ``distributed/lobby.py`` (``Lobby.session_for``).

- ``HostSession``: a process group over the host (rank 0) and the invited workers, made with
  ``init_process_group(store=PrefixStore(session id, a fresh lobby client))``: one gloo pair group per worker
  for commands (``distributed/wire`` messages), and one group per batch group that mixes host and
  worker ranks for the Ulysses exchanges (gloo on CPU, NCCL when every rank is a GPU). A session
  lives across prompts (the workers keep the blocks they were sent); any failure closes it, and
  the next prompt opens a fresh one (new store prefix), so a worker can leave and re-join while
  ComfyUI keeps running.
"""
from __future__ import annotations

import datetime
import logging
import time
from typing import Protocol, runtime_checkable

import torch.distributed as dist

from ..cost.workers import compute_worker_needs
from ..units import format_gib
from .entries import check_member as lobby_check_member
from .entries import split_member
from .protocol import ProtocolError
from .wire import Channel, host_handshake

__all__ = ["IDLE_CLOSE_S", "IDLE_TIMEOUT_S", "DistWorkerError", "HostSession", "SessionLobby", "check_member",
           "check_worker_room", "choose_worker_weights", "end_process_group", "offer_free", "reset_after_failed_init",
           "weight_groups"]

log = logging.getLogger("sharddit")

IDLE_TIMEOUT_S = 600.0
"""Timeout of the command groups: a worker waits this long for the host's next command, then
leaves the session and waits for a new invitation (a stranger holding a worker's session holds
it this long at most). The host closes a session idle for ``IDLE_CLOSE_S`` and opens a fresh one
at the next prompt, before the worker's wait ends."""
IDLE_CLOSE_S = IDLE_TIMEOUT_S / 2


def reset_after_failed_init() -> None:
    """Undo what a failed ``init_process_group`` left behind. It has already counted the default
    group, so the next session would name its groups differently from a fresh worker's and the two
    would wait for each other's keys (found by the server test: a worker killed while joining,
    then no session could open). ``destroy_process_group`` resets the count, but only once a
    group exists; torch keeps the counter in ``distributed_c10d._world`` (private)."""
    if dist.is_initialized():
        dist.destroy_process_group()
        return
    from torch.distributed import distributed_c10d

    world = getattr(distributed_c10d, "_world", None)
    if world is not None and hasattr(world, "group_count"):
        world.group_count = 0


def end_process_group(abort: bool) -> None:
    """Leave the session's process group; ``abort`` (a failed NCCL session) first aborts its
    communicators, so collectives still posted for a dead member cannot hang this process or let
    NCCL's watchdog take it down (ComfyUI keeps running)."""
    from torch.distributed import distributed_c10d

    if abort and hasattr(distributed_c10d, "_abort_process_group"):
        try:
            distributed_c10d._abort_process_group()
        except Exception as e:  # noqa: BLE001 - destroy below still resets the group
            log.warning("[ShardDiT] aborting the session's NCCL groups: %s", e)
    try:
        if dist.is_initialized():
            dist.destroy_process_group()
    except Exception as e:  # noqa: BLE001
        log.warning("[ShardDiT] closing the session's process group: %s", e)


def weight_groups(world: int, backend: str, timeout_s: float) -> dict:
    """The groups block weights travel on, made in this order on every process: ``all`` (the host
    sends a block it owns to every worker) and, with two workers or more, ``workers`` (a worker
    sends a block it owns to the others)."""
    timeout = datetime.timedelta(seconds=timeout_s)
    groups = {"all": dist.new_group(list(range(world)), backend=backend, timeout=timeout)}
    if world > 2:
        groups["workers"] = dist.new_group(list(range(1, world)), backend=backend, timeout=timeout)
    return groups


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
        raise ValueError("[ShardDiT] not enough memory on worker devices: " + "; ".join(short)
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


class DistWorkerError(RuntimeError):
    """A worker failed, died or stayed silent; the message names it and what it was doing."""


def check_member(member: str) -> str:
    """``member`` if it is ``NAME/DEVICE`` (``distributed/lobby.MEMBER_FORM``), else ValueError naming it."""
    return lobby_check_member(member)


@runtime_checkable
class SessionLobby(Protocol):
    """What a session needs of the lobby that opens it (``distributed/lobby.Lobby``; the lobby makes
    sessions, so this module does not import it)."""

    key: bytes
    timeout_s: float
    join: str

    def check_names(self, names) -> dict: ...
    def next_session(self) -> tuple: ...
    def invite(self, member: str, offer: dict, session_id: str, body: dict) -> None: ...
    def session_store(self, timeout_s: float): ...


class HostSession:
    """One process group: the host is rank 0, member ``names[i]`` (``NAME/DEVICE``) is rank ``i + 1``."""

    def __init__(self, lobby: SessionLobby, names, groups, backend: str, devices: dict[str, str],
                 offers: dict[str, dict] | None = None):
        self.lobby, self.names, self.group_keys, self.backend = lobby, tuple(names), tuple(groups), backend
        self.timeout_s = lobby.timeout_s
        self.devices = devices
        self.broken = False
        self.used = time.monotonic()
        """When the host last sent a command (``idle``)."""
        self.bytes_received: dict[str, int] = {}
        """Per worker: bytes of its replies (the rows it returns at a gather, acknowledgements)."""
        self.versions: dict[str, dict[tuple, object]] = {n: {} for n in self.names}
        """Per worker: (model key, block index) -> version of the weights of a block it owns
        (``distributed/weights.same_version`` compares them)."""
        self.skeletons: dict[str, set] = {n: set() for n in self.names}
        """Per worker: (model key, block index) of the block skeletons it holds."""
        self.secret = lobby.key  # the lobby refuses to start without one (distributed/lobby.require_secret)
        offers = offers if offers is not None else lobby.check_names(self.names)
        self.sid, self.id = lobby.next_session()
        world = len(self.names) + 1
        body = {"world": world, "groups": [list(g) for g in self.group_keys], "backend": backend,
                "timeout_s": self.timeout_s}
        for rank, member in enumerate(self.names, start=1):
            lobby.invite(member, offers[member], self.id, {**body, "rank": rank})
        t0 = time.monotonic()
        try:
            store = dist.PrefixStore(f"session/{self.id}/", lobby.session_store(self.timeout_s))
            dist.init_process_group("gloo", store=store, rank=0, world_size=world,
                                    timeout=datetime.timedelta(seconds=self.timeout_s))
        except Exception as e:  # gloo raises DistStoreError / RuntimeError on a timeout
            reset_after_failed_init()
            raise DistWorkerError(
                f"[ShardDiT] worker member(s) {', '.join(self.names)} did not join session {self.sid} "
                f"within "
                f"{self.timeout_s:.0f} s ({type(e).__name__}); is `python <pack-dir> worker --join "
                f"{lobby.join} --name NAME --devices DEVICE` running there?") from e
        self.ctl = {name: dist.new_group([0, r], backend="gloo", timeout=datetime.timedelta(seconds=IDLE_TIMEOUT_S))
                    for r, name in enumerate(self.names, start=1)}
        self.groups = {g: dist.new_group(list(g), backend=backend, timeout=datetime.timedelta(seconds=self.timeout_s))
                       for g in self.group_keys}
        self.weight_groups = weight_groups(world, backend, self.timeout_s)
        self.channels = {name: Channel(self.ctl[name], r, True, self.secret, self.timeout_s)
                         for r, name in enumerate(self.names, start=1)}
        self._handshake()
        log.info("[ShardDiT] session %d open with %s in %.1f s", self.sid, ", ".join(self.names), time.monotonic() - t0)

    def _handshake(self) -> None:
        """Each worker proves it holds the secret (and the host proves it to the worker) before
        any command; one that does not is refused, told so, and the session closes: no worker is
        ever half-joined."""
        for name in self.names:
            try:
                host_handshake(self.channels[name], self.label(name))
            except ProtocolError as e:  # no secret, another one, or garbage: refused, never half-joined
                self.broken = True
                self.close()
                raise DistWorkerError(f"{e}; session {self.sid} closed") from None
            except Exception as e:
                self.broken = True
                self.close()
                raise self._failed(name, "the secret handshake", e) from e

    def idle(self) -> bool:
        """Whether no command went out for ``IDLE_CLOSE_S``: the workers leave at ``IDLE_TIMEOUT_S``,
        so the host closes it first (``Lobby.session_for``) and opens a fresh one. Past
        ``IDLE_TIMEOUT_S`` the workers have left: marked broken, so closing tells them nothing."""
        quiet = time.monotonic() - self.used
        self.broken = self.broken or quiet > IDLE_TIMEOUT_S
        return quiet > IDLE_CLOSE_S

    def forget(self, name: str, model_key: str) -> None:
        """Worker ``name`` no longer holds the blocks of model ``model_key`` (it was told to drop
        them): the next forward of that model sends their skeletons and weights again."""
        self.versions[name] = {k: v for k, v in self.versions[name].items() if k[0] != model_key}
        self.skeletons[name] = {k for k in self.skeletons[name] if k[0] != model_key}

    def rank_of(self, name: str) -> int:
        return self.names.index(name) + 1

    def label(self, member: str) -> str:
        name, device = split_member(member)
        return f"worker {name!r} (rank {self.rank_of(member)}, {self.devices.get(member, device or '?')})"

    def request(self, name: str, message: dict, what: str, max_bytes: int = 0):
        """Send ``message`` to worker ``name`` and wait for its reply (within the timeout)."""
        sent = self.send(name, message, what)
        return sent, self.receive(name, what, max_bytes)[1]

    def send(self, name: str, message: dict, what: str) -> int:
        self.used = time.monotonic()
        try:
            return self.channels[name].send(message)
        except Exception as e:
            raise self._failed(name, what, e) from e

    def receive(self, name: str, what: str, max_bytes: int = 0):
        """(bytes, answer): worker ``name``'s reply to the last command (within the timeout); its
        tensors at most ``max_bytes`` (refused before anything is allocated)."""
        try:
            answer, n = self.channels[name].recv(max_bytes)
            self.bytes_received[name] = self.bytes_received.get(name, 0) + n
        except ProtocolError as e:
            self.broken = True
            raise DistWorkerError(f"[ShardDiT] {self.label(name)} sent an invalid reply during {what}: {e}") from None
        except Exception as e:
            raise self._failed(name, what, e) from e
        if answer["op"] == "error":
            self.broken = True
            raise DistWorkerError(f"[ShardDiT] {self.label(name)} failed during {what}: {answer['error']}")
        return n, answer

    def _failed(self, name: str, what: str, e: Exception) -> DistWorkerError:
        self.broken = True
        return DistWorkerError(f"[ShardDiT] {self.label(name)} did not answer during {what} within "
                               f"{self.timeout_s:.0f} s (dead, hung or unreachable): {type(e).__name__}: "
                               f"{(str(e).splitlines() or [''])[0]}")

    def broadcast(self, flat, src: int, group: str):
        """Post a broadcast of ``flat`` from process ``src`` on weight group ``group``; the work."""
        return dist.broadcast(flat, src, group=self.weight_groups[group], async_op=True)

    def wait(self, work) -> None:
        work.wait(datetime.timedelta(seconds=self.timeout_s))

    def close(self) -> None:
        if not self.broken:
            for name in self.names:
                try:
                    self.channels[name].send({"op": "leave"})
                except Exception as e:  # noqa: BLE001 - best effort: it is leaving anyway
                    log.debug("[ShardDiT] %s did not get 'leave': %s", self.label(name), e)
        end_process_group(self.broken and self.backend == "nccl")
        log.debug("[ShardDiT] session %d: process group ended", self.sid)
        log.info("[ShardDiT] session %d closed%s", self.sid, " (after a failure)" if self.broken else "")
