"""The ComfyUI host as a Ray driver: connect, list members ``NAME/DEVICE``, start and watch ranks.

Membership is Ray's: a member is a live Ray node labelled ``sharddit/name=NAME`` that holds the
resource ``sharddit/NAME/DEVICE`` (``settings.member_resource``); Ray authenticated it with the
cluster's token before it could register. Health is Ray's too: a rank actor on a dead node fails
its next call, which ``check_alive`` turns into an error naming the member, within the timeout.
"""
from __future__ import annotations

import logging
import os
import sys
from dataclasses import dataclass

from ..distributed.config import HostUnreachable, HostUnresolved, parse_addr, wait_for_port
from . import rank_actor, rendezvous
from .group import failed_calls
from .settings import (NAME_LABEL, RAY_ADDRESS_ENV, ClusterError, check_auth, import_ray, member_resource,
                       parse_member_resource)

__all__ = ["Member", "check_alive", "connect", "list_members", "members_from_nodes", "probe_free", "start_board",
           "start_rank"]

log = logging.getLogger(__name__)
NAMESPACE = "sharddit"


@dataclass(frozen=True)
class Member:
    """One device of one Ray node: ``name/device`` in devices strings."""
    name: str
    device: str
    node_id: str
    address: str

    @property
    def key(self) -> str:
        return f"{self.name}/{self.device}"


def connect(address: str, timeout_s: float):
    """Join the Ray cluster at ``address`` (``auto`` or ``HOST:PORT``) as a driver, once per
    process; returns ``ray``. Refuses without token auth (``settings.check_auth``); a cluster that
    does not answer, or refuses this token, is a ClusterError within about ``timeout_s``."""
    check_auth("the ComfyUI host (a Ray driver)")
    ray = import_ray()
    if ray.is_initialized():
        return ray
    if address != "auto":  # Ray's own wait for a port where nothing listens is ~40 s a try, 3 tries
        host, port = parse_addr(address, RAY_ADDRESS_ENV)
        try:
            wait_for_port(host, port, timeout_s, say=log.info)
        except (HostUnreachable, HostUnresolved) as err:
            raise ClusterError(f"{err}: is `ray start --head --port {port}` running there? ({RAY_ADDRESS_ENV}="
                               f"{address!r})") from None
    # Ray retries its first GCS call once a second, 20 times by default: bound it by our timeout.
    os.environ.setdefault("RAY_gcs_server_port_wait_time_s", str(max(1, int(timeout_s))))
    try:
        ray.init(address=address, namespace=NAMESPACE, logging_level=logging.WARNING, log_to_driver=True)
    except (ConnectionError, RuntimeError) as err:
        raise ClusterError(f"cannot join the Ray cluster at {address!r} ({err}): is `ray start --head` "
                           "running there, and does this process hold the cluster's token (RAY_AUTH_TOKEN, "
                           "RAY_AUTH_TOKEN_PATH or ~/.ray/auth_token)?") from None
    return ray


def members_from_nodes(nodes: list[dict]) -> dict[str, Member]:
    """``ray.nodes()`` -> ``{"box2/cuda:0": Member, ...}`` from live nodes only. A node counts
    only the resources under its own label's name; two live nodes with one name is an error."""
    members: dict[str, Member] = {}
    owner: dict[str, str] = {}
    for node in nodes:
        name = (node.get("Labels") or {}).get(NAME_LABEL)
        if not node.get("Alive") or not name:
            continue
        node_id = node["NodeID"]
        if name in owner and owner[name] != node_id:
            raise ClusterError(f"two Ray nodes call themselves {name!r} ({owner[name][:12]} and "
                               f"{node_id[:12]}): stop one, or start it again with another --name")
        owner[name] = node_id
        for resource in node.get("Resources") or {}:
            parsed = parse_member_resource(resource)
            if parsed and parsed[0] == name:
                member = Member(name, parsed[1], node_id, node.get("NodeManagerAddress", ""))
                members[member.key] = member
    return dict(sorted(members.items()))


def list_members(ray) -> dict[str, Member]:
    """The cluster's members now (``members_from_nodes`` over ``ray.nodes()``)."""
    return members_from_nodes(ray.nodes())


def rank_actor_class(ray):
    """``RankWorker`` as a Ray actor class, its module shipped by value (worker nodes cannot import the pack)."""
    ray.cloudpickle.register_pickle_by_value(sys.modules[rank_actor.__name__])
    return ray.remote(rank_actor.RankWorker)


def start_rank(ray, member: Member, timeout_s: float):
    """Start the rank actor of ``member`` on its node, holding the member's resource (so one actor
    per member; a cuda member's actor uses that very GPU, ``node.py``); returns the handle once the
    actor answers, ClusterError naming the member after ``timeout_s``."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    options = {"scheduling_strategy": NodeAffinitySchedulingStrategy(member.node_id, soft=False),
               "resources": {member_resource(member.name, member.device): 1}, "num_cpus": 0, "num_gpus": 0,
               "max_restarts": 0}
    actor = rank_actor_class(ray).options(**options).remote(member.key, member.device)
    try:
        where = ray.get(actor.where.remote(), timeout=timeout_s)
    except Exception as err:  # GetTimeoutError, ActorDiedError, a node that left: all end the same way
        ray.kill(actor)
        raise ClusterError(f"member {member.key} did not start its rank within {timeout_s:g} s "
                           f"({type(err).__name__}: {str(err)[:200]}); see `ray status` for its node "
                           f"{member.node_id[:12]}") from None
    log.info("[ShardDiT] member %s: rank actor pid %s on %s", member.key, where["pid"], where["host"])
    return actor


def start_board(ray, timeout_s: float):
    """Start the sessions' rendezvous actor (``rendezvous.RendezvousBoard``, its module shipped by
    value) on this process's own Ray node; the handle once it answers, ClusterError after ``timeout_s``.
    Every key of a session's rendezvous lives in it: no port of ours listens for it."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    ray.cloudpickle.register_pickle_by_value(sys.modules[rendezvous.__name__])
    node_id = ray.get_runtime_context().get_node_id()
    board = ray.remote(rendezvous.RendezvousBoard).options(
        scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False), num_cpus=0, max_restarts=0).remote()
    try:
        ray.get(board.ping.remote(), timeout=timeout_s)
    except Exception as err:  # noqa: BLE001 - GetTimeoutError, or the actor died: both end the same way
        ray.kill(board)
        raise ClusterError(f"the sessions' rendezvous actor did not start on this machine's Ray node "
                           f"within {timeout_s:g} s ({type(err).__name__}: {str(err)[:200]}): see `ray status`") from None
    return board


def check_alive(ray, ranks: dict[str, object], timeout_s: float) -> None:
    """Every rank actor in ``{member: handle}`` answers within ``timeout_s``; otherwise ClusterError
    naming the members that did not (dead node, dead actor, or silent)."""
    lost = failed_calls(ray, {actor.ping.remote(): key for key, actor in ranks.items()}, timeout_s)
    if lost:
        raise ClusterError("lost " + "; ".join(f"member {k} ({why})" for k, why in sorted(lost.items()))
                           + ": Ray reports its node or actor gone (see `ray status`); the next prompt runs on the "
                           "members left")


def probe_free(ray, timeout_s: float) -> dict[str, dict]:
    """``{member: {"device", "free"}}`` of the cluster's members now (``list_members``), read by one
    small Ray task per member on its node (no rank actor: a running host's actors hold the members'
    resources); ClusterError naming the members that did not answer within ``timeout_s``."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    members = list_members(ray)
    ray.cloudpickle.register_pickle_by_value(sys.modules[rank_actor.__name__])
    task = ray.remote(rank_actor.free_bytes)
    refs = {task.options(scheduling_strategy=NodeAffinitySchedulingStrategy(m.node_id, soft=False), num_cpus=0,
                         max_retries=0).remote(m.device): key for key, m in members.items()}
    lost = failed_calls(ray, refs, timeout_s)
    if lost:
        raise ClusterError("; ".join(f"member {k} did not report its free memory ({why})"
                                     for k, why in sorted(lost.items())) + ": see `ray status`")
    return {refs[r]: {"device": members[refs[r]].device, "free": int(ray.get(r, timeout=0))} for r in refs}
