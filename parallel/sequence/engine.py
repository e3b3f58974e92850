"""`sequence` mode: every rank computes every block on its share of the batch and tokens (pure).

The DiT's own forward runs unchanged on the main thread. Its block calls reach ``run_block`` (via
the block proxies and ``BlockRouter``), which:

1. *scatters* a stream argument that arrives whole (first block of a list, or after inter-block
   code): each rank takes its batch group and token range (``split``);
2. queues the block on every rank's thread (``threads.RankThreads``) and returns at once with
   *placeholders* (meta tensors of the whole output's shape), so the main thread runs ahead and the
   rank threads never wait for it; a placeholder passed to the next block means "each rank's own
   rows", nothing moves;
3. *gathers* the rows into a real tensor on the home device where code outside the blocks reads the
   hidden state: after the last block of each list, after ``return_home_after`` blocks, and before
   a block-replacement patch (``materialize``).

Where a rank runs is the ``RankRunner``'s business (``interfaces``): ``local.LocalRanks`` (threads
of this process, the default) or ``distributed.ranks.DistRanks`` (some ranks in worker processes);
the engine treats every rank and every batch group's ``Exchange`` the same way. Inside a block its
self-attention, identified by the module that calls it (``rank_block``), runs as Ulysses attention
over the group's exchange (``rank_block.BlockAttention``: the user's attention function, the
checkpoint's preferred one, or the override another pack installed, on all tokens of the rank's
share of the heads; on GPU ranks of this process pipelined by head chunks, the exchange of one
chunk beside the attention of another: ``ulysses``); its other calls run locally.

A rank that does not own a block streams it (``stream.BlockStream``) and prefetches the next
once the current block's kernels are queued; the order rules of those copies are in ``stream``.
"""
from __future__ import annotations

import contextlib
import functools
import inspect
import logging
import threading
from dataclasses import dataclass, field

import torch

from ..tensor_map import map_tensors, rebuild, tensors_in
from .frames import cut_frame_rows
from .interfaces import RankRunner
from .local import LocalRanks
from .rank_block import ATTENTION_OVERRIDE, BlockAttention, with_attention
from .split import (Group, RankSlice, TokenSpec, cut_row_table, plan_groups, rank_slices, split_arg,
                    split_items, stream_parts)
from .stream import BlockStream, begin_forward, end_forward
from .threads import RankThreadError, RankThreads
from ..errors import InputError, RunError

__all__ = ["SequenceEngine", "SequenceStats", "SequenceUnsupported", "attach_sequence_engine"]

log = logging.getLogger("sharddit")


class SequenceUnsupported(ValueError):
    """This block call cannot run split (the caller runs it whole, in ``blocks`` mode)."""


@dataclass
class SequenceStats:
    """Counters of the last forward (tests and benchmarks read them)."""

    groups: list[tuple[tuple[int, int], tuple[int, ...]]] = field(default_factory=list)
    """Per batch group: (batch range, ranks)."""
    blocks_run: list[int] = field(default_factory=list)
    bytes_exchanged: list[int] = field(default_factory=list)
    """Bytes each rank received from other ranks in attention exchanges."""
    bytes_sent: list[int] = field(default_factory=list)
    """Bytes each host rank sent to worker processes in attention exchanges (distributed mode)."""
    exchanges: list[int] = field(default_factory=list)
    """All-to-all calls per rank."""
    bytes_streamed: list[int] = field(default_factory=list)
    """Block weight bytes each rank copied from the block's owner."""
    scatters: int = 0
    gathers: int = 0
    fallbacks: int = 0
    """Block calls run whole (``blocks`` mode) because they could not be split."""
    tokens: list[tuple[int, int]] = field(default_factory=list)
    """Per rank: its token range (``set_speeds`` shapes them)."""


class _Rank:
    """Per-rank state of one forward (touched only by that rank's thread once queued)."""

    def __init__(self, rs: RankSlice, device, stream: BlockStream):
        self.slice, self.device, self.stream = rs, device, stream
        self.streams: dict[str, torch.Tensor] = {}
        self.cache: dict[int, tuple] = {}
        self.attentions: list[BlockAttention] = []
        """This rank's attention overrides of this forward (one per ``transformer_options`` dict)."""
        self.blocks_run = 0


class _Forward:
    def __init__(self, engine: SequenceEngine, batch: int, main: int):
        self.batch, self.main, self.tail = batch, main, 0
        self.text_first = any(s.text_first for s in engine.token_specs)
        self.unbatched = any(s.unbatched for s in engine.token_specs)
        n = len(engine.devices)
        self.groups: list[Group] = plan_groups(batch, n, engine.speeds)
        self.ranks = [_Rank(rs, engine.devices[rs.rank], engine.streams[rs.rank])
                      for rs in rank_slices(self.groups, main)]
        engine.runner.begin_forward(self.groups)
        self.exchanges = {}
        for g in self.groups:
            ex = engine.runner.exchange(g, engine.pool) if len(g.ranks) > 1 else None
            if ex is not None:
                self.exchanges[g.index] = ex
        self.placeholders: dict[int, tuple[torch.Tensor, str]] = {}
        self.pending: list = [None] * n


class SequenceEngine:
    """Runs registered blocks split over ``devices`` (one rank per entry; ``cpu,cpu`` is two)."""

    def __init__(self, layout, token_specs: tuple[TokenSpec, ...], devices, home, timeout_s: float = 600.0,
                 worker_context=None, serialize: bool = False, *, should_stop=None,
                 interrupt_exceptions: tuple[type, ...] = (), split_check=None, runner=None):
        """``should_stop``: called before each block, on the main thread and on every rank thread
        (ComfyUI: raises if the user interrupted), so an interrupt stops every rank at its next block;
        ``interrupt_exceptions``: the types it raises, re-raised as they are, not as a rank thread
        error; ``split_check``: see ``set_split_check``; ``runner``: where the ranks run, a factory
        ``runner(engine) -> RankRunner`` (a runner such as ``distributed.ranks.DistRanks`` needs the
        engine it serves); None: ``local.LocalRanks``, threads here. A runner chosen after the engine
        is built (workers join it last) arrives through ``use_runner``."""
        if len(token_specs) != len(layout.block_lists):
            raise InputError(f"{len(token_specs)} token specs for {len(layout.block_lists)} block lists")
        self.layout, self.token_specs = layout, tuple(token_specs)
        self.devices = tuple(torch.device(d) for d in devices)
        self.home = torch.device(home)
        self.timeout_s = timeout_s
        self.worker_context = worker_context
        self.serial_lock = threading.Lock() if serialize else None
        """Dry runs on fake devices: threads take turns (``RankThreads.serial_lock``)."""
        self._should_stop = should_stop
        self._split_check = split_check
        self._interrupt_exceptions = tuple(interrupt_exceptions)
        self.streams = [BlockStream(d) for d in self.devices]
        self.pool: RankThreads | None = None
        self._fwd: _Forward | None = None
        self._scoped = False
        self._runner: RankRunner = LocalRanks(self.devices) if runner is None else runner(self)
        self.stats = SequenceStats()
        self._names: dict[type, list[str]] = {}
        self._next: dict[int, tuple] = {}
        self.order: tuple[int, ...] = ()
        self._warned: set[str] = set()
        self.speeds: tuple[float, ...] | None = None
        """One relative speed per rank (``set_speeds``): a faster rank gets more tokens and heads."""

    @property
    def runner(self) -> RankRunner:
        """Where the ranks run: threads here (``local.LocalRanks``), or
        (``distributed.ranks.attach_remote_ranks``) some in worker processes. Read-only: a new
        runner comes through the constructor or ``use_runner``."""
        return self._runner

    def use_runner(self, runner: RankRunner, timeout_s: float | None = None) -> RankRunner:
        """Run the ranks with ``runner`` from the next forward on (the one way to change it after
        the constructor: workers join an engine that is already built, and their runner needs the
        engine); the previous runner is closed. ``timeout_s``: the engine's timeout becomes at least
        this (a runner whose own timeout must fire first). Refused inside a forward."""
        if self._scoped or self._fwd is not None:
            raise RunError("the sequence engine's runner cannot change inside a forward; "
                           "change it between forwards")
        previous, self._runner = self._runner, runner
        if previous is not runner:
            previous.close()
        if timeout_s is not None:
            self.timeout_s = max(self.timeout_s, timeout_s)
        return runner

    def set_split_check(self, split_check) -> None:
        """``split_check()``, called before each block on the main thread, returns a reason this block
        call cannot run split now (it then runs whole, in ``blocks`` mode, and the reason is logged
        once), or None; ``split_check`` None: no check. A method, not only a constructor argument:
        ComfyUI's compiler state (``loaders/comfy/shard/compile_guard``) is read anew at each forward,
        after the engine is built, so the check is set per forward, before its first block."""
        self._split_check = split_check

    def keep_resident(self, budgets) -> None:
        """Per rank, bytes of the blocks it streams that it may keep as resident copies across
        forwards (``stream.BlockStream.keep_resident``); 0 everywhere: the ring alone (the default)."""
        budgets = list(budgets)
        if len(budgets) != len(self.streams) or any(b < 0 for b in budgets):
            raise InputError(f"resident budgets {budgets} must be {len(self.streams)} byte counts >= 0")
        for stream, budget in zip(self.streams, budgets, strict=True):
            stream.keep_resident(budget)

    def drop_resident(self, device=None) -> int:
        """Give the resident copies' memory back; bytes freed. All of them (the run ended: the next
        forward streams, and keeps again), or those of the ranks on ``device`` (ComfyUI needs room
        there: the copies are a cache), whose budget then stays 0 until the next run sets it."""
        freed = 0
        for stream in self.streams:
            if device is None:
                freed += stream.resident_bytes()
                stream.drop_resident()
            elif str(stream.place) == str(device):
                freed += stream.resident_bytes()
                stream.keep_resident(0)
        return freed

    def set_speeds(self, speeds) -> None:
        """Token and head shares per rank proportional to ``speeds`` (None or all equal: even).
        The maths of each rank is unchanged: it still gets one contiguous token range."""
        if speeds is not None:
            speeds = tuple(float(s) for s in speeds)
            if len(speeds) != len(self.devices) or any(not (s > 0) for s in speeds):
                raise InputError(f"speeds {speeds} must be {len(self.devices)} positive numbers, "
                                 f"one per rank ({', '.join(map(str, self.devices))})")
        self.speeds = speeds

    # ---- lifecycle ---------------------------------------------------------------------------
    def register_order(self, order: list[tuple[int, torch.nn.Module]]) -> None:
        """The blocks in execution order, so a rank can prefetch the one after the current."""
        self._next = {order[i][0]: order[i + 1] for i in range(len(order) - 1)}
        self.order = tuple(i for i, _ in order)

    @contextlib.contextmanager
    def forward_scope(self):
        if self._scoped:
            yield self
            return
        self._scoped, self._fwd = True, None
        self.stats = SequenceStats()
        ok = False
        if self.serial_lock is not None:
            self.serial_lock.acquire()
        try:
            yield self
            ok = True
        finally:
            try:
                self._finish(ok)
            finally:
                if self.serial_lock is not None:
                    self.serial_lock.release()

    def close(self) -> None:
        """Stop the rank threads and drop the weight buffers (the model is being released)."""
        if self.pool is not None:
            self.pool.close()
            self.pool = None
        for s in self.streams:
            s.release()
        self.runner.close()

    def _finish(self, ok: bool) -> None:
        fwd, self._fwd, self._scoped = self._fwd, None, False
        try:
            self._finish_ranks(ok, fwd)
        finally:
            if fwd is not None:
                self.runner.end_forward(ok and self.pool is not None)

    def _finish_ranks(self, ok: bool, fwd) -> None:
        try:
            if ok and fwd is not None:
                self._wait_all(fwd)
                end_forward(self.streams)  # ComfyUI's next patch of an owner's weights waits for our copies
        except BaseException:
            ok = False
            raise
        finally:
            if not ok and self.pool is not None:  # stop every rank thread now, join them, start fresh next time
                if self.serial_lock is not None:
                    self.serial_lock.release()  # a rank thread waiting for its turn must see the abort
                try:
                    self.pool.close()
                finally:
                    if self.serial_lock is not None:
                        self.serial_lock.acquire()
                self.pool = None
            if fwd is not None:
                self._fill_stats(fwd)

    def _fill_stats(self, fwd: _Forward) -> None:
        n = len(self.devices)
        st = self.stats
        st.groups = [(g.batch, g.ranks) for g in fwd.groups]
        st.blocks_run = [r.blocks_run for r in fwd.ranks]
        st.tokens = [tuple(r.slice.tokens) for r in fwd.ranks]
        st.bytes_exchanged, st.exchanges, st.bytes_sent = [0] * n, [0] * n, [0] * n
        for g in fwd.groups:
            ex = fwd.exchanges.get(g.index)
            for pos, r in enumerate(g.ranks):
                if ex is not None:
                    st.bytes_exchanged[r], st.exchanges[r] = ex.bytes_received[pos], ex.calls[pos]
                    st.bytes_sent[r] = ex.bytes_sent[pos]
        st.bytes_streamed = [s.bytes_copied - b for s, b in zip(self.streams, self._stream_base, strict=True)]

    # ---- main thread: block calls ------------------------------------------------------------
    def run_block(self, slot, block, args: tuple, kwargs: dict, home_after: bool, run_whole):
        """Queue ``block`` on every rank; placeholders back, or the gathered output if
        ``home_after``. ``run_whole(args, kwargs)`` runs a call that cannot be split."""
        if self._should_stop is not None:
            self._should_stop()
        spec = self.token_specs[slot.list_index]
        if spec.whole:  # by design (``TokenSpec.whole``): no fallback to report
            return run_whole(self.materialize(args), self.materialize(kwargs))
        names = self._param_names(block)
        try:
            reason = self._split_check() if self._split_check is not None else None
            if reason:
                raise SequenceUnsupported(reason)
            fwd = self._prepare(spec, names, args, kwargs)
        except SequenceUnsupported as e:
            self._note_fallback(str(e))
            return run_whole(self.materialize(args), self.materialize(kwargs))
        streams = self._stream_values(slot, names, args, kwargs)
        parts = stream_parts(streams)  # a tuple stream (LTX-2's (video, audio)) item by item
        outs = {}
        for name, value in parts.items():
            outs[name] = torch.empty(value.shape, dtype=value.dtype, device="meta")
            fwd.placeholders[id(outs[name])] = (outs[name], name)
        if any(id(v) not in fwd.placeholders for v in parts.values()):
            self.stats.scatters += 1
        nxt = self._next.get(slot.index)
        for rank in fwd.ranks:
            fn = functools.partial(self._rank_block, fwd, rank, spec, names, slot.index, block, args, kwargs,
                                   tuple(parts), nxt)
            fwd.pending[rank.slice.rank] = self.pool.submit(rank.slice.rank, fn, f"block {slot.index}")
        out = tuple(rebuild(v, [outs[f"{n}.{i}"] for i in range(len(v))]) if isinstance(v, (tuple, list))
                    else outs[n] for n, v in streams.items())
        if home_after:
            out = tuple(map_tensors(functools.partial(self._gather, fwd), o, dicts=False) for o in out)
        return out[0] if len(out) == 1 else out

    def materialize(self, obj, depth: int = 2):
        """``obj`` with every placeholder replaced by the gathered tensor (tensor/tuple/list/dict,
        ``depth`` container levels deep)."""
        fwd = self._fwd
        if fwd is None:
            return obj
        return map_tensors(lambda t: self._gather(fwd, t) if id(t) in fwd.placeholders else t, obj, depth)

    def _prepare(self, spec: TokenSpec, names, args, kwargs) -> _Forward:
        """The forward's split (made at its first block); checks this call can be split."""
        values = dict(zip(names, args)) | kwargs
        fwd = self._fwd
        for name in spec.must_be_none:
            if values.get(name) is not None:
                raise SequenceUnsupported(f"argument {name!r} is set (not split yet)")
        if spec.tail_stream and isinstance(values.get(spec.tail_stream), torch.Tensor) and fwd is not None \
                and id(values[spec.tail_stream]) not in fwd.placeholders:
            fwd.tail = values[spec.tail_stream].shape[1]
        if spec.gather_kv and not isinstance(self.runner, LocalRanks):
            raise SequenceUnsupported("cross-modal attention over worker processes is not split yet")
        if fwd is None:
            name = next((n for n in spec.token_dims if n not in spec.replicated_streams
                         and isinstance(split_items(spec, n, values.get(n))[0], torch.Tensor)), None)
            primary = split_items(spec, name, values.get(name))[0] if name else None
            if primary is None or primary.dim() < 2:
                raise SequenceUnsupported("no token-carrying hidden state found")
            # [B, L, ...], or one sample's [L, ...] (``TokenSpec.unbatched``)
            batch, main = (1, primary.shape[spec.token_dims[name]]) if spec.unbatched else primary.shape[:2]
            _check_every_rank_has_tokens(batch, main, len(self.devices))
            if self.pool is None:
                self.pool = RankThreads(self.devices, self.timeout_s, self.worker_context, self.serial_lock)
            self._stream_base = [s.bytes_copied for s in self.streams]
            fwd = self._fwd = _Forward(self, batch, main)
            begin_forward(self.streams)  # the rings wait for what ComfyUI queued on the owners so far
            if spec.tail_stream and isinstance(values.get(spec.tail_stream), torch.Tensor):
                fwd.tail = values[spec.tail_stream].shape[1]
        for name, dim in spec.token_dims.items():
            for v in split_items(spec, name, values.get(name)):
                if v is not None and id(v) not in fwd.placeholders:
                    _check_tokens(v, dim, fwd.main, fwd.tail, name)
        for name in spec.frame_tables:
            _check_frames(values.get(name), fwd.main, name)
        return fwd

    def _stream_values(self, slot, names, args, kwargs) -> dict:
        values = dict(zip(names, args)) | kwargs
        out = {}
        for a in self.layout.stream_args[slot.list_index]:
            name = a if isinstance(a, str) else names[a]
            out[name] = values[name]
        return out

    def _gather(self, fwd: _Forward, ph: torch.Tensor) -> torch.Tensor:
        """Wait for every rank, then build the whole tensor for placeholder ``ph`` on home."""
        _, name = fwd.placeholders[id(ph)]
        self._wait_all(fwd)
        self.stats.gathers += 1
        full = torch.empty(ph.shape, dtype=ph.dtype, device=self.home)
        whole = full.unsqueeze(0) if fwd.unbatched else full  # [B, L, ...] either way (a view)
        for g in fwd.groups:
            b0, b1 = g.batch
            for pos, r in enumerate(g.ranks):
                local = self.runner.rows(fwd, r, name, self.pool)
                local = local.unsqueeze(0) if fwd.unbatched else local
                replicated = name in self._replicated(fwd)
                if replicated or len(g.ranks) == 1:
                    if pos == 0:
                        whole[b0:b1].copy_(local)
                    continue
                t0, t1 = fwd.ranks[r].slice.tokens
                mine = t1 - t0
                text = local.shape[1] - mine  # the replicated text tokens this stream carries (0: none)
                if fwd.text_first:  # [text, rows]
                    whole[b0:b1, text + t0:text + t1].copy_(local[:, text:])
                    if pos == 0 and text:  # the text, once per group
                        whole[b0:b1, :text].copy_(local[:, :text])
                else:  # [rows, text]
                    whole[b0:b1, t0:t1].copy_(local[:, :mine])
                    if pos == 0 and text:
                        whole[b0:b1, fwd.main:].copy_(local[:, mine:])
        return full

    def _replicated(self, fwd) -> set[str]:
        return ({n for s in self.token_specs for n in s.replicated_streams}
                | {f"{n}.{i}" for s in self.token_specs for n, items in s.whole_parts.items() for i in items})

    def _wait_all(self, fwd: _Forward) -> None:
        if self.serial_lock is not None:
            self.serial_lock.release()
        try:
            for r, task in enumerate(fwd.pending):
                if task is not None:
                    self.pool.wait(task, r)
            self.pool.raise_failure()
        except RankThreadError as e:
            if isinstance(e.__cause__, self._interrupt_exceptions):
                raise e.__cause__ from None
            raise
        finally:
            if self.serial_lock is not None:
                self.serial_lock.acquire()

    def _param_names(self, block) -> list[str]:
        fn = block.forward
        key = type(block)
        if key not in self._names:
            params = inspect.signature(fn).parameters.values()
            self._names[key] = [p.name for p in params
                                if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
        return self._names[key]

    def _note_fallback(self, why: str) -> None:
        self.stats.fallbacks += 1
        if why not in self._warned:
            self._warned.add(why)
            log.warning("[ShardDiT] sequence mode: a block call runs whole (blocks mode): %s", why)

    # ---- rank threads ------------------------------------------------------------------------
    def _rank_block(self, fwd, rank: _Rank, spec, names, index, block, args, kwargs, stream_names, nxt):
        if self._should_stop is not None:
            self._should_stop()
        values_args = [self._local(fwd, rank, spec, stream_names, names[i] if i < len(names) else None, a)
                       for i, a in enumerate(args)]
        values_kwargs = {k: self._local(fwd, rank, spec, stream_names, k, v) for k, v in kwargs.items()}
        self.runner.run_block(fwd, rank, index, block, values_args, values_kwargs, stream_names, nxt)

    def _local(self, fwd, rank: _Rank, spec: TokenSpec, stream_names, name, value):
        """This rank's version of one block argument (cached per forward for constants)."""
        entry = fwd.placeholders.get(id(value))
        if entry is not None and entry[0] is value:
            return rank.streams[entry[1]]
        if name == "transformer_options" and isinstance(value, dict):
            return self._cached(rank, value, lambda: self._rank_options(fwd, rank, value, spec.gather_kv))
        if name in spec.frame_tables:
            return self._cached(rank, value, lambda: _to_rank(cut_frame_rows(value, rank.slice, fwd.batch, fwd.main,
                                                                              name), rank.device, False))
        if isinstance(value, (tuple, list)) and f"{name}.0" in stream_names:  # a tuple stream, item by item
            return rebuild(value, [self._stream_item(fwd, rank, spec, name, i, v) for i, v in enumerate(value)])
        if not isinstance(value, (torch.Tensor, tuple, list)):
            return value
        if name in spec.row_tables:
            return self._cached(rank, value, lambda: _to_rank(cut_row_table(value, rank.slice, fwd.main, fwd.tail,
                                                                             name), rank.device, False))
        is_stream = name in stream_names
        dim = None if name in spec.replicated_streams else spec.token_dims.get(name)
        make = functools.partial(_to_rank, split_arg(value, dim, rank.slice, fwd.batch, fwd.main, fwd.tail,
                                                      name or "?", fwd.text_first), rank.device, is_stream)
        return make() if is_stream else self._cached(rank, value, make)

    def _stream_item(self, fwd, rank: _Rank, spec: TokenSpec, name: str, i: int, value):
        """This rank's item ``i`` of tuple stream ``name``: its own rows, or (arriving whole) its cut:
        split on the stream's token dim, or whole (``TokenSpec.whole_parts``); always a fresh copy."""
        entry = fwd.placeholders.get(id(value))
        if entry is not None and entry[0] is value:
            return rank.streams[entry[1]]
        dim = None if i in spec.whole_parts.get(name, ()) else spec.token_dims.get(name)
        return _to_rank(split_arg(value, dim, rank.slice, fwd.batch, fwd.main, fwd.tail, f"{name}.{i}",
                                  fwd.text_first), rank.device, True)

    @staticmethod
    def _cached(rank: _Rank, value, make):
        hit = rank.cache.get(id(value))
        if hit is not None and hit[0] is value:
            return hit[1]
        out = make()
        rank.cache[id(value)] = (value, out)
        return out

    @staticmethod
    def _rank_options(fwd, rank: _Rank, options: dict, gather_kv: tuple[str, ...] = ()) -> dict:
        """``transformer_options`` with this rank's attention override (``rank_block``)."""
        attention = BlockAttention(fwd.exchanges.get(rank.slice.group.index), rank.slice, fwd.main, fwd.text_first,
                                   options.get(ATTENTION_OVERRIDE), gather_kv)
        rank.attentions.append(attention)
        return with_attention(options, attention)


def _check_every_rank_has_tokens(batch: int, main: int, n_ranks: int) -> None:
    """SequenceUnsupported when a rank would get no image token (a one-token latent at cfg 1 on
    two ranks): Ulysses has nothing to exchange for it. The forward then runs whole (blocks mode:
    the unsplit forward's result); such a latent is tiny, so nothing is lost by not splitting it."""
    per_group = n_ranks // len(plan_groups(batch, n_ranks))
    if main < per_group:
        raise SequenceUnsupported(f"{main} image token(s) per sample, fewer than the {per_group} ranks that split "
                                  f"each sample's tokens (batch {batch} on {n_ranks} ranks); a rank would get none. "
                                  f"A latent of {per_group} tokens or more splits (or use fewer devices)")


def _check_frames(value, main: int, name: str) -> None:
    """SequenceUnsupported unless ``value`` (``TokenSpec.frame_tables``) covers ``main`` tokens."""
    if value is None or isinstance(value, torch.Tensor):
        if value is not None:
            _check_token_dim(value, 1, main, 0, name)
        return
    frames, per = getattr(getattr(value, "data", None), "shape", (0, 0))[1], getattr(value, "patches_per_frame", 0)
    if frames * per != main and (frames, per) != (1, 1):
        raise SequenceUnsupported(f"argument {name!r} has {frames} rows of {per} tokens, expected {main} tokens")


def _check_tokens(value, dim: int, main: int, tail: int, name: str) -> None:
    for v in tensors_in(value, dicts=False):
        _check_token_dim(v, dim, main, tail, name)


def _check_token_dim(v: torch.Tensor, dim: int, main: int, tail: int, name: str) -> None:
    d = dim if dim >= 0 else v.dim() + dim
    if d >= v.dim():
        raise SequenceUnsupported(f"argument {name!r} has {v.dim()} dims, token dim {dim}")
    size = v.shape[d]
    if size not in (1, main) and not (tail and size == main + tail):
        raise SequenceUnsupported(f"argument {name!r} has {size} tokens on dim {d}, expected {main}"
                                  + (f" or {main + tail}" if tail else "") + " or 1")


def _to_rank(obj, device, fresh: bool):
    """``obj`` on ``device``; stream tensors always as a fresh copy (blocks may update them in
    place, e.g. LTXV's ``x += ...``, which must not write into the caller's tensor)."""
    def move(t: torch.Tensor) -> torch.Tensor:
        if t.device != device:
            return t.to(device, non_blocking=device.type == "cuda")
        return t.clone() if fresh else t
    return map_tensors(move, obj, dicts=False)


def attach_sequence_engine(router, proxies, token_specs, devices, timeout_s: float = 600.0,
                           worker_context=None, serialize: bool = False, **collaborators) -> SequenceEngine:
    """Give ``router`` a ``SequenceEngine`` over ``devices`` (one rank per entry) for the blocks
    behind ``proxies`` (``BlockProxy`` objects, any order); returns it. ``collaborators``: the
    engine's keyword arguments (``should_stop``, ``interrupt_exceptions``, ``split_check``, ``runner``)."""
    engine = SequenceEngine(router.layout, token_specs, devices, router.home, timeout_s, worker_context, serialize,
                            **collaborators)
    order = sorted(((p.block_index, p.real_block) for p in proxies), key=lambda t: t[0])
    engine.register_order(order)
    router.use_engine(engine)
    return engine
