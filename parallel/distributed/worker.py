"""A ShardDiT worker process: joins a host's lobby and serves sessions (pure PyTorch).

``serve(host, port, name, device)`` makes ``device`` its current CUDA device, connects to the
host's ``TCPStore`` (retrying until the host listens), checks the host's signed lobby entry (a
secret that is not the host's, or another protocol: ``WorkerRefused``, nothing registered), signs
its offer as the member ``NAME/DEVICE`` into a registration slot (one process serves one device;
``python <pack-dir> worker --devices cuda:0,cuda:1`` starts one per device), then loops: wait for
a verified invitation to that member (forged, stale or altered ones are ignored and said once;
the registration is written again if a stranger overwrote it), join the session's process group,
run the host's commands until it says ``leave``, the session breaks or the host stays silent for
``IDLE_TIMEOUT_S``, back to waiting. Entry formats: ``distributed/lobby.py``.
Before anything else the host and the worker prove to each other that they hold the shared
secret (``wire.worker_handshake``); a worker with another secret is refused and told so.
Commands (``distributed.protocol`` messages on the worker's command channel, one reply each;
signed, numbered, schema-checked, never unpickled):

- ``block``: build the blocks the host describes (``distributed.block_specs``), keep the weights
  of the blocks this worker owns that came with it,
  post this worker's part of the weight broadcasts of the blocks it mentions first (the current
  one and the next: sent from here for a block it owns, received into a ``WeightRing`` slot
  otherwise), rebuild the rank's arguments (the hidden state it kept, constants defined once per
  forward), run the block with a Ulysses attention override over ``DistExchange`` (its exchanges
  posted after those broadcasts: ``order.CollectiveOrder``, the order every process keeps), keep
  the output rows;
- ``held``: report the bytes of the blocks it owns and of its receive ring;
- ``fetch``: send back the rows of one hidden state;
- ``leave``: leave the session (the weights go with it).

The block classes are this process's own (ComfyUI's for real models, built from the model config
by the builder ``python <pack-dir> worker`` registers); the host sends only their description and
the weights' bytes. No model file is read.
"""
from __future__ import annotations

import datetime
import logging
import math
import traceback

import torch.distributed as dist

from ..units import format_gib
from ..placement.devices import check_member_name
from .serving import BlockServer
from .host import IDLE_TIMEOUT_S, end_process_group, reset_after_failed_init, weight_groups
from .join import LobbyMember, WorkerRefused, bind_device, check_lobby, connect, device_free_bytes, make_offer
from .lobby import require_secret
from .wire import Channel, worker_handshake
from .protocol import ProtocolError, SecretMismatch

__all__ = ["Worker", "WorkerRefused", "bind_device", "check_lobby", "connect", "device_free_bytes", "make_offer",
           "serve"]

log = logging.getLogger("sharddit")
MAX_COMMAND_BYTES = 1 << 40
"""Largest command (block weights inside) a worker accepts; commands are signed by the host."""


class Worker(LobbyMember):
    """A lobby member that serves the sessions it is invited to."""

    def run_session(self, invite: dict) -> str:
        """Join the session, serve it; returns why it ended."""
        sid, rank, world = invite["sid"], invite["rank"], invite["world"]
        timeout = datetime.timedelta(seconds=invite["timeout_s"])
        try:
            dist.init_process_group("gloo", store=dist.PrefixStore(f"session/{invite['id']}/", self.store), rank=rank,
                                    world_size=world, timeout=timeout)
        except Exception as e:  # noqa: BLE001 - the host gave up on this session meanwhile
            reset_after_failed_init()
            return f"could not join session {sid} ({type(e).__name__})"
        backend = invite["backend"]
        server = None
        why = "failed while joining"
        try:
            ctl = {r: dist.new_group([0, r], backend="gloo", timeout=datetime.timedelta(seconds=IDLE_TIMEOUT_S))
                   for r in range(1, world)}
            groups = {tuple(g): dist.new_group(g, backend=backend, timeout=timeout) for g in invite["groups"]}
            wgroups = weight_groups(world, backend, invite["timeout_s"])
            server = BlockServer(self.name, self.device, backend, rank, groups, wgroups, invite["timeout_s"], self.say)
            ch = Channel(ctl[rank], rank, False, self.key)
            try:
                worker_handshake(ch)
            except SecretMismatch as e:
                self.say(f"{e}; left session {sid}")
                return f"refused: {e}"
            except Exception as e:  # noqa: BLE001 - the host gave up or speaks another protocol
                return f"no handshake with the host ({type(e).__name__}: {e})"
            self.say(f"[ShardDiT] worker {self.name!r}: in session {sid} as rank {rank} of {world}")
            why = self._serve(ch, server)
            return why
        finally:
            if server is not None:
                server.release()
            # a failed NCCL session: abort its communicators first (collectives may still be posted)
            end_process_group(backend == "nccl" and why != "host closed the session")

    def _serve(self, ch, server: BlockServer) -> str:
        timeout_s = server.timeout_s
        while True:
            try:
                msg, _ = ch.recv(MAX_COMMAND_BYTES, self.device)
            except ProtocolError as e:  # unsigned, out of sequence or malformed: nothing of it is used
                _tell_host({"op": "error", "error": f"invalid command: {e}"}, ch, timeout_s)
                return f"invalid command from the host: {e}"
            except Exception as e:  # noqa: BLE001 - the host closed the session or went away
                return f"host gone ({type(e).__name__})"
            if msg["op"] == "leave":
                return "host closed the session"
            try:
                reply = server.command(msg)
            except Exception as e:  # noqa: BLE001 - report, then leave: the ranks are out of step now
                log.error("[ShardDiT] worker %r: %s", self.name, traceback.format_exc())
                _tell_host({"op": "error", "error": f"{type(e).__name__}: {e}"}, ch, timeout_s)
                return f"failed: {e}"
            try:
                ch.send(reply, timeout_s)
            except Exception as e:  # noqa: BLE001 - the host stopped reading: it gave up on this session
                return f"host gone ({type(e).__name__})"


def _tell_host(message: dict, ch, timeout_s: float) -> None:
    """Report a failure to the host, if it still listens (this worker leaves the session anyway)."""
    try:
        ch.send(message, timeout_s)
    except Exception as e:  # noqa: BLE001
        log.warning("[ShardDiT] could not report to the host: %s", e)


def serve(host: str, port: int, name: str, device: str, timeout_s: float, say=print,
          sessions: int | None = None, wait_s: float = math.inf, comfyui: str = "") -> None:
    """Join ``host:port`` as member ``name/device`` (waiting up to ``wait_s`` for the host to
    answer) and serve until interrupted (or ``sessions`` sessions ended). ValueError (a
    ``WorkerRefused``) before joining anything when the secret is missing or not the host's."""
    check_member_name(name)
    key = require_secret(None, f"worker '{name}/{device}'")
    bind_device(device)
    store = connect(host, port, timeout_s, wait_s, say=say)
    worker = Worker(store, name, device, None, say, key, f"the host at {host}:{port}", comfyui)
    offer = worker.offer
    say(f"[ShardDiT] worker {worker.member!r} (pid {offer['pid']}) joined {host}:{port}, offering {offer['device']} "
        f"({format_gib(offer['free'])} GiB free)")
    done = 0
    try:
        while sessions is None or done < sessions:
            why = worker.run_session(worker.wait_invite())
            say(f"[ShardDiT] worker {worker.member!r}: session ended: {why}")
            done += 1
    finally:
        worker.leave_lobby()
