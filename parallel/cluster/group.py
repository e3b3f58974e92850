"""A sampling session on Ray: its torch.distributed group, the store it meets through, its commands.

Rendezvous never touches a port of ours: every key lives in the host's rendezvous actor
(``rendezvous.RendezvousBoard``) in a fresh space per session, reached through a ``RayStore`` over
Ray's token-authenticated calls only. The space stays open while the session lives (NCCL's
communicators meet through it at their first collective) and goes when it closes or fails to form.
Every wait is bounded by ``timeout_s`` (``SHARDDIT_DIST_TIMEOUT``). The group is torch's default
group of each process: one session at a time; the only listening sockets it adds are gloo's (NCCL's).

``RaySession`` is what ``distributed.ranks.DistRanks`` needs of a session: a command is one
``protocol`` payload per Ray call to a member's rank actor, its reply checked against the caller's
limit before any tensor is made. Ray orders one caller's calls to one actor, so a member runs its
commands in the order the host sent them.
"""
from __future__ import annotations

import datetime
import logging
import secrets
import time

import torch.distributed as dist

from ..distributed.members import DistWorkerError
from ..distributed.protocol import ProtocolError, from_payload, to_payload
from .settings import ClusterError

__all__ = ["RaySession", "RayStore", "SessionGroup", "end_process_group", "failed_calls", "form_group",
           "reset_after_failed_init", "session_subgroups"]

log = logging.getLogger("sharddit")

_CALL_SLACK_S = 5.0
"""How much longer than the board's own wait a caller waits for the board's answer."""


class RayStore(dist.Store):
    """The session's store in one process: every call goes to ``board`` (a ``RendezvousBoard``
    handle) under ``space``; a blocking ``get`` / ``wait`` waits at most ``timeout_s``."""

    def __init__(self, ray, board, space: str, timeout_s: float):
        super().__init__()
        self.ray, self.board, self.space, self.timeout_s = ray, board, space, float(timeout_s)
        self.set_timeout(datetime.timedelta(seconds=self.timeout_s))

    def _call(self, method: str, *args, waits_s: float = 0.0):
        ref = getattr(self.board, method).remote(self.space, *args)
        try:
            return self.ray.get(ref, timeout=waits_s + _CALL_SLACK_S)
        except Exception as err:  # noqa: BLE001 - GetTimeoutError, the board gone (its node), a closed space
            raise dist.DistStoreError(f"[ShardDiT] the session's rendezvous on Ray failed in {method} "
                                      f"({type(err).__name__}: {(str(err).splitlines() or [''])[-1][:200]})") from None

    def _wait_s(self, timeout) -> float:
        if timeout is None:
            return self.timeout_s
        seconds = timeout.total_seconds() if isinstance(timeout, datetime.timedelta) else float(timeout)
        return self.timeout_s if seconds <= 0 else min(seconds, self.timeout_s)

    def set(self, key: str, value) -> None:
        self._call("set", key, bytes(value))

    def get(self, key: str) -> bytes:
        value = self._call("get", key, self.timeout_s, waits_s=self.timeout_s)
        if value is None:
            raise dist.DistStoreError(f"[ShardDiT] the session's rendezvous: key {key!r} was not set within "
                                      f"{self.timeout_s:g} s (a member did not join)")
        return value

    def add(self, key: str, amount: int) -> int:
        return self._call("add", key, int(amount))

    def compare_set(self, key: str, expected, desired) -> bytes:
        return self._call("compare_set", key, bytes(expected), bytes(desired))

    def wait(self, keys, timeout=None) -> None:
        wait_s = self._wait_s(timeout)
        if not self._call("wait", list(keys), wait_s, waits_s=wait_s):
            raise dist.DistStoreError(f"[ShardDiT] the session's rendezvous: keys {list(keys)!r} were not set "
                                      f"within {wait_s:g} s (a member did not join)")

    def check(self, keys) -> bool:
        return self._call("check", list(keys))

    def delete_key(self, key: str) -> bool:
        return self._call("delete_key", key)

    def num_keys(self) -> int:
        return self._call("num_keys")


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


def session_subgroups(world: int, group_keys) -> list[tuple]:
    """The subgroups of a session, in the order every process makes them: the exchange groups
    (``group_keys``), then the weight groups ``all`` and, with two members or more, ``workers``."""
    return [tuple(g) for g in group_keys] + [tuple(range(world))] + ([tuple(range(1, world))] if world > 2 else [])


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
        """This process's ``RayStore`` of the session, held while it lives (c10d keeps a
        reference to its C++ side only: were the Python object freed, every later call of the
        groups' stores, NCCL's first connect included, would fail as "Not implemented")."""

    def close(self) -> None:
        """Drop the session's rendezvous space (not waited for: the board refuses it from now on)."""
        try:
            self.board.close.remote(self.space)
        except Exception:  # noqa: BLE001, S110 - the board went with its node: nothing is left to drop
            pass


def form_group(ray, actors: dict[str, object], board, timeout_s: float, backend: str, group_keys) -> SessionGroup:
    """The group of the host (rank 0) and ``actors`` (``{member: handle}``, ranks 1..n): gloo, then
    ``session_subgroups`` on ``backend``, all meeting through a fresh space of ``board``.
    ClusterError naming the members that did not join within ``timeout_s`` (the space is dropped)."""
    if dist.is_initialized():
        raise ClusterError("a distributed session is already open in this process (torch.distributed's "
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
            raise ClusterError(f"the sessions' rendezvous actor did not answer within {timeout_s:g} s "
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
        raise ClusterError(f"the session's process group did not form ({said}{host}); the next prompt "
                           "runs on the members left (`ray status` shows which nodes are alive)")


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

    def forget(self, name: str, model_key: str) -> None:
        """Member ``name`` no longer holds the blocks of model ``model_key``."""
        self.versions[name] = {k: v for k, v in self.versions[name].items() if k[0] != model_key}
        self.skeletons[name] = {k for k in self.skeletons[name] if k[0] != model_key}

    def label(self, member: str) -> str:
        return f"member {member} (rank {self.names.index(member) + 1}, {self.devices.get(member, '?')}, on Ray)"

    def request(self, name: str, message: dict, what: str, max_bytes: int = 0):
        sent = self.send(name, message, what)
        return sent, self.receive(name, what, max_bytes)[1]

    def send(self, name: str, message: dict, what: str) -> int:
        """Post ``message`` to member ``name``; the payload's bytes."""
        if name in self._pending:
            raise DistWorkerError(f"{self.label(name)}: a command is still unanswered before {what}")
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
            raise DistWorkerError(f"{self.label(name)} sent an invalid reply during {what}: {e.reason}") from None
        n = len(payload)
        self.bytes_received[name] = self.bytes_received.get(name, 0) + n
        if answer["op"] == "error":
            self.broken = True
            raise DistWorkerError(f"{self.label(name)} failed during {what}: {answer['error']}")
        return n, answer

    def _failed(self, name: str, what: str, e: Exception) -> DistWorkerError:
        self.broken = True
        return DistWorkerError(f"{self.label(name)} did not answer during {what} within "
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
