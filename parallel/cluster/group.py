"""The per-session torch.distributed group of the host (rank 0) and its rank actors.

Its rendezvous never touches a port of ours: every key lives in the host's rendezvous actor on Ray
(``rendezvous.RendezvousBoard``, on the host's own node), in a fresh space per session, and every
process reaches it through a ``store.RayStore``, over Ray's token-authenticated calls only. The
space stays open while the session lives (NCCL's communicators meet through it at their first
collective) and is dropped when the session closes or fails to form. Every wait (the store's,
gloo's connect, the actors' replies) is bounded by ``timeout_s`` (``SHARDDIT_DIST_TIMEOUT``). The
group is torch's default group of each process: one session at a time (``session.RaySession``).
The only listening sockets a session adds are gloo's own (NCCL's, on GPUs), in the host and in each
member's rank actor.
"""
from __future__ import annotations

import datetime
import secrets
import time

import torch.distributed as dist

from ..distributed.host_side import reset_after_failed_init
from .rank_server import session_subgroups
from .settings import ClusterError
from .store import RayStore

__all__ = ["SessionGroup", "failed_calls", "form_group"]


class SessionGroup:
    """The formed group: ``ranks`` maps each member ``NAME/DEVICE`` to its rank (the host is 0);
    ``subgroups`` each exchange group by its rank tuple, ``weight_groups`` each weight group;
    ``board`` and ``space``: where its rendezvous keys live (``close`` drops them)."""

    def __init__(self, actors: dict[str, object], board, space: str):
        self.ranks = {key: r + 1 for r, key in enumerate(actors)}
        self.world = len(actors) + 1
        self.subgroups: dict[tuple, object] = {}
        self.weight_groups: dict[str, object] = {}
        self.board, self.space = board, space
        self.store = None
        """This process's ``store.RayStore`` of the session, held while it lives (c10d keeps a
        reference to its C++ side only: were the Python object freed, every later call of the
        groups' stores, NCCL's first connect included, would fail as "Not implemented")."""

    def close(self) -> None:
        """Drop the session's rendezvous space (not waited for: the board refuses it from now on)."""
        try:
            self.board.close.remote(self.space)
        except Exception:  # noqa: BLE001, S110 - the board went with its node: nothing is left to drop
            pass


def form_group(ray, actors: dict[str, object], board, timeout_s: float, backend: str, group_keys) -> SessionGroup:
    """Form a sampling session's group of the host (rank 0) and ``actors`` (``{member: handle}``,
    ranks 1..n in that order): gloo, each member joining through its rank server
    (``rank_server.RankServer.join``), then the session's subgroups on ``backend``
    (``rank_server.session_subgroups``: the exchange groups ``group_keys``, then the weight groups),
    all meeting through a fresh space of ``board`` (the host's ``rendezvous.RendezvousBoard``).
    ClusterError naming the members that did not join within ``timeout_s`` (the space is dropped)."""
    if dist.is_initialized():
        raise ClusterError("[ShardDiT] a distributed session is already open in this process (torch.distributed's "
                           "default group): close it before forming another")
    space = secrets.token_hex(16)  # one session's keys apart from the last one's (late writes are refused)
    group = SessionGroup(actors, board, space)
    timeout = datetime.timedelta(seconds=timeout_s)
    start = time.monotonic()
    keys = [tuple(g) for g in group_keys]
    try:
        try:
            ray.get(board.open.remote(space), timeout=timeout_s)
        except Exception as err:  # noqa: BLE001 - the board's node is gone, or it is silent
            raise ClusterError(f"[ShardDiT] the sessions' rendezvous actor did not answer within {timeout_s:g} s "
                               f"({type(err).__name__}): see `ray status`; the next prompt starts a new one") from None
        refs = {a.join_session.remote(board, space, group.ranks[k], group.world, timeout_s, backend, keys): k
                for k, a in actors.items()}
        try:
            group.store = RayStore(ray, board, space, timeout_s)  # held: torch keeps only its C++ half
            dist.init_process_group("gloo", store=group.store, rank=0, world_size=group.world, timeout=timeout)
            made = [dist.new_group(list(g), backend=backend, timeout=timeout)
                    for g in session_subgroups(group.world, keys)]
            group.subgroups = dict(zip(keys, made))
            group.weight_groups = {"all": made[len(keys)]}
            if group.world > 2:
                group.weight_groups["workers"] = made[len(keys) + 1]
        except Exception as err:  # DistStoreError on timeout, or gloo's own
            # the members had the same timeout and started first: their answers are in, or never come
            _raise_missing(ray, refs, min(timeout_s, 2.0), f"{type(err).__name__}: {str(err).splitlines()[0][:200]}")
        left = max(1.0, timeout_s - (time.monotonic() - start))
        _raise_missing(ray, refs, left, None)
    except BaseException:
        group.close()
        reset_after_failed_init()  # also a failed init's group count: the next session's groups must match
        raise
    return group


def failed_calls(ray, refs: dict, wait_s: float) -> dict:
    """``{key: why}`` for each Ray call in ``{ref: key}`` that raised or did not return within
    ``wait_s`` (one wait for all); {} when every one answered."""
    ready, silent = ray.wait(list(refs), num_returns=len(refs), timeout=wait_s)
    failed = {refs[r]: f"no answer within {wait_s:g} s" for r in silent}
    for ref in ready:
        try:
            ray.get(ref, timeout=0)
        except Exception as err:
            failed[refs[ref]] = f"{type(err).__name__}: {str(err).splitlines()[0][:200]}"
    return failed


def _raise_missing(ray, refs: dict, wait_s: float, host_error: str | None) -> None:
    """ClusterError naming each member whose ``join`` failed or did not return within ``wait_s``
    (and the host's own error, when it had one); nothing when all joined and the host did."""
    problems = failed_calls(ray, refs, wait_s)
    if problems or host_error:
        said = "; ".join(f"member {k}: {why}" for k, why in sorted(problems.items())) or "every member joined"
        host = f"; the host: {host_error}" if host_error else ""
        raise ClusterError(f"[ShardDiT] the session's process group did not form ({said}{host}); the next prompt "
                           "runs on the members left (`ray status` shows which nodes are alive)")
