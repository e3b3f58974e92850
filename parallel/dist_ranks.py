"""Engine ranks that live in worker processes (host side of distributed `sequence` mode; pure).

``attach_remote_ranks(engine, lobby, {engine_rank: worker_name})`` makes those ranks of a
``SequenceEngine`` remote. Their pool thread on the host becomes a proxy: for each block it sends
the worker the block's weights when the worker does not hold this version yet (after ComfyUI's
patching: LoRA, casts), the rank's share of the arguments (constants once per forward, later by
reference; the hidden state stays on the worker between blocks), and waits for "done". Ulysses
exchanges between a host rank and worker ranks go through ``DistExchange``; the host fetches a
worker's rows only where the engine gathers.

Limits of this first version: each worker serves one rank (one device); a batch group may hold
at most one host rank besides worker ranks; every worker holds every block (streamed once per
session from the host, so the host must fit the whole DiT).
"""
from __future__ import annotations

import itertools
import uuid

import torch

from .dist_exchange import DistExchange
from .dist_host import Lobby
from .seq_split import plan_groups

__all__ = ["DistRanks", "RemoteStream", "attach_remote_ranks", "block_version"]

_OVERRIDE = "optimized_attention_override"
_NOT_SENT = ("patches", "patches_replace", "wrappers", "callbacks", _OVERRIDE)
_FORWARDS = itertools.count(1)
"""Forward ids, unique in this process: two models (Wan 2.2's two experts) share one session."""


class RemoteStream:
    """Stands for a hidden state a worker holds (its rows of stream ``name``)."""

    __slots__ = ("name",)

    def __init__(self, name: str):
        self.name = name


def block_version(block: torch.nn.Module) -> tuple:
    """What identifies a block's weights: per tensor its storage, in-place version and content
    checksums (a LoRA patch replaces or rewrites tensors; sums catch a new tensor at a reused
    address). One device sync per block."""
    tensors = [t for _, t in block.named_parameters()] + [t for _, t in block.named_buffers()]
    if not tensors:
        return ()
    keys = tuple((t.data_ptr(), _version(t), tuple(t.shape), str(t.dtype)) for t in tensors)
    sums = torch.stack([torch.stack([t.double().sum(), t.double().square().sum()]) for t in tensors])
    return keys + tuple(sums.flatten().tolist())


def _version(t: torch.Tensor) -> int:
    try:
        return t._version
    except RuntimeError:  # an inference tensor has no version counter (the checksums still apply)
        return -1


class DistRanks:
    """The remote ranks of one engine and the session they run in."""

    def __init__(self, engine, lobby: Lobby, remote: dict[int, str], devices: dict[str, str], backend: str = "gloo"):
        self.engine, self.lobby, self.remote = engine, lobby, dict(remote)
        self.devices, self.backend = devices, backend
        if len(set(self.remote.values())) != len(self.remote):
            raise ValueError("[ShardDiT] one worker serves one device for now: list each worker once")
        self.names = tuple(self.remote[r] for r in sorted(self.remote))
        self.dist_rank = {r: (self.names.index(n) + 1 if (n := self.remote.get(r)) else 0)
                          for r in range(len(engine.devices))}
        self.group_keys, self.bad_groups = self._groups(len(engine.devices))
        self.session = None
        self._sent: dict[str, dict[int, tuple]] = {}
        self._fid = 0
        self.key = uuid.uuid4().hex[:12]
        """This engine's blocks on the workers (``(key, index)``), apart from another model's."""
        self.bytes_sent: dict[str, int] = {}

    def _groups(self, n):
        keys, bad = [], set()
        for b in range(1, n + 1):
            for g in plan_groups(b, n):
                if len(g.ranks) < 2 or not any(r in self.remote for r in g.ranks):
                    continue
                d = [self.dist_rank[r] for r in g.ranks]
                if len(set(d)) != len(d):
                    bad.add(g.ranks)
                    continue
                if tuple(sorted(d)) not in keys:
                    keys.append(tuple(sorted(d)))
        return tuple(keys), bad

    def is_remote(self, rank: int) -> bool:
        return rank in self.remote

    # ---- main thread ---------------------------------------------------------------------------
    def begin_forward(self, groups) -> None:
        for g in groups:
            if g.ranks in self.bad_groups:
                raise ValueError(f"[ShardDiT] sequence ranks {g.ranks} mix two host devices with workers in one "
                                 "batch group (not supported yet): list one host device per group, e.g. 'cpu,w1/cpu'")
        self.session = self.lobby.session_for(self.names, self.group_keys, self.backend, self.devices)
        self._fid = next(_FORWARDS)
        self._sent = {n: {} for n in self.names}
        self.bytes_sent = {n: 0 for n in self.names}

    def end_forward(self, ok: bool) -> None:
        if self.session is not None and (not ok or self.session.broken):
            self.lobby.close_session()
        self.session = None

    def exchange(self, group, device):
        """The host rank's exchange for a batch group that includes worker ranks; None otherwise."""
        if not any(r in self.remote for r in group.ranks):
            return None
        key = tuple(sorted(self.dist_rank[r] for r in group.ranks))
        peers = [self._label(r) for r in group.ranks]
        return DistExchange(self.session.groups[key], [self.dist_rank[r] for r in group.ranks], device, peers,
                            self.session.timeout_s, self.backend)

    def _label(self, rank: int) -> str:
        name = self.remote.get(rank)
        return self.session.label(name) if name else f"the host (rank 0, {self.engine.devices[rank]})"

    # ---- the proxy thread of a remote rank -------------------------------------------------------
    def run_block(self, fwd, rank, index: int, block, values: list, kwvalues: dict, stream_names) -> None:
        name = self.remote[rank.slice.rank]
        s = self.session
        version = block_version(block)
        module = block if s.versions[name].get((self.key, index)) != version else None
        msg = {"op": "block", "fid": self._fid, "index": (self.key, index), "module": module,
               "args": [self._encode(name, v) for v in values],
               "kwargs": {k: self._encode(name, v) for k, v in kwvalues.items()},
               "streams": list(stream_names), "slice": _slice_data(rank.slice), "main": fwd.main,
               "group": [self.dist_rank[r] for r in rank.slice.group.ranks],
               "peers": [self._label(r) for r in rank.slice.group.ranks],
               "grad": torch.is_grad_enabled(), "inference": torch.is_inference_mode_enabled()}
        what = f"block {index}" + (" (receiving its weights)" if module is not None else "")
        sent, _ = s.request(name, msg, what)
        self.bytes_sent[name] += sent
        if module is not None:
            s.versions[name][(self.key, index)] = version
        for n in stream_names:
            rank.streams[n] = RemoteStream(n)
        rank.blocks_run += 1

    def fetch(self, rank: int, stream: str) -> torch.Tensor:
        name = self.remote[rank]
        _, answer = self.session.request(name, {"op": "fetch", "name": stream}, f"returning {stream!r}")
        return answer["tensor"]

    def _encode(self, name: str, value):
        if isinstance(value, RemoteStream):
            return ("stream", value.name)
        if isinstance(value, dict):  # transformer_options: plain entries only, the worker adds its hook
            if value.get(_OVERRIDE) is not None and getattr(value[_OVERRIDE], "args", (None,) * 3)[2] is not None:
                raise ValueError("[ShardDiT] another attention override is installed; it cannot run on workers "
                                 "(use host devices only, or remove the other override)")
            return ("val", {k: v for k, v in value.items() if k not in _NOT_SENT and _plain(v)})
        if not _has_tensor(value):
            return ("val", value)
        value_out = _compact(value)
        sent = self._sent[name]
        hit = sent.get(id(value))
        if hit is not None and hit[1] is value:
            return ("ref", hit[0])
        key = len(sent)
        sent[id(value)] = (key, value)  # holds the value: its id cannot be reused in this forward
        return ("def", key, value_out)


def _slice_data(rs) -> dict:
    """A ``RankSlice`` as builtins: messages carry no class of this pack (the host imports it under
    ComfyUI's module name for custom nodes, the worker under another)."""
    g = rs.group
    return {"rank": rs.rank, "position": rs.position, "tokens": tuple(rs.tokens),
            "group": {"index": g.index, "batch": tuple(g.batch), "ranks": tuple(g.ranks)}}


def _compact(v):
    """``v`` with every tensor view copied to its own storage: pickling a view (a rank's token
    range) would send the whole storage it looks into."""
    if isinstance(v, torch.Tensor):
        whole = v.untyped_storage().nbytes()
        return v.clone() if whole > v.numel() * v.element_size() else v
    if isinstance(v, (tuple, list)):
        items = [_compact(x) for x in v]
        return type(v)(items) if not hasattr(v, "_fields") else type(v)(*items)
    return v


def _has_tensor(v) -> bool:
    return isinstance(v, torch.Tensor) or (isinstance(v, (tuple, list)) and any(_has_tensor(x) for x in v))


def _plain(v, depth: int = 2) -> bool:
    if v is None or isinstance(v, (bool, int, float, str, torch.Tensor)):
        return True
    if depth and isinstance(v, (tuple, list)):
        return all(_plain(x, depth - 1) for x in v)
    if depth and isinstance(v, dict):
        return all(isinstance(k, str) and _plain(x, depth - 1) for k, x in v.items())
    return False


def attach_remote_ranks(engine, lobby: Lobby, remote: dict[int, str], devices: dict[str, str],
                        backend: str = "gloo") -> DistRanks:
    """Make ``remote`` (engine rank -> worker name) ranks of ``engine`` run in those workers."""
    engine.dist = DistRanks(engine, lobby, remote, devices, backend)
    engine.timeout_s = max(engine.timeout_s, lobby.timeout_s * 2 + 30)  # the worker's own timeout fires first
    return engine.dist
