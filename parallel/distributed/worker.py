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

import torch
import torch.distributed as dist

from ..tensor_map import map_tensors
from ..units import MiB, format_gib
from ..placement.devices import check_member_name
from .weights import WeightLayout, WeightRing, bind_flat, empty_block
from .exchange import DistExchange
from .order import CollectiveOrder
from .host import IDLE_TIMEOUT_S, end_process_group, reset_after_failed_init, weight_groups
from .join import LobbyMember, WorkerRefused, bind_device, check_lobby, connect, device_free_bytes, make_offer
from .lobby import require_secret
from .wire import Channel, worker_handshake
from .block_specs import build_block
from .protocol import ProtocolError, SecretMismatch
from ..sequence.split import Group, RankSlice
from ..sequence.rank_block import BlockAttention, run_rank_block, with_attention

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
        self.wire = torch.device("cpu") if backend == "gloo" else self.device
        self.skeletons: dict[tuple, torch.nn.Module] = {}  # (model key, block index) -> skeleton
        self.owned: dict[tuple, tuple] = {}  # (model key, block index) -> (module, flat bytes on device, layout)
        self.layouts: dict[tuple, WeightLayout] = {}
        self.ring = WeightRing(self.device, self.wire, timeout_s=invite["timeout_s"])
        why = "failed while joining"
        try:
            ctl = {r: dist.new_group([0, r], backend="gloo", timeout=datetime.timedelta(seconds=IDLE_TIMEOUT_S))
                   for r in range(1, world)}
            groups = {tuple(g): dist.new_group(g, backend=backend, timeout=timeout) for g in invite["groups"]}
            wgroups = weight_groups(world, backend, invite["timeout_s"])
            ch = Channel(ctl[rank], rank, False, self.key)
            try:
                worker_handshake(ch)
            except SecretMismatch as e:
                self.say(f"{e}; left session {sid}")
                return f"refused: {e}"
            except Exception as e:  # noqa: BLE001 - the host gave up or speaks another protocol
                return f"no handshake with the host ({type(e).__name__}: {e})"
            self.say(f"[ShardDiT] worker {self.name!r}: in session {sid} as rank {rank} of {world}")
            why = self._serve(rank, ch, groups, wgroups, invite["timeout_s"], backend)
            return why
        finally:
            self.skeletons.clear()
            self.owned.clear()
            self.ring.release()
            # a failed NCCL session: abort its communicators first (collectives may still be posted)
            end_process_group(backend == "nccl" and why != "host closed the session")

    def _serve(self, rank, ch, groups, wgroups, timeout_s, backend) -> str:
        self.state = _ForwardState(-1, timeout_s)
        while True:
            try:
                msg, _ = ch.recv(MAX_COMMAND_BYTES, self.device)
            except ProtocolError as e:  # unsigned, out of sequence or malformed: nothing of it is used
                _tell_host({"op": "error", "error": f"invalid command: {e}"}, ch, timeout_s)
                return f"invalid command from the host: {e}"
            except Exception as e:  # noqa: BLE001 - the host closed the session or went away
                return f"host gone ({type(e).__name__})"
            op = msg["op"]
            if op == "leave":
                return "host closed the session"
            try:
                reply = self._command(op, msg, rank, groups, wgroups, timeout_s, backend)
            except Exception as e:  # noqa: BLE001 - report, then leave: the ranks are out of step now
                log.error("[ShardDiT] worker %r: %s", self.name, traceback.format_exc())
                _tell_host({"op": "error", "error": f"{type(e).__name__}: {e}"}, ch, timeout_s)
                return f"failed: {e}"
            try:
                ch.send(reply, timeout_s)
            except Exception as e:  # noqa: BLE001 - the host stopped reading: it gave up on this session
                return f"host gone ({type(e).__name__})"

    def _command(self, op, msg, rank, groups, wgroups, timeout_s, backend) -> dict:
        """The reply to one verified command."""
        if op == "block":
            if msg["fid"] != self.state.fid:
                self.state.finish(timeout_s)
                self.state = _ForwardState(msg["fid"], timeout_s)
            self._block(self.state, msg, rank, groups, wgroups, timeout_s, backend)
            return {"op": "ok"}
        if op == "fetch":
            return {"op": "tensor", "tensor": self.state.streams[msg["name"]].cpu()}
        if op == "drop":
            for k in [k for k in (*self.owned, *self.skeletons) if k[0] == msg["key"]]:
                self.owned.pop(k, None)
                self.skeletons.pop(k, None)
                self.layouts.pop(k, None)
            return {"op": "ok"}
        if op == "held":
            return {"op": "holding", "owned": sum(f.numel() for _, f, _ in self.owned.values()),
                    "ring": self.ring.nbytes, "blocks": sorted(i for _, i in self.owned)}
        return {"op": "error", "error": f"{op!r} is not a command"}

    def _weights(self, state, msg, rank, wgroups, timeout_s) -> None:
        """Take the skeletons and owned blocks the host sent, then post this rank's part of the
        weight broadcasts of the blocks first mentioned here (the current one and the next)."""
        key = msg["key"]
        for idx, desc in msg["blocks"]:  # built here from the host's description, checked against it
            skel = build_block(desc)
            self.skeletons[(key, idx)] = skel
            self.layouts[(key, idx)] = WeightLayout(skel)
        for idx, flat in msg["owned"]:
            if not isinstance(flat, torch.Tensor) or (key, idx) not in self.layouts \
                    or flat.dtype != torch.uint8 or flat.numel() != self.layouts[(key, idx)].nbytes:
                raise ProtocolError(f"block {idx}: its weights do not match its layout")
            k = (key, idx)
            module = empty_block(self.skeletons[k], self.device)
            flat = flat.to(self.device)
            bind_flat(module, flat, self.layouts[k])
            self.owned[k] = (module, flat, self.layouts[k])
        if msg["owned"]:
            mine = sorted(i for kk, i in self.owned if kk == key)
            size = sum(f.numel() for _, f, _ in self.owned.values()) / MiB
            got = sorted(i for i, _ in msg["owned"])
            self.say(f"[ShardDiT] worker {self.name!r}: received blocks {got}; holds blocks {mine} "
                     f"of model {key} ({size:.1f} MiB owned in all); the others arrive from their owners")
        for idx, plan in msg["transfers"]:
            k = (key, idx)
            if plan is None:
                continue
            group, src = plan
            if src == rank:  # this worker owns the block: it sends it to the other workers
                flat = self.owned[k][1]
                flat = flat if flat.device == self.wire else flat.to(self.wire)
                state.works.append((_broadcast(state.order, idx, flat, src, wgroups[group]), flat))
                continue
            slot = self.ring.slot_for(k, self.skeletons[k], self.layouts[k])
            slot.work = _broadcast(state.order, idx, slot.flat, src, wgroups[group])
            state.incoming[k] = slot

    def _module(self, state, key, timeout_s) -> torch.nn.Module:
        if key in self.owned:
            return self.owned[key][0]
        slot = state.incoming.pop(key, None)
        if slot is None or slot.index != key:
            raise RuntimeError(f"block {key[1]}: its weights were not sent to this worker")
        if slot.work is not None:
            slot.work.wait(datetime.timedelta(seconds=timeout_s))
            slot.work = None
            if slot.flat.device != self.device:
                self.ring.unpack(slot, self.layouts[key])
        return slot.module

    def _block(self, state, msg, rank, groups, wgroups, timeout_s, backend) -> None:
        step = state.steps
        state.steps += 1
        with state.order.weights(step):
            self._weights(state, msg, rank, wgroups, timeout_s)
        with state.order.exchanging(rank, step):
            self._run(state, msg, groups, timeout_s, backend)

    def _run(self, state, msg, groups, timeout_s, backend) -> None:
        module = self._module(state, (msg["key"], msg["index"]), timeout_s)
        args = [state.decode(a, self.device) for a in msg["args"]]
        kwargs = {k: state.decode(v, self.device) for k, v in msg["kwargs"]}
        d = msg["slice"]
        rs, main = RankSlice(d["rank"], _group(d["group"]), d["position"], d["tokens"]), msg["main"]
        attentions = []
        if "transformer_options" in kwargs and len(rs.group.ranks) > 1:
            ex = DistExchange(groups[tuple(sorted(set(msg["group"])))], msg["group"], self.device, msg["peers"],
                              timeout_s, backend, order=state.order)
            attentions.append(BlockAttention(ex, rs, main, msg.get("text_first", False)))
            kwargs["transformer_options"] = with_attention(kwargs["transformer_options"], attentions[0])
        with torch.inference_mode(msg["inference"]), torch.set_grad_enabled(msg["grad"]):
            state.streams.update(run_rank_block(module, args, kwargs, attentions, msg["streams"], msg["index"]))


def _broadcast(order, idx: int, flat, src: int, group):
    """Post one weight broadcast in its turn of the forward's order (``order.CollectiveOrder``)."""
    return order.post(f"broadcast of block {idx}", lambda: dist.broadcast(flat, src, group=group, async_op=True))


def _group(d: dict) -> Group:
    """A command's batch group, its ``shares`` (the ranks' relative speeds) checked: None, or one
    positive number per rank."""
    shares = d.get("shares")
    if shares is not None:
        if not (isinstance(shares, list) and len(shares) == len(d["ranks"])
                and all(isinstance(x, (int, float)) and not isinstance(x, bool) and x > 0 for x in shares)):
            raise ProtocolError(f"a group's shares must be {len(d['ranks'])} positive numbers, got {shares!r:.80}")
        shares = tuple(float(x) for x in shares)
    return Group(d["index"], tuple(d["batch"]), tuple(d["ranks"]), shares)


def _tell_host(message: dict, ch, timeout_s: float) -> None:
    """Report a failure to the host, if it still listens (this worker leaves the session anyway)."""
    try:
        ch.send(message, timeout_s)
    except Exception as e:  # noqa: BLE001
        log.warning("[ShardDiT] could not report to the host: %s", e)


class _ForwardState:
    def __init__(self, fid: int, timeout_s: float):
        self.fid = fid
        self.steps = 0
        """Block commands of this forward so far (the step of the next one)."""
        self.order = CollectiveOrder(timeout_s)
        self.consts: dict[int, object] = {}
        self.streams: dict[str, torch.Tensor] = {}
        self.incoming: dict[tuple, object] = {}
        """(model key, block index) -> the ring slot its weights arrive in (posted, maybe unused)."""
        self.works: list = []
        """Broadcasts this worker sends (blocks it owns), kept with their bytes until done."""

    def finish(self, timeout_s: float) -> None:
        """Wait for the broadcasts of the forward that ended (every process posted them)."""
        for work, _ in self.works:
            work.wait(datetime.timedelta(seconds=timeout_s))
        for slot in self.incoming.values():
            if slot.work is not None:
                slot.work.wait(datetime.timedelta(seconds=timeout_s))
                slot.work = None
        self.works, self.incoming = [], {}

    def decode(self, item, device):
        kind = item[0] if isinstance(item, tuple) and item else None
        if kind not in ("stream", "ref", "def", "val"):
            raise ProtocolError(f"not an argument of a block command: {str(item)[:60]}")
        if kind == "stream":
            return self.streams[item[1]]
        if kind == "ref":
            return self.consts[item[1]]
        value = map_tensors(lambda t: t.to(device), item[-1])
        if kind == "def":
            self.consts[item[1]] = value
        return value


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
