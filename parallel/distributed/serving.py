"""What a remote rank does with the host's commands (pure): ``BlockServer`` holds one session's
state on a worker (the skeletons it built, the weights of the blocks it owns, its receive ring, the
current forward) and answers one checked ``protocol`` command at a time (``block``, ``fetch``,
``drop``, ``held``). Weight broadcasts and exchanges follow ``order.CollectiveOrder``.
"""
from __future__ import annotations

import datetime

import torch
import torch.distributed as dist

from ..tensor_map import map_tensors
from ..units import MiB
from .weights import WeightLayout, WeightRing, bind_flat, empty_block
from .exchange import DistExchange
from .order import CollectiveOrder
from .block_specs import build_block
from .protocol import ProtocolError
from ..sequence.split import Group, RankSlice
from ..sequence.rank_block import BlockAttention, run_rank_block, with_attention
from ..errors import RunError

__all__ = ["BlockServer"]


class BlockServer:
    """One session's blocks and forward state on a remote rank of ``device``.

    ``rank``: this process's rank in the session's group; ``groups``: the exchange groups by rank
    tuple; ``wgroups``: the weight groups (``host.weight_groups``); ``say``: where news goes."""

    def __init__(self, name: str, device, backend: str, rank: int, groups: dict, wgroups: dict, timeout_s: float,
                 say=print):
        self.name, self.device, self.backend = name, torch.device(device), backend
        self.rank, self.groups, self.wgroups, self.timeout_s, self.say = rank, groups, wgroups, timeout_s, say
        self.wire = torch.device("cpu") if backend == "gloo" else self.device
        self.skeletons: dict[tuple, torch.nn.Module] = {}  # (model key, block index) -> skeleton
        self.owned: dict[tuple, tuple] = {}  # (model key, block index) -> (module, flat bytes on device, layout)
        self.layouts: dict[tuple, WeightLayout] = {}
        self.ring = WeightRing(self.device, self.wire, timeout_s=timeout_s)
        self.state = _ForwardState(-1, timeout_s)

    def release(self) -> None:
        """Drop every block and the ring (the session ends)."""
        self.skeletons.clear()
        self.owned.clear()
        self.ring.release()

    def command(self, msg: dict) -> dict:
        """The reply to one checked command."""
        op = msg["op"]
        if op == "block":
            if msg["fid"] != self.state.fid:
                self.state.finish(self.timeout_s)
                self.state = _ForwardState(msg["fid"], self.timeout_s)
            self._block(self.state, msg)
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

    def take_weights(self, state, msg) -> None:
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
            if src == self.rank:  # this worker owns the block: it sends it to the other workers
                flat = self.owned[k][1]
                flat = flat if flat.device == self.wire else flat.to(self.wire)
                state.works.append((_broadcast(state.order, idx, flat, src, self.wgroups[group]), flat))
                continue
            slot = self.ring.slot_for(k, self.skeletons[k], self.layouts[k])
            slot.work = _broadcast(state.order, idx, slot.flat, src, self.wgroups[group])
            state.incoming[k] = slot

    def _module(self, state, key) -> torch.nn.Module:
        if key in self.owned:
            return self.owned[key][0]
        slot = state.incoming.pop(key, None)
        if slot is None or slot.index != key:
            raise RunError(f"block {key[1]}: its weights were not sent to this worker")
        if slot.work is not None:
            slot.work.wait(datetime.timedelta(seconds=self.timeout_s))
            slot.work = None
            if slot.flat.device != self.device:
                self.ring.unpack(slot, self.layouts[key])
        return slot.module

    def _block(self, state, msg) -> None:
        step = state.steps
        state.steps += 1
        with state.order.weights(step):
            self.take_weights(state, msg)
        with state.order.exchanging(self.rank, step):
            self._run(state, msg)

    def _run(self, state, msg) -> None:
        module = self._module(state, (msg["key"], msg["index"]))
        args = [state.decode(a, self.device) for a in msg["args"]]
        kwargs = {k: state.decode(v, self.device) for k, v in msg["kwargs"]}
        d = msg["slice"]
        rs, main = RankSlice(d["rank"], _group(d["group"]), d["position"], d["tokens"]), msg["main"]
        attentions = []
        if "transformer_options" in kwargs and len(rs.group.ranks) > 1:
            ex = DistExchange(self.groups[tuple(sorted(set(msg["group"])))], msg["group"], self.device, msg["peers"],
                              self.timeout_s, self.backend, order=state.order)
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
