"""The per-session torch.distributed group of the host (rank 0) and its rank actors.

Its rendezvous never touches a store a stranger can name: the host opens a fresh libuv TCPStore on
a port the OS picks, on the address the members reach it by only, puts every key under a random 128-bit prefix, hands both to the actors over
Ray only (an authenticated RPC), and closes the store as soon as the group is formed. Every wait
(the store's, gloo's connect, the actors' replies) is bounded by ``timeout_s``
(``SHARDDIT_DIST_TIMEOUT``). The group is torch's default group of each process: one session at a
time (``session.RaySession``).
"""
from __future__ import annotations

import datetime
import secrets
import socket
import time

import torch.distributed as dist

from ..distributed.host_side import reset_after_failed_init
from .rank_server import session_subgroups
from .settings import ClusterError

__all__ = ["SessionGroup", "failed_calls", "form_group", "open_store"]


def open_store(host: str, timeout_s: float):
    """A fresh libuv TCPStore server listening on ``host`` only (TCPStore alone listens on every
    interface), on a port the OS picks, and a random key prefix."""
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.bind((host, 0))
        sock.listen(128)
        port = sock.getsockname()[1]
    except BaseException:
        sock.close()
        raise
    server = dist.TCPStore(host, port, None, True, datetime.timedelta(seconds=timeout_s), wait_for_workers=False,
                           use_libuv=True, master_listen_fd=sock.detach())  # the store owns the socket now
    return server, f"sharddit/{secrets.token_hex(16)}/"


class SessionGroup:
    """The formed group: ``ranks`` maps each member ``NAME/DEVICE`` to its rank (the host is 0);
    ``subgroups`` each exchange group by its rank tuple, ``weight_groups`` each weight group."""

    def __init__(self, actors: dict[str, object]):
        self.ranks = {key: r + 1 for r, key in enumerate(actors)}
        self.world = len(actors) + 1
        self.subgroups: dict[tuple, object] = {}
        self.weight_groups: dict[str, object] = {}


def form_group(ray, actors: dict[str, object], host: str, timeout_s: float, backend: str,
               group_keys) -> SessionGroup:
    """Form a sampling session's group of the host (rank 0) and ``actors`` (``{member: handle}``,
    ranks 1..n in that order): gloo, each member joining through its rank server
    (``rank_server.RankServer.join``), then the session's subgroups on ``backend``
    (``rank_server.session_subgroups``: the exchange groups ``group_keys``, then the weight groups;
    ``new_group`` meets through the same store, so every one is made here, before it closes).
    ``host`` is this machine's address the members can reach. ClusterError naming the members that
    did not join within ``timeout_s``; the store is closed either way."""
    if dist.is_initialized():
        raise ClusterError("[ShardDiT] a distributed session is already open in this process (torch.distributed's "
                           "default group): close it before forming another")
    group = SessionGroup(actors)
    timeout = datetime.timedelta(seconds=timeout_s)
    server, prefix = open_store(host, timeout_s)
    group.store_host, group.store_port = host, server.port  # closed once formed (tests connect to check)
    start = time.monotonic()
    keys = [tuple(g) for g in group_keys]
    try:
        refs = {a.join_session.remote(host, server.port, prefix, group.ranks[k], group.world, timeout_s, backend,
                                      keys): k for k, a in actors.items()}
        client = dist.TCPStore(host, server.port, None, False, timeout, use_libuv=True)
        try:
            dist.init_process_group("gloo", store=dist.PrefixStore(prefix, client), rank=0, world_size=group.world,
                                    timeout=timeout)
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
        reset_after_failed_init()  # also a failed init's group count: the next session's groups must match
        raise
    finally:
        del server  # the rendezvous store stops listening: the group is formed, or failed
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
