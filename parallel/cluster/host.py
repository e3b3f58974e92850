"""The ComfyUI host's side of the cluster: members, their rank actors, one session at a time.

``cluster_host()`` is None unless ``SHARDDIT_RAY_ADDRESS`` is set (then Ray is imported, once, on
first use). A member's rank actor starts on first use and stays for later sessions (weights it
received stay with it); a member found dead is dropped, named in the error, and the next session
runs on the members left. Call these from the prompt's thread, never from ComfyUI's web-server
thread: connecting and forming a group wait (each wait bounded by ``SHARDDIT_DIST_TIMEOUT``).

This is the seam for the sampling engine (``parallel/distributed/ranks.DistRanks`` takes a session
today from the lobby's ``host.HostSession``); it is not wired there yet.
"""
from __future__ import annotations

import threading

from ..distributed.config import dist_timeout
from .driver import Member, check_alive, connect, list_members, start_rank
from .group import SessionGroup, form_group
from .settings import ClusterError, ray_address

__all__ = ["ClusterHost", "cluster_host"]

_lock = threading.Lock()
_host: ClusterHost | None = None


class ClusterHost:
    """The host as a Ray driver of the cluster at ``address``."""

    def __init__(self, address: str, timeout_s: float):
        self.address, self.timeout_s = address, timeout_s
        self.ray = connect(address, timeout_s)
        self.ranks: dict[str, object] = {}
        """Member ``NAME/DEVICE`` -> its rank actor, started on first use."""

    def members(self) -> dict[str, Member]:
        return list_members(self.ray)

    def rank(self, key: str):
        """The rank actor of member ``key``, started on its node the first time."""
        if key not in self.ranks:
            members = self.members()
            if key not in members:
                known = ", ".join(members) or "none"
                raise ClusterError(f"[ShardDiT] no member {key!r} in the Ray cluster at {self.address} (members: "
                                   f"{known}); start `python <pack-dir> worker --ray --join ... --name NAME --devices "
                                   "...` on that machine, or remove it from devices")
            self.ranks[key] = start_rank(self.ray, members[key], self.timeout_s)
        return self.ranks[key]

    def open_session(self, keys: list[str], backend: str = "gloo", subgroups: tuple = ()) -> SessionGroup:
        """The session group of the host (rank 0) and members ``keys`` (ranks 1.. in that order).
        ClusterError naming the members lost (dead node or actor, or silent); they are dropped, so
        the next session starts them again if they came back, or runs without them."""
        actors = {key: self.rank(key) for key in keys}
        try:
            check_alive(self.ray, actors, self.timeout_s)
            return form_group(self.ray, actors, self.ray.util.get_node_ip_address(), self.timeout_s, backend,
                              subgroups)
        except ClusterError:
            self._drop_silent(actors)
            raise

    def _drop_silent(self, actors: dict[str, object]) -> None:
        """Forget (and kill) each actor that does not answer a ping now."""
        refs = {actor.ping.remote(): key for key, actor in actors.items()}
        ready, _ = self.ray.wait(list(refs), num_returns=len(refs), timeout=min(self.timeout_s, 5.0))
        alive = set()
        for ref in ready:
            try:
                self.ray.get(ref, timeout=0)
                alive.add(refs[ref])
            except Exception:  # the actor or its node is gone: nothing to keep
                pass
        for key in set(actors) - alive:
            try:
                self.ray.kill(self.ranks.pop(key, actors[key]))
            except Exception:  # already gone with its node
                pass


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
