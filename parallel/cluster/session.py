"""A sampling session on Ray: what ``distributed.ranks.DistRanks`` needs of a session, with the
host's commands carried by Ray calls to the members' rank actors.

``send`` / ``receive`` / ``request``, ``broadcast`` / ``wait`` on the weight groups, ``groups`` for
the exchanges, the per-member ``versions`` and ``skeletons``: what the engine's remote ranks use. A command
is one ``protocol`` payload per Ray call (``rank_server.RankServer.command``); ``send`` posts it
and ``receive`` waits for its reply within ``SHARDDIT_DIST_TIMEOUT``. The reply's tensors are
checked against the caller's limit before any is made. Ray orders the calls of one caller to one
actor, so a member runs its commands in the order the host sent them.
"""
from __future__ import annotations

import datetime
import logging
import time

import torch.distributed as dist

from ..distributed.host_side import DistWorkerError, end_process_group
from ..distributed.protocol import ProtocolError, from_payload, to_payload
from .group import form_group

__all__ = ["RaySession"]

log = logging.getLogger("sharddit")
_REPLY_LIMIT = 1 << 20
"""Largest reply without a stated limit (``ok``, ``holding``: no tensors at all)."""


class RaySession:
    """The host (rank 0) and members ``names`` (``NAME/DEVICE``, ranks 1..n in that order), meeting
    through the host's rendezvous actor ``board`` (``group.form_group``)."""

    def __init__(self, ray, actors: dict[str, object], board, group_keys, backend: str, devices: dict[str, str],
                 timeout_s: float, sid: int):
        self.ray, self.names, self.group_keys, self.backend = ray, tuple(actors), tuple(group_keys), backend
        self.actors, self.devices, self.timeout_s, self.sid = actors, devices, timeout_s, sid
        self.broken = False
        self.bytes_received: dict[str, int] = {}
        self.versions: dict[str, dict[tuple, object]] = {n: {} for n in self.names}
        """Per member: (model key, block index) -> version of the weights of a block it owns."""
        self.skeletons: dict[str, set] = {n: set() for n in self.names}
        """Per member: (model key, block index) of the block skeletons it holds."""
        self._pending: dict[str, object] = {}
        self.open_files: dict[str, int] = {}
        """Open files of the host and of each member's rank when the session formed (``host.ClusterHost``)."""
        t0 = time.monotonic()
        self.group = form_group(ray, actors, board, timeout_s, backend, self.group_keys)
        self.groups, self.weight_groups = self.group.subgroups, self.group.weight_groups
        log.info("[ShardDiT] session %d open on Ray with %s in %.1f s", sid, ", ".join(self.names),
                 time.monotonic() - t0)

    def idle(self) -> bool:
        """Never: a Ray member waits for no command with a timeout of its own."""
        return False

    def forget(self, name: str, model_key: str) -> None:
        """Member ``name`` no longer holds the blocks of model ``model_key``."""
        self.versions[name] = {k: v for k, v in self.versions[name].items() if k[0] != model_key}
        self.skeletons[name] = {k for k in self.skeletons[name] if k[0] != model_key}

    def rank_of(self, name: str) -> int:
        return self.names.index(name) + 1

    def label(self, member: str) -> str:
        return f"member {member} (rank {self.rank_of(member)}, {self.devices.get(member, '?')}, on Ray)"

    def request(self, name: str, message: dict, what: str, max_bytes: int = 0):
        sent = self.send(name, message, what)
        return sent, self.receive(name, what, max_bytes)[1]

    def send(self, name: str, message: dict, what: str) -> int:
        """Post ``message`` to member ``name``; the payload's bytes."""
        if name in self._pending:
            raise DistWorkerError(f"[ShardDiT] {self.label(name)}: a command is still unanswered before {what}")
        payload = to_payload(message)
        try:
            self._pending[name] = self.actors[name].command.remote(payload)
        except Exception as e:
            raise self._failed(name, what, e) from e
        return len(payload)

    def receive(self, name: str, what: str, max_bytes: int = 0):
        """(bytes, answer): member ``name``'s reply to its last command, within the timeout; its
        tensors at most ``max_bytes`` (refused before any is made)."""
        ref = self._pending.pop(name)
        try:
            payload = self.ray.get(ref, timeout=self.timeout_s)
        except Exception as e:
            raise self._failed(name, what, e) from e
        try:
            answer, _ = from_payload(payload, max_bytes, "cpu")
        except ProtocolError as e:
            self.broken = True
            raise DistWorkerError(f"[ShardDiT] {self.label(name)} sent an invalid reply during {what}: {e}") from None
        n = len(payload)
        self.bytes_received[name] = self.bytes_received.get(name, 0) + n
        if answer["op"] == "error":
            self.broken = True
            raise DistWorkerError(f"[ShardDiT] {self.label(name)} failed during {what}: {answer['error']}")
        return n, answer

    def _failed(self, name: str, what: str, e: Exception) -> DistWorkerError:
        self.broken = True
        return DistWorkerError(f"[ShardDiT] {self.label(name)} did not answer during {what} within "
                               f"{self.timeout_s:.0f} s (its node or actor is gone, hung or unreachable; `ray status` "
                               f"shows the nodes): {type(e).__name__}: {(str(e).splitlines() or [''])[0][:200]}")

    def broadcast(self, flat, src: int, group: str):
        """Post a broadcast of ``flat`` from process ``src`` on weight group ``group``; the work."""
        return dist.broadcast(flat, src, group=self.weight_groups[group], async_op=True)

    def wait(self, work) -> None:
        work.wait(datetime.timedelta(seconds=self.timeout_s))

    def close(self) -> None:
        """Every member leaves (bounded), then the host; after a failure the host only ends its side."""
        if not self.broken:
            refs = [a.leave.remote() for a in self.actors.values()]
            self.ray.wait(refs, num_returns=len(refs), timeout=self.timeout_s)
        else:
            for a in self.actors.values():
                a.leave.remote()  # best effort: a dead member's call just fails
        end_process_group(self.broken and self.backend == "nccl")
        self.group.close()  # its rendezvous keys go
        log.info("[ShardDiT] session %d closed%s", self.sid, " (after a failure)" if self.broken else "")
