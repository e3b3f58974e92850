"""Engine ranks that live in worker processes (host side of distributed `sequence` mode; pure).

``attach_remote_ranks(engine, source, {engine_rank: member}, devices, owners=...)`` makes those ranks
of a ``SequenceEngine`` remote: ``DistRanks`` becomes its ``RankRunner`` (``sequence.interfaces``)
and runs the other ranks through ``sequence.local.LocalRanks``. A remote rank's thread on the host
is a proxy: per block it sends the member a command with the rank's share of the arguments
(constants once per forward, later by reference; the hidden state stays on the member) and waits.

**Weights.** Each engine rank owns a share of the blocks (``owners``). A member keeps only its
rank's blocks, sent (after ComfyUI's patching: LoRA, casts) the first time and again only when
their version changes (``version_of``; by default ``weights.weights_version``). Every other block
reaches it once per forward from its owner by one ``broadcast`` (from the host, or from the owning
worker over the workers' group), the next block posted early so it arrives while the current one
computes. The host's own ranks run worker-owned blocks from the host's copy in RAM.

**Order.** Every collective of a forward is posted through one ``order.CollectiveOrder``, by step:
step ``s``'s broadcasts before its exchanges, before step ``s + 1``'s broadcasts, as every worker
posts them (NCCL needs one order).

``source`` gives the sessions (``parallel/cluster/host.ClusterHost``: ``session_for``,
``close_session``, ``session``, ``timeout_s``); a member ``NAME/DEVICE`` serves one rank.
"""
from __future__ import annotations

import itertools
import logging
import uuid

import torch

from ..tensor_map import map_tensors, tensors_in
from .weights import WeightLayout, pack_block, same_version, weights_version
from .exchange import DistExchange
from .order import CollectiveOrder
from .members import DistWorkerError
from .block_specs import describe_block
from ..sequence.local import LocalRanks
from ..sequence.rank_block import ATTENTION_OVERRIDE
from ..sequence.split import even_ranges, plan_groups
from ..errors import InputError

__all__ = ["DistRanks", "RemoteStream", "attach_remote_ranks", "even_owners", "transfer_group"]

log = logging.getLogger("sharddit")

_NOT_SENT = ("patches", "patches_replace", "wrappers", "callbacks", ATTENTION_OVERRIDE)
_FORWARDS = itertools.count(1)
"""Forward ids, unique in this process: two models (Wan 2.2's two experts) share one session."""
FETCH_LIMIT = 1 << 36
"""Largest hidden-state share a member may return (64 GiB; checked before anything is allocated)."""
_IN_FLIGHT = 3
"""Host broadcasts in flight at most (the current block, the next one, one finishing)."""


class RemoteStream:
    """Stands for a hidden state a worker holds (its rows of stream ``name``)."""

    __slots__ = ("name",)

    def __init__(self, name: str):
        self.name = name


def even_owners(order: list[int], n_ranks: int) -> dict[int, int]:
    """Block index -> engine rank: contiguous, equal shares of ``order`` (the execution order)."""
    out = {}
    for r, (a, b) in enumerate(even_ranges(len(order), n_ranks)):
        for idx in order[a:b]:
            out[idx] = r
    return out


def transfer_group(owner_proc: int, n_workers: int):
    """How a block owned by process ``owner_proc`` reaches the workers that do not own it:
    ``("all", 0)`` (the host sends to every worker), ``("workers", owner_proc)`` (a worker sends to
    the others), or None (no other worker needs it)."""
    if owner_proc == 0:
        return ("all", 0)
    return ("workers", owner_proc) if n_workers > 1 else None


class DistRanks:
    """The remote ranks of one engine and the session they run in: the engine's ``RankRunner``
    (its other ranks run through ``self.local``)."""

    def __init__(self, engine, source, remote: dict[int, str], devices: dict[str, str], backend: str = "gloo",
                 owners: dict[int, int] | None = None, version_of=None, keep_all: bool = False, describe=None):
        self.engine, self.source, self.remote = engine, source, dict(remote)
        self.local = LocalRanks(engine.devices)
        """Runs the engine's ranks that are threads of this process."""
        self.devices, self.backend = devices, backend
        if len(set(self.remote.values())) != len(self.remote):
            raise InputError("one worker serves one device for now: list each worker once")
        self.names = tuple(self.remote[r] for r in sorted(self.remote))
        self.dist_rank = {r: (self.names.index(n) + 1 if (n := self.remote.get(r)) else 0)
                          for r in range(len(engine.devices))}
        self.group_keys = self._groups(len(engine.devices))
        order = list(engine.order)
        self.owners = dict(owners) if owners is not None else even_owners(order, len(engine.devices))
        missing = [i for i in order if i not in self.owners]
        if missing:
            raise InputError(f"blocks {missing} have no owner rank")
        self.keep_all = keep_all
        """Every worker keeps every block (sent once; nothing streams per step)."""
        self.version_of = version_of or (lambda index, block: weights_version(block))
        """``(block index, block) -> version``: compared with ``weights.same_version``."""
        self.describe = describe
        """``(block index, block) -> (family, config)`` the worker builds the block from
        (``distributed.block_specs``); None: the describer registered for the block's class."""
        self._descriptions: dict[int, dict] = {}
        local = [d for r, d in enumerate(engine.devices) if r not in self.remote]
        self.wire = torch.device("cpu") if backend == "gloo" else local[0]
        """Where the host's weight bytes travel from (gloo: host memory; NCCL: the host's first GPU)."""
        self.designated = min(self.remote)
        """The engine rank whose proxy thread makes the host's weight broadcasts (one per block)."""
        self.session = None
        self._sent: dict[str, dict[int, tuple]] = {}
        self._fid = 0
        self.key = uuid.uuid4().hex[:12]
        """This engine's blocks on the workers (``(key, index)``), apart from another model's."""
        self.bytes_sent: dict[str, int] = {}
        """Per worker, this forward: every byte the host sent it (commands, arguments, weights)."""
        self.weight_bytes: dict[str, int] = {}
        """Per worker, this forward: block weight bytes it received (from the host or other workers)."""
        self.streamed_bytes: dict[str, int] = {}
        """Per worker, this forward: the part of ``weight_bytes`` streamed by broadcast (blocks it
        does not own; the rest came inside commands, counted in ``bytes_sent``)."""
        self._layouts: dict[int, WeightLayout] = {}
        self._mentioned: dict[str, set] = {}
        self._host_sent: set = set()
        self._host_works: list = []
        self.order: CollectiveOrder | None = None
        """The order of this forward's collectives (``order``)."""
        self._exchangers: set[int] = set()
        """Local ranks whose batch group has workers: they post exchanges."""
        self._owned_sent: dict[str, list[int]] = {}
        """Per worker, this forward: the blocks whose own weights it was sent (logged at the end)."""

    def _groups(self, n):
        """Process groups of the batch groups that mix processes, for every batch size (one
        group per distinct set of processes; a process may hold several positions)."""
        keys = []
        for b in range(1, n + 1):
            for g in plan_groups(b, n):
                if len(g.ranks) < 2 or not any(r in self.remote for r in g.ranks):
                    continue
                key = tuple(sorted({self.dist_rank[r] for r in g.ranks}))
                if key not in keys:
                    keys.append(key)
        return tuple(keys)

    def owner_proc(self, index: int) -> int:
        return self.dist_rank[self.owners[index]]

    def layout(self, index: int, block) -> WeightLayout:
        lay = self._layouts.get(index)
        if lay is None:
            lay = self._layouts[index] = WeightLayout(block)
        return lay

    # ---- main thread ---------------------------------------------------------------------------
    def begin_forward(self, groups) -> None:
        self.session = self.source.session_for(self.names, self.group_keys, self.backend, self.devices)
        self._fid = next(_FORWARDS)
        self._sent = {n: {} for n in self.names}
        self.bytes_sent = {n: 0 for n in self.names}
        self.weight_bytes = {n: 0 for n in self.names}
        self.streamed_bytes = {n: 0 for n in self.names}
        self._mentioned = {n: set() for n in self.names}
        self._host_sent = set()
        self._host_works = []
        self.order = CollectiveOrder(self.session.timeout_s, self.engine.pool)
        self._exchangers = set()
        self._owned_sent = {n: [] for n in self.names}

    def end_forward(self, ok: bool) -> None:
        s = self.session
        try:
            if ok and s is not None and not s.broken:
                self._wait_host_works(0)
        except DistWorkerError:
            ok = False
            raise
        finally:
            self._host_works = []
            for name, sent in self._owned_sent.items():
                if sent and s is not None:
                    log.info("[ShardDiT] %s: sent the weights of its blocks %s (new or changed)", s.label(name),
                             sorted(sent))
            if s is not None and (not ok or s.broken):
                s.broken = True  # a failed forward leaves the ranks out of step: no 'leave', just close
                self.source.close_session()
            self.session = None

    def exchange(self, group, pool=None):
        """The exchange the host's threads of ``group`` share: in-process when every rank is local,
        a ``DistExchange`` when some are workers, None when none is local (nothing to share)."""
        local = [r for r in group.ranks if r not in self.remote]
        if not local:
            return None
        if len(local) == len(group.ranks):
            return self.local.exchange(group, pool)
        key = tuple(sorted({self.dist_rank[r] for r in group.ranks}))
        peers = [self._label(r) for r in group.ranks]
        devices = {group.ranks.index(r): self.engine.devices[r] for r in local}
        for r in local:
            self.order.add_exchanger(r)
            self._exchangers.add(r)
        return DistExchange(self.session.groups[key], [self.dist_rank[r] for r in group.ranks], devices, peers,
                            self.session.timeout_s, self.backend, pool, self.order)

    def _label(self, rank: int) -> str:
        name = self.remote.get(rank)
        return self.session.label(name) if name else f"the host (rank 0, {self.engine.devices[rank]})"

    # ---- a rank's thread ------------------------------------------------------------------------
    def run_block(self, fwd, rank, index: int, block, args: list, kwargs: dict, stream_names, nxt=None) -> None:
        """A local rank computes here; a remote rank's thread sends its worker the block command."""
        if rank.slice.rank in self.remote:
            self._run_remote(fwd, rank, index, block, args, kwargs, stream_names, nxt)
        elif rank.slice.rank in self._exchangers:
            with self.order.exchanging(rank.slice.rank, rank.blocks_run):
                self.local.run_block(fwd, rank, index, block, args, kwargs, stream_names, nxt)
        else:
            self.local.run_block(fwd, rank, index, block, args, kwargs, stream_names, nxt)

    def rows(self, fwd, rank: int, name: str, pool) -> torch.Tensor:
        """A local rank's rows, or a worker's fetched over its thread (``fetch``)."""
        if rank not in self.remote:
            return self.local.rows(fwd, rank, name, pool)
        return pool.wait(pool.submit(rank, lambda: self.fetch(rank, name), f"returning {name!r}"), rank)

    def _run_remote(self, fwd, rank, index: int, block, values: list, kwvalues: dict, stream_names, nxt) -> None:
        name = self.remote[rank.slice.rank]
        s = self.session
        blocks = [(index, block)] + ([tuple(nxt)] if nxt is not None else [])
        skeletons, owned, plan, updated = {}, {}, {}, []  # skeletons: block descriptions (never modules)
        for idx, blk in blocks:
            if idx in self._mentioned[name]:
                continue
            self._mentioned[name].add(idx)
            key = (self.key, idx)
            if key not in s.skeletons[name]:
                skeletons[idx] = self._description(idx, blk)
            plan[idx] = self._transfer(idx)
            if self.keep_all or self.owners[idx] == rank.slice.rank:
                version = self.version_of(idx, blk)
                if not same_version(s.versions[name].get(key), version):
                    owned[idx] = pack_block(blk, self.layout(idx, blk))
                    self.weight_bytes[name] += owned[idx].numel()
                    updated.append((key, version))
                    self._owned_sent[name].append(idx)
            elif plan[idx] is not None:
                nbytes = self.layout(idx, blk).nbytes
                self.weight_bytes[name] += nbytes
                self.streamed_bytes[name] += nbytes
        msg = {"op": "block", "fid": self._fid, "key": self.key, "index": index,
               "blocks": [[i, d] for i, d in skeletons.items()], "owned": [[i, f] for i, f in owned.items()],
               "transfers": [[i, p] for i, p in plan.items()],
               "args": [self._encode(name, v) for v in values],
               "kwargs": [[k, self._encode(name, v)] for k, v in kwvalues.items()],
               "streams": list(stream_names), "slice": _slice_data(rank.slice), "main": fwd.main,
               "text_first": fwd.text_first,
               "group": [self.dist_rank[r] for r in rank.slice.group.ranks],
               "peers": [self._label(r) for r in rank.slice.group.ranks],
               "grad": torch.is_grad_enabled(), "inference": torch.is_inference_mode_enabled()}
        what = f"block {index}" + (" (receiving the weights of the blocks it owns)" if owned else "")
        sent = s.send(name, msg, what)
        if rank.slice.rank == self.designated:
            with self.order.weights(rank.blocks_run):  # after every exchange of the step before
                self._host_broadcasts(blocks)
        s.receive(name, what)
        self.bytes_sent[name] += sent
        for key, version in updated:
            s.versions[name][key] = version
        s.skeletons[name].update((self.key, i) for i in skeletons)
        for n in stream_names:
            rank.streams[n] = RemoteStream(n)
        rank.blocks_run += 1

    def _description(self, index: int, block) -> dict:
        desc = self._descriptions.get(index)
        if desc is None:
            describe = None if self.describe is None else (lambda b: self.describe(index, b))
            desc = self._descriptions[index] = describe_block(block, describe)
        return desc

    def _transfer(self, index: int):
        """How block ``index`` reaches the workers that do not keep it (``transfer_group``), or
        None when none needs it (every worker keeps every block, or its only worker owns it)."""
        return None if self.keep_all else transfer_group(self.owner_proc(index), len(self.names))

    def _host_broadcasts(self, blocks) -> None:
        """The host's side of the weight broadcasts of host-owned blocks (same rule as the workers':
        each block once per forward, at its first mention)."""
        s = self.session
        for idx, blk in blocks:
            if idx in self._host_sent:
                continue
            self._host_sent.add(idx)
            if self._transfer(idx) != ("all", 0):
                continue
            flat = pack_block(blk, self.layout(idx, blk), self.wire)
            try:
                work = self.order.post(f"broadcast of block {idx}", lambda flat=flat: s.broadcast(flat, 0, "all"))
            except Exception as e:
                raise self._weights_error(idx, e) from e
            self._host_works.append((idx, flat, work))
            self._wait_host_works(_IN_FLIGHT)

    def _wait_host_works(self, keep: int) -> None:
        while len(self._host_works) > keep:
            idx, _, work = self._host_works.pop(0)
            try:
                self.session.wait(work)
            except Exception as e:
                raise self._weights_error(idx, e) from e

    def _weights_error(self, idx: int, e: Exception) -> DistWorkerError:
        s = self.session
        s.broken = True
        return DistWorkerError(f"sending block {idx}'s weights to {', '.join(map(s.label, self.names))} "
                               f"failed (a worker is dead, hung or unreachable; timeout {s.timeout_s:.0f} s): "
                               f"{type(e).__name__}: {(str(e).splitlines() or [''])[0]}")

    def fetch(self, rank: int, stream: str) -> torch.Tensor:
        name = self.remote[rank]
        _, answer = self.session.request(name, {"op": "fetch", "name": stream}, f"returning {stream!r}",
                                         FETCH_LIMIT)
        if answer["op"] != "tensor" or not isinstance(answer["tensor"], torch.Tensor):
            raise DistWorkerError(f"{self.session.label(name)} answered {answer['op']!r} to 'fetch'")
        return answer["tensor"]

    def close(self) -> None:
        """The model is released: the workers drop its blocks (best effort; a closed or broken
        session took them already), and the session forgets that they hold them. ComfyUI may
        sample the same sharded model again (the shipped workflows do, whenever a new prompt
        switches clones): its blocks are then sent again. Without forgetting, every second prompt
        failed with "block 0: its weights were not sent to this worker" (issue 19)."""
        s = self.source.session
        if s is None or s.broken or self.session is not None:
            return
        for name in self.names:
            if name in s.names:
                s.forget(name, self.key)
                try:
                    s.request(name, {"op": "drop", "key": self.key}, "dropping a released model's blocks")
                except DistWorkerError as e:
                    log.warning("%s", e)
                    self.source.close_session()
                    return

    def held_bytes(self, rank: int) -> dict:
        """What the worker of ``rank`` holds now (between forwards, in the open session): bytes of
        the blocks it owns and of its receive ring."""
        _, answer = (self.session or self.source.session).request(self.remote[rank], {"op": "held"}, "reporting its memory")
        return {k: v for k, v in answer.items() if k != "op"}

    def _encode(self, name: str, value):
        if isinstance(value, RemoteStream):
            return ("stream", value.name)
        if isinstance(value, dict):  # transformer_options: plain entries only, the worker adds its hook
            if getattr(value.get(ATTENTION_OVERRIDE), "prev", None) is not None:
                raise InputError("another attention override is installed; it cannot run on workers "
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
            "group": {"index": g.index, "batch": tuple(g.batch), "ranks": tuple(g.ranks),
                      "shares": None if g.shares is None else list(g.shares)}}


def _compact(v):
    """``v`` with every tensor view copied to its own storage (the wire sends a tensor's own
    bytes; the copy keeps a rank's token range apart from the storage it looks into)."""
    return map_tensors(lambda t: t.clone() if t.untyped_storage().nbytes() > t.numel() * t.element_size() else t,
                       v, dicts=False)


def _has_tensor(v) -> bool:
    return next(tensors_in(v, dicts=False), None) is not None


def _plain(v, depth: int = 2) -> bool:
    if v is None or isinstance(v, (bool, int, float, str, torch.Tensor)):
        return True
    if depth and isinstance(v, (tuple, list)):
        return all(_plain(x, depth - 1) for x in v)
    if depth and isinstance(v, dict):
        return all(isinstance(k, str) and _plain(x, depth - 1) for k, x in v.items())
    return False


def attach_remote_ranks(engine, source, remote: dict[int, str], devices: dict[str, str],
                        backend: str = "gloo", owners: dict[int, int] | None = None, version_of=None,
                        keep_all: bool = False, describe=None) -> DistRanks:
    """Make ``remote`` (engine rank -> worker name) ranks of ``engine`` run in those workers;
    ``owners``: block index -> the engine rank that owns it (default: equal contiguous shares);
    ``keep_all``: every worker keeps every block instead of its share; ``describe``: see ``DistRanks``."""
    runner = DistRanks(engine, source, remote, devices, backend, owners, version_of, keep_all, describe)
    return engine.use_runner(runner, timeout_s=source.timeout_s * 2 + 30)  # the session's own timeout fires first
