"""Per-forward routing of block arguments between devices (pure PyTorch, no ComfyUI).

How a block call is routed (``BlockRouter.run_block``):

- **Stream** arguments (the hidden state(s) that change block to block, named per block list in
  ``BlockLayout.stream_args``: Wan ``x``, HunyuanVideo double ``img``/``txt``) move to the block's
  device only when they are elsewhere: one *hop* per block call that moved anything.
- **Every other tensor** argument (timestep modulation, rotary freqs or a ``(cos, sin)`` tuple,
  text context, masks, tensors inside dict/list/tuple arguments such as ``transformer_options``)
  is a per-forward *constant*: when it lives on the home device and the block does not, it is
  copied to the block's device once per forward and the copy is reused by every later block on
  that device (cache keyed by tensor identity + device; the entry keeps the source alive so its
  id cannot be reused within the forward, and outside inference mode an in-place change of the
  source, seen through its version counter, triggers a fresh copy). Tensors on any other device
  are left alone, exactly as an unsharded run leaves them.
- After the blocks in ``return_home_after``, after the last block of each list, and after every
  block while a scope asked for ``return_home_all`` (inter-block code such as a ControlNet), the
  block output (a tensor, or each tensor of a tuple/list/dict) comes back to the home device.

A forward is delimited by ``forward_scope()`` (ComfyUI integration) or, without a scope, by the
first and the last registered block (pure ``attach`` path): the cache is cleared at the start
and released at the end; ``stats`` keeps the last forward's counters.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass, field

import torch

from ..tensor_map import map_tensors, tensors_in
from ..errors import InputError, RunError

__all__ = ["BlockLayout", "BlockRouter", "BlockSlot", "RouterStats", "normalize_device"]

_NEST = 3  # how deep constants are searched inside dict/list/tuple arguments


def normalize_device(device, what: str = "device") -> torch.device:
    """``torch.device`` with an explicit index for accelerators (``cuda`` -> error, ``cuda:0`` ok)."""
    dev = torch.device(device)
    if dev.type not in ("cpu", "meta") and dev.index is None:
        raise InputError(f"{what} {str(device)!r} has no index: pass e.g. '{dev.type}:0'")
    return dev


@dataclass(frozen=True)
class BlockLayout:
    """Where the transformer blocks of a DiT are and which block arguments travel."""

    block_lists: tuple[str, ...]
    """Attribute paths of the block ``ModuleList``s on the DiT, in execution order."""
    stream_args: tuple[tuple[int | str, ...], ...]
    """Per block list: the arguments that carry the hidden state(s), by name (``"x"``) or
    position (``0``); names are matched to positions from the block's ``forward`` signature."""
    return_home_after: frozenset[int] = frozenset()
    """Global block indices (over all lists, in order) after which code runs on the home device
    (Wan VACE/S2V/Animate inter-block code). The last block of each list is always included."""
    home_every_block_kwargs: tuple[str, ...] = ()
    """DiT forward arguments that, when given (not None), run code on the home device after every
    block (HunyuanVideo / Flux ``control``); see ``needs_home_every_block``."""

    def __post_init__(self):
        if not self.block_lists:
            raise InputError("BlockLayout needs at least one block list path")
        if len(self.stream_args) != len(self.block_lists):
            raise InputError(
                f"BlockLayout has {len(self.block_lists)} block lists but "
                f"{len(self.stream_args)} stream_args entries: give one tuple per list")
        if len(set(self.block_lists)) != len(self.block_lists):
            raise InputError(f"BlockLayout lists a block path twice: {self.block_lists}")
        for spec in self.stream_args:
            if not spec or not all(isinstance(a, (int, str)) for a in spec):
                raise InputError(f"stream_args entry {spec!r} must be a non-empty tuple of names/positions")
        object.__setattr__(self, "return_home_after", frozenset(int(i) for i in self.return_home_after))


@dataclass
class RouterStats:
    """Counters of one forward (tests and the benchmark read them)."""

    hops: int = 0
    """Block calls whose stream input moved, plus outputs moved back home."""
    constant_copies: int = 0
    """Constant tensors copied to a device (each (tensor, device) pair at most once)."""
    copies_by_device: dict[str, int] = field(default_factory=dict)
    hop_log: list[tuple[int, str, str]] = field(default_factory=list)
    """(global block index, from device, to device) per hop."""
    blocks_run: int = 0


class BlockSlot:
    """What the router knows about one block: index, device, list, stream positions/names."""

    __slots__ = ("index", "device", "list_index", "stream_pos", "stream_names")

    def __init__(self, index, device, list_index, stream_pos, stream_names):
        self.index, self.device, self.list_index = index, device, list_index
        self.stream_pos, self.stream_names = stream_pos, stream_names


class BlockRouter:
    """Routes block inputs/outputs for one sharded model; state lives for one forward."""

    def __init__(self, layout: BlockLayout, home):
        self.layout = layout
        self.home = normalize_device(home, "home device")
        self.stats = RouterStats()
        self._slots: dict[int, BlockSlot] = {}
        self._home_after: frozenset[int] = frozenset()
        self._first = self._last = -1
        self._cache: dict = {}
        self._scoped = False
        self._home_all = False
        # Kernels that launch on the *current* CUDA device (Triton/Sage attention) need it set.
        self.set_current_device = torch.cuda.is_available()
        self._engine = None
        self.block_scope = None
        """A factory of a context manager every block call runs inside (ComfyUI: its compiler's
        malloc graph paused, ``loaders/comfy/shard/compile_guard``); None: none."""
        self._sequence = False

    @property
    def engine(self):
        """A ``SequenceEngine`` (``sequence.engine``) for `sequence` scopes; None: `blocks` only.
        Read-only: it arrives through ``use_engine`` (``sequence.engine.attach_sequence_engine``)."""
        return self._engine

    def use_engine(self, engine) -> None:
        """Run `sequence` scopes with ``engine`` (None: `blocks` only). Refused inside a forward."""
        if self._scoped:
            raise RunError("the block router's sequence engine cannot change inside a forward")
        self._engine = engine

    # ---- registration (build_block_proxies) -------------------------------------------------
    def add_slots(self, specs) -> list[BlockSlot]:
        """A registered ``BlockSlot`` per tuple of its fields (index, device, list index, stream
        positions, stream names), in order."""
        slots = [BlockSlot(*spec) for spec in specs]
        for slot in slots:
            self.register(slot)
        return slots

    def register(self, slot: BlockSlot) -> None:
        self._slots[slot.index] = slot
        last_of_list = {}
        for s in self._slots.values():
            last_of_list[s.list_index] = max(last_of_list.get(s.list_index, -1), s.index)
        self._home_after = self.layout.return_home_after | frozenset(last_of_list.values())
        self._first, self._last = min(self._slots), max(self._slots)

    def registered_lists(self) -> set[int]:
        return {s.list_index for s in self._slots.values()}

    @property
    def block_devices(self) -> tuple[torch.device, ...]:
        return tuple(self._slots[g].device for g in sorted(self._slots))

    def planned_hops(self, return_home_all: bool = False) -> int:
        """Hops one forward makes if every registered block runs once, in order."""
        hops, here = 0, self.home
        for g in sorted(self._slots):
            dev = self._slots[g].device
            hops += dev != here
            here = dev
            if (return_home_all or g in self._home_after) and here != self.home:
                hops, here = hops + 1, self.home
        return hops

    # ---- forward scope -----------------------------------------------------------------------
    @contextlib.contextmanager
    def forward_scope(self, return_home_all: bool = False, sequence: bool = False):
        """One forward: fresh cache and stats on entry, cache released on exit (even on error).

        Nested scopes join the outer one. ``return_home_all``: every block output comes home
        (inter-block code such as a ControlNet runs this forward). ``sequence``: blocks run split
        over the engine's ranks (``sequence.engine``); needs ``engine``.
        """
        if self._scoped:
            yield self
            return
        if sequence and self.engine is None:
            raise InputError("sequence scope on a router without a sequence engine")
        self._begin(return_home_all)
        self._scoped = True
        self._sequence = sequence
        try:
            if sequence:
                with self.engine.forward_scope():
                    yield self
            else:
                yield self
        finally:
            self._scoped = False
            self._sequence = False
            self._home_all = False
            self._cache.clear()

    def materialize(self, obj):
        """``obj`` with `sequence` placeholders replaced by gathered tensors (else ``obj``)."""
        return self.engine.materialize(obj) if self._sequence else obj

    def _begin(self, return_home_all: bool = False) -> None:
        self._cache.clear()
        self.stats = RouterStats()
        self._home_all = return_home_all

    # ---- hot path ----------------------------------------------------------------------------
    def run_block(self, slot: BlockSlot, block, args: tuple, kwargs: dict):
        if self.block_scope is not None:
            with self.block_scope():
                return self._route_block(slot, block, args, kwargs)
        return self._route_block(slot, block, args, kwargs)

    def _route_block(self, slot: BlockSlot, block, args: tuple, kwargs: dict):
        if self._sequence:
            home_after = self._home_all or slot.index in self._home_after
            return self.engine.run_block(slot, block, args, kwargs, home_after,
                                         lambda a, k: self._run_here(slot, block, a, k))
        return self._run_here(slot, block, args, kwargs)

    def _run_here(self, slot: BlockSlot, block, args: tuple, kwargs: dict):
        """`blocks` mode: the block computes on its own device."""
        g = slot.index
        if not self._scoped and g == self._first:
            self._begin()
        dev = slot.device
        args, kwargs, moved_from = self._route_inputs(slot, dev, args, kwargs)
        if moved_from is not None:
            self._count_hop(g, moved_from, dev)
        self.stats.blocks_run += 1
        if self.set_current_device and dev.type == "cuda":
            with torch.cuda.device(dev):
                out = block(*args, **kwargs)
        else:
            out = block(*args, **kwargs)
        if dev != self.home and (self._home_all or g in self._home_after):
            out, moved = _move(out, self.home, 1)
            if moved:
                self._count_hop(g, dev, self.home)
        if not self._scoped and g == self._last:
            self._cache.clear()
        return out

    def return_home_if_due(self, global_index: int, out):
        """``out`` (tensor / tuple / list / dict) moved home if block ``global_index`` returns home.

        For a block-replacement patch (``patches_replace["dit"]``) that may skip the block, e.g.
        skip-layer guidance returning its input: the proxy never runs, so call this on the
        patch's output to keep "home after the last block / inter-block code" true.
        """
        if self._home_all or global_index in self._home_after:
            out, moved = _move(self.materialize(out), self.home, 2)
            if moved:
                self._count_hop(global_index, "patch", self.home)
        return out

    def _route_inputs(self, slot: BlockSlot, dev, args, kwargs):
        """(args, kwargs, device a stream came from or None). On the home device no constant can
        move (only home tensors move), so only the stream arguments are looked at."""
        scan = dev != self.home
        moved_from = None
        new_args = list(args)
        for i, a in enumerate(args):
            if i in slot.stream_pos:
                new_args[i], src = _move_stream(a, dev)
                moved_from = moved_from or src
            elif scan:
                new_args[i] = self._constant(a, dev, _NEST)
        new_kwargs = dict(kwargs)
        for k, v in kwargs.items():
            if k in slot.stream_names:
                new_kwargs[k], src = _move_stream(v, dev)
                moved_from = moved_from or src
            elif scan:
                new_kwargs[k] = self._constant(v, dev, _NEST)
        return new_args, new_kwargs, moved_from

    def _constant(self, obj, dev, depth):
        """``obj`` with every home-device tensor inside replaced by its cached copy on ``dev``
        (``obj`` itself when none is there)."""
        return map_tensors(lambda t: t if t.device == dev or t.device != self.home else self._cached_copy(t, dev),
                           obj, depth)

    def _cached_copy(self, t: torch.Tensor, dev) -> torch.Tensor:
        key = (id(t), dev)
        version = None if t.is_inference() else t._version
        entry = self._cache.get(key)
        if entry is not None and entry[0] is t and entry[1] == version:
            return entry[2]
        copy = self._copy_constant(t, dev)
        self._cache[key] = (t, version, copy)
        self.stats.constant_copies += 1
        name = str(dev)
        self.stats.copies_by_device[name] = self.stats.copies_by_device.get(name, 0) + 1
        return copy

    def _copy_constant(self, t: torch.Tensor, dev) -> torch.Tensor:
        """The one place a constant crosses devices (tests break it on purpose)."""
        return t.to(dev)

    def _count_hop(self, g: int, src, dst) -> None:
        self.stats.hops += 1
        self.stats.hop_log.append((g, str(src), str(dst)))


def _move_stream(obj, dev):
    """(obj on ``dev``, the device it came from or None when nothing moved)."""
    if isinstance(obj, torch.Tensor):
        if obj.device == dev:
            return obj, None
        return obj.to(dev), obj.device
    moved, changed = _move(obj, dev, 1)
    if not changed:
        return obj, None
    return moved, next(t.device for t in tensors_in(obj, 1) if t.device != dev)


def _move(obj, dev, depth):
    """(``obj`` with its tensors on ``dev``, ``depth`` container levels deep; whether any moved)."""
    moved = map_tensors(lambda t: t if t.device == dev else t.to(dev), obj, depth)
    return moved, moved is not obj
