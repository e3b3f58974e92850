"""The ComfyUI host's side of the cluster: members, their rank actors, one session at a time.

``cluster_host()`` is None unless ``SHARDDIT_RAY_ADDRESS`` is set (then Ray is imported on first
use). The rendezvous actor and each member's rank actor start on first use and stay (weights a
member received stay with it); a member found dead is dropped, named in the error, and the next
session runs on the members left. Call from the prompt's thread, never ComfyUI's web-server
thread: connecting and forming a group wait (each bounded by ``SHARDDIT_DIST_TIMEOUT``). It is the
engine's session source (``distributed.ranks.DistRanks``): ``session_for`` keeps one session open
across prompts while its members and groups stay the same.
"""
from __future__ import annotations

import logging
import os
import threading

from ..distributed.config import dist_timeout
from ..distributed.members import local_versions
from ..units import format_gib
from .driver import Member, check_alive, connect, list_members, start_board, start_rank
from .group import RaySession, failed_calls
from .settings import ClusterError, raise_fd_limit, ray_address

__all__ = ["STRAY_FILES", "ClusterHost", "cluster_host", "describe_members", "open_files"]

log = logging.getLogger("sharddit")
STRAY_FILES = 256
"""Open files a session's process may gain while the session lives before the host forms the
session again (``ClusterHost._stray_connections``); a session itself opens a handful."""

_lock = threading.Lock()
_host: ClusterHost | None = None


class ClusterHost:
    """The host as a Ray driver of the cluster at ``address``."""

    def __init__(self, address: str, timeout_s: float):
        self.address, self.timeout_s = address, timeout_s
        raise_fd_limit()  # a stranger's held connections to gloo's ports must not exhaust ComfyUI
        self.ray = connect(address, timeout_s)
        self.ranks: dict[str, object] = {}
        """Member ``NAME/DEVICE`` -> its rank actor, started on first use."""
        self.session: RaySession | None = None
        self.versions = local_versions()
        self._count = 0
        self._board = None
        """The sessions' rendezvous actor on this machine's Ray node (``rendezvous.RendezvousBoard``)."""

    def members(self) -> dict[str, Member]:
        return list_members(self.ray)

    def board(self):
        """The sessions' rendezvous actor, started the first time and again when it no longer answers."""
        if self._board is not None and failed_calls(self.ray, {self._board.ping.remote(): "board"},
                                                    min(self.timeout_s, 5.0)):
            try:
                self.ray.kill(self._board)
            except Exception:  # noqa: BLE001, S110 - gone with its node
                pass
            self._board = None
        if self._board is None:
            self._board = start_board(self.ray, self.timeout_s)
        return self._board

    def rank(self, key: str):
        """The rank actor of member ``key``, started on its node the first time."""
        if key not in self.ranks:
            members = self.members()
            if key not in members:
                known = ", ".join(members) or "none"
                raise ClusterError(f"no member {key!r} in the Ray cluster at {self.address} (members: "
                                   f"{known}); start `python <pack-dir> worker --ray --join ... --name NAME --devices "
                                   "...` on that machine, or remove it from devices")
            self.ranks[key] = start_rank(self.ray, members[key], self.timeout_s)
        return self.ranks[key]

    # ---- the sampling engine's session source (``distributed.ranks.DistRanks``) -----------------------
    def check_names(self, members) -> dict[str, dict]:
        """The offers of ``members`` (each started if needed); ClusterError naming a missing or lost one."""
        actors = {m: self.rank(m) for m in members}
        refs = {a.offer.remote(): m for m, a in actors.items()}
        lost = failed_calls(self.ray, refs, self.timeout_s)
        if lost:
            self._drop_silent({m: actors[m] for m in lost})
            raise ClusterError("; ".join(f"member {m} did not answer ({why})" for m, why in
                                         sorted(lost.items())) + ": see `ray status`")
        return {refs[r]: self.ray.get(r, timeout=0) for r in refs}

    def describe(self) -> str:
        """Lines for the Plan node: the members and their free memory (every member's offer now)."""
        return describe_members(self.address, self.check_names(list(self.members())))

    def session_for(self, names: tuple[str, ...], groups: tuple, backend: str, devices: dict[str, str]) -> RaySession:
        """The open session with exactly these members and groups, or a fresh one (a broken or
        different one is closed first)."""
        s = self.session
        if s is not None and (s.broken or s.names != tuple(names) or s.group_keys != tuple(groups)
                              or s.backend != backend):
            self.close_session()
        elif s is not None:
            stray = self._stray_connections(s)
            if stray:
                log.warning("[ShardDiT] session %d: gloo holds %s connections nobody of the session opened (a "
                            "stranger at its ports?); forming the session again to close them (its members' "
                            "weights are sent again)", s.sid, stray)
                self.close_session()
        if self.session is None:
            actors = {key: self.rank(key) for key in names}
            self._count += 1
            try:
                check_alive(self.ray, actors, self.timeout_s)
                self.session = RaySession(self.ray, actors, self.board(), groups, backend, devices, self.timeout_s,
                                          self._count)
                self.session.open_files = self._open_files(self.session)
            except ClusterError:
                self._drop_silent(actors)
                raise
        return self.session

    def _open_files(self, s: RaySession) -> dict[str, int]:
        """Open files of this process and of each member's rank actor now (-1 where unknown)."""
        refs = {s.actors[m].open_files.remote(): m for m in s.names}
        ready, _ = self.ray.wait(list(refs), num_returns=len(refs), timeout=min(self.timeout_s, 5.0))
        counts = {m: -1 for m in s.names}
        for ref in ready:
            try:
                counts[refs[ref]] = int(self.ray.get(ref, timeout=0))
            except Exception:  # noqa: BLE001, S110 - a lost member: check_alive names it
                pass
        return {"the host": open_files(), **counts}

    def _stray_connections(self, s: RaySession) -> str:
        """Where the open session's processes hold ``STRAY_FILES`` or more open files more than when
        it formed ("the host 1100, member box2/cpu 1100"), or "". Gloo keeps every connection made to
        its listeners open until its process group ends, a stranger's too, even once the stranger
        has closed it: forming the session again is what closes them."""
        then, now = getattr(s, "open_files", {}), self._open_files(s)
        grown = {k: now[k] - then[k] for k in now if then.get(k, -1) >= 0 and now[k] >= 0}
        return ", ".join(f"{k if k == 'the host' else 'member ' + k} {n}" for k, n in grown.items()
                         if n >= STRAY_FILES)

    def close_session(self) -> None:
        """Close the open session; after a failure, forget the members whose actors died (the next
        session starts them again on their nodes, or names the member if its node is gone)."""
        s, self.session = self.session, None
        if s is not None:
            s.close()
            if s.broken:
                self._drop_silent(s.actors)

    def _drop_silent(self, actors: dict[str, object]) -> None:
        """Forget (and kill) each actor that does not answer a ping now."""
        lost = failed_calls(self.ray, {actor.ping.remote(): key for key, actor in actors.items()},
                            min(self.timeout_s, 5.0))
        for key in lost:
            try:
                self.ray.kill(self.ranks.pop(key, actors[key]))
            except Exception:  # already gone with its node
                pass


def open_files() -> int:
    """This process's open files (-1 where ``/proc`` does not list them)."""
    try:
        return len(os.listdir("/proc/self/fd"))
    except OSError:
        return -1


def describe_members(address: str, offers: dict[str, dict]) -> str:
    """Lines for the Plan node and ``plan --workers``: the members and their free memory."""
    head = f"Ray members at {address} (devices NAME/DEVICE, parallel=sequence):"
    if not offers:
        return head + " none yet; on each machine run `python <pack-dir> worker --ray --join ... --name NAME`"
    return "\n".join([head] + [f"  {m}: {format_gib(o.get('free', 0))} GiB free" for m, o in offers.items()])


def cluster_host() -> ClusterHost | None:
    """The process's ClusterHost, made on first call; None when ``SHARDDIT_RAY_ADDRESS`` is unset."""
    global _host
    address = ray_address()
    if address is None:
        return None
    with _lock:
        if _host is None or _host.address != address:
            _host = ClusterHost(address, dist_timeout())
        return _host
