"""The pack's side of a Ray rank actor (``rank_actor.RankWorker`` imports the pack on its node and
hands everything here): join a session's groups, serve the host's commands. A command is one
``protocol`` payload (schema-checked JSON and raw bytes, every size checked before a tensor is made:
nothing is unpickled); Ray's token authenticated the caller, no code here authenticates anyone.
"""
from __future__ import annotations

import datetime
import logging
import traceback

import torch
import torch.distributed as dist

from ..distributed.members import bind_device, make_offer
from ..distributed.protocol import ProtocolError, from_payload, to_payload
from ..distributed.serving import BlockServer
from .group import RayStore, end_process_group, reset_after_failed_init, session_subgroups
from .rank_actor import free_bytes
from .settings import raise_fd_limit
from ..errors import reason_of

__all__ = ["MAX_COMMAND_BYTES", "RankServer"]

log = logging.getLogger("sharddit")
MAX_COMMAND_BYTES = 1 << 40
"""Largest command (block weights inside) a rank accepts."""



class RankServer:
    """One member ``NAME/DEVICE``'s rank: made once per actor, one session at a time."""

    def __init__(self, member: str, device: str, comfyui: str = ""):
        self.member, self.device, self.comfyui = member, device, comfyui
        raise_fd_limit()  # a stranger's held connections to gloo's ports must not exhaust this rank
        self.name = member.partition("/")[0]
        self.server: BlockServer | None = None
        self.store: RayStore | None = None
        self.backend = "gloo"

    def offer(self) -> dict:
        """What this member offers: its device, free bytes, GPU and versions."""
        return make_offer(self.name, self.device, free_bytes(self.device), self.comfyui)

    def join(self, board, space: str, rank: int, world: int, timeout_s: float, backend: str, group_keys) -> int:
        """Join the session's group (gloo) as ``rank`` of ``world``, meeting the others through the
        host's rendezvous actor ``board`` (its session space ``space``: ``group.RayStore``, over
        Ray only), then its subgroups (``session_subgroups``, on ``backend``); returns the rank."""
        import ray  # this runs in a Ray actor
        self.leave()
        if self.device.startswith("cuda"):
            bind_device(self.device)
        timeout = datetime.timedelta(seconds=timeout_s)
        keys = [tuple(g) for g in group_keys]
        try:
            self.store = RayStore(ray, board, space, timeout_s)  # held while the session lives (group.py)
            dist.init_process_group("gloo", store=self.store, rank=rank, world_size=world, timeout=timeout)
            made = [dist.new_group(list(g), backend=backend, timeout=timeout) for g in session_subgroups(world, keys)]
        except BaseException:
            reset_after_failed_init()  # the next session's group names must match the host's
            raise
        wgroups = {"all": made[len(keys)]}
        if world > 2:
            wgroups["workers"] = made[len(keys) + 1]
        self.backend = backend
        self.server = BlockServer(self.member, self.device, backend, rank, dict(zip(keys, made)), wgroups, timeout_s,
                                  say=lambda m: print(m, flush=True))  # Ray forwards it to the host's log
        return dist.get_rank()

    def command(self, payload: bytes) -> bytes:
        """One command's payload in, its reply's payload out. A failed command replies ``error``
        and this rank leaves the session (its ranks are out of step)."""
        if self.server is None:
            return to_payload({"op": "error", "error": f"member {self.member} is in no session"})
        try:
            msg, _ = from_payload(payload, MAX_COMMAND_BYTES, self.server.device)
            reply = self.server.command(msg)
        except ProtocolError as e:
            self.leave(failed=True)
            return to_payload({"op": "error", "error": f"invalid command: {reason_of(e)}"})
        except Exception as e:  # noqa: BLE001 - report to the host, which closes the session
            log.error("[ShardDiT] member %s: %s", self.member, traceback.format_exc())
            self.leave(failed=True)
            return to_payload({"op": "error", "error": f"{type(e).__name__}: {reason_of(e)}"})
        return to_payload(reply)

    def leave(self, failed: bool = False) -> bool:
        """Leave the session's groups (blocks and ring go with it); the actor stays for the next."""
        if self.server is not None:
            self.server.release()
            self.server = None
        if dist.is_initialized():
            end_process_group(failed and self.backend == "nccl")
        self.store = None
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        return True
