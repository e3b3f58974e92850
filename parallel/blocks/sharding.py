"""Block sharding: every transformer block computes on the device that holds its weights.

Pure PyTorch (no ComfyUI). Two ways to use it:

- ``attach_block_sharding(module, layout, block_devices, home)``: moves each block to its device
  and the rest of the module to ``home``, swaps each block ``ModuleList`` for proxies, and returns
  a ``ShardHandle`` whose ``detach()`` restores the module exactly.
- ``build_block_proxies(...)`` + ``BlockRouter``: the pieces, for the ComfyUI integration that
  keeps the real blocks in per-device shard modules and installs the proxies as an object patch.

A ``BlockProxy`` does not register its block as a submodule: ``named_parameters()``,
``named_modules()`` and ``.to()`` of the parent skip the block weights (ComfyUI's main
ModelPatcher must not load them), while ``state_dict()`` still lists them under their usual keys
(key-based code such as LoRA mapping sees the whole model). Attribute reads the proxy does not
have fall back to the real block. Routing rules (what moves, when, how often) are in
``routing.py``.
"""
from __future__ import annotations

import contextlib
import inspect
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import torch
from torch._subclasses.fake_tensor import FakeTensor

from .routing import BlockLayout, BlockRouter, BlockSlot, RouterStats, normalize_device
from ..errors import InputError

__all__ = [
    "BlockProxy",
    "ShardHandle",
    "attach_block_sharding",
    "build_block_proxies",
    "get_block_list",
    "needs_home_every_block",
    "sharded",
]

_POSITIONAL = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)


class BlockProxy(torch.nn.Module):
    """Stands in for one block: routes its inputs, calls the real block, routes the output."""

    def __init__(self, block: torch.nn.Module, slot: BlockSlot, router: BlockRouter):
        super().__init__()
        # object.__setattr__: keep the block out of _modules (no parameters, not moved by .to()).
        object.__setattr__(self, "_sharddit_block", block)
        object.__setattr__(self, "_sharddit_slot", slot)
        object.__setattr__(self, "_sharddit_router", router)

    @property
    def real_block(self) -> torch.nn.Module:
        return self._sharddit_block

    @property
    def block_device(self) -> torch.device:
        return self._sharddit_slot.device

    @property
    def block_index(self) -> int:
        """Global index of the block over all block lists, in execution order."""
        return self._sharddit_slot.index

    def forward(self, *args, **kwargs):
        return self._sharddit_router.run_block(self._sharddit_slot, self._sharddit_block, args, kwargs)

    def train(self, mode: bool = True):
        self._sharddit_block.train(mode)
        return super().train(mode)

    def _save_to_state_dict(self, destination, prefix, keep_vars):
        """``state_dict()`` still lists the real block's tensors under its own key names.

        Parameter/module traversal (``named_parameters``, ``named_modules``, ``.to()``) does not
        see the block, so a ComfyUI ModelPatcher never loads or moves it; but key-based code
        (LoRA key mapping, ``add_patches``' key check, ``module_size``) sees the full model.
        """
        self._sharddit_block.state_dict(destination=destination, prefix=prefix, keep_vars=keep_vars)

    def __getattr__(self, name: str):
        try:
            return super().__getattr__(name)
        except AttributeError:
            block = self.__dict__.get("_sharddit_block")
            if block is None or name.startswith("__") or name.startswith("_sharddit"):
                raise
            return getattr(block, name)

    def extra_repr(self) -> str:
        s = self._sharddit_slot
        return f"block={type(self._sharddit_block).__name__}, index={s.index}, device={s.device}"


def build_block_proxies(blocks: Sequence[torch.nn.Module], devices: Sequence, home, router: BlockRouter,
                        global_indices: Sequence[int] | None = None,
                        block_list: str | int | None = None) -> list[BlockProxy]:
    """One proxy per block of ONE block list, registered with ``router``.

    ``devices[i]``: where ``blocks[i]``'s weights live (the caller moves them). ``global_indices``:
    each block's index over all lists (default: continue after the lists registered so far).
    ``block_list``: the list's path or position in ``router.layout`` (default: the first list of
    the layout not registered yet, so call once per list in layout order).
    """
    layout = router.layout
    if len(devices) != len(blocks):
        raise InputError(f"{len(blocks)} blocks but {len(devices)} devices: give one device per block")
    if normalize_device(home, "home device") != router.home:
        raise InputError(f"proxies built for home {home} but the router's home is {router.home}")
    list_index = _list_index(layout, router, block_list)
    if global_indices is None:
        start = 1 + max((s for s in router._slots), default=-1)
        global_indices = range(start, start + len(blocks))
    if len(global_indices) != len(blocks):
        raise InputError(f"{len(blocks)} blocks but {len(global_indices)} global indices")
    slots = router.add_slots(_slot_specs(blocks, devices, layout, list_index, global_indices))
    return [BlockProxy(block, slot, router) for block, slot in zip(blocks, slots, strict=True)]


def _slot_specs(blocks, devices, layout: BlockLayout, list_index: int, global_indices) -> list[tuple]:
    """Per block of one list: (global index, device, list index, stream positions, stream names),
    the fields of its ``BlockSlot``."""
    path, spec = layout.block_lists[list_index], layout.stream_args[list_index]
    return [(int(g), normalize_device(dev, f"device of block {g}"), list_index, *_resolve_stream(block, spec, path))
            for block, dev, g in zip(blocks, devices, global_indices, strict=True)]


def _list_index(layout: BlockLayout, router: BlockRouter, block_list) -> int:
    if block_list is None:
        done = router.registered_lists()
        free = [i for i in range(len(layout.block_lists)) if i not in done]
        return free[0] if free else 0
    if isinstance(block_list, int):
        return block_list
    if block_list not in layout.block_lists:
        raise InputError(f"block list {block_list!r} is not in the layout {layout.block_lists}")
    return layout.block_lists.index(block_list)


def _resolve_stream(block, spec, path) -> tuple[tuple[int, ...], frozenset[str]]:
    """Stream args as (positions, keyword names), matched through the block's forward signature."""
    try:
        params = list(inspect.signature(block.forward).parameters.values())
    except (TypeError, ValueError):
        params = []
    positional = [p.name for p in params if p.kind in _POSITIONAL]
    open_kwargs = not params or any(p.kind == inspect.Parameter.VAR_KEYWORD for p in params)
    pos, names = set(), set()
    for a in spec:
        if isinstance(a, int):
            pos.add(a)
            if a < len(positional):
                names.add(positional[a])
        elif a in positional:
            names.add(a)
            pos.add(positional.index(a))
        elif open_kwargs or any(p.name == a for p in params):
            names.add(a)
        else:
            raise InputError(
                f"stream argument {a!r} of block list {path!r} is not a parameter of "
                f"{type(block).__name__}.forward{tuple(p.name for p in params)}: fix the architecture spec")
    return tuple(sorted(pos)), frozenset(names)


def get_block_list(module: torch.nn.Module, path: str):
    obj = module
    for name in path.split("."):
        obj = getattr(obj, name)
    return obj


def _set_block_list(module: torch.nn.Module, path: str, value) -> None:
    *parents, last = path.split(".")
    parent = get_block_list(module, ".".join(parents)) if parents else module
    setattr(parent, last, value)


def needs_home_every_block(layout: BlockLayout, forward_fn, args: tuple, kwargs: Mapping) -> bool:
    """True when a DiT forward called as ``forward_fn(*args, **kwargs)`` passes one of
    ``layout.home_every_block_kwargs`` (e.g. a ControlNet's ``control``) that is not None."""
    if not layout.home_every_block_kwargs:
        return False
    try:
        bound = inspect.signature(forward_fn).bind_partial(*args, **kwargs).arguments
    except (TypeError, ValueError):
        bound = dict(kwargs)
    extra = bound.get("kwargs") if isinstance(bound.get("kwargs"), dict) else {}
    return any(bound.get(n, extra.get(n)) is not None for n in layout.home_every_block_kwargs)


@dataclass
class ShardHandle:
    """Returned by ``attach_block_sharding``; ``detach()`` undoes everything (idempotent)."""

    module: torch.nn.Module
    layout: BlockLayout
    router: BlockRouter
    proxies: dict[str, torch.nn.ModuleList]
    _lists: dict[str, torch.nn.Module] = field(repr=False)
    _params: list = field(repr=False)
    _buffers: list = field(repr=False)
    attached: bool = True

    @property
    def stats(self) -> RouterStats:
        return self.router.stats

    def detach(self) -> None:
        if not self.attached:
            return
        for path, original in self._lists.items():
            _set_block_list(self.module, path, original)
        for owner, name, p, dev in self._params:
            owner._parameters[name] = p
            if p.device != dev:
                p.data = p.data.to(dev)
        for owner, name, dev in self._buffers:
            buf = owner._buffers.get(name)
            if buf is not None and buf.device != dev:
                owner._buffers[name] = buf.to(dev)
        self.attached = False


def attach_block_sharding(module: torch.nn.Module, layout: BlockLayout, block_devices: Sequence,
                          home) -> ShardHandle:
    """Shard ``module``'s blocks: block g's weights move to ``block_devices[g]`` (global order over
    ``layout.block_lists``), everything else to ``home``. Returns the handle that undoes it."""
    home = normalize_device(home, "home device")
    lists = {path: get_block_list(module, path) for path in layout.block_lists}
    n_blocks = sum(len(b) for b in lists.values())
    if len(block_devices) != n_blocks:
        raise InputError(
            f"{type(module).__name__} has {n_blocks} blocks in {layout.block_lists} but "
            f"{len(block_devices)} block devices were given: give one device per block")
    if any(isinstance(b, BlockProxy) for blocks in lists.values() for b in blocks):
        raise InputError(f"{type(module).__name__} is already sharded: detach the first handle")
    devices = [normalize_device(d, f"device of block {g}") for g, d in enumerate(block_devices)]
    params, buffers = _record_placement(module)
    specs, g = {}, 0
    for path, blocks in lists.items():  # every slot's fields first, then the router holds them all
        specs[path] = _slot_specs(list(blocks), devices[g:g + len(blocks)], layout, layout.block_lists.index(path),
                                  range(g, g + len(blocks)))
        g += len(blocks)
    router = BlockRouter(layout, home)
    proxies = {path: torch.nn.ModuleList([BlockProxy(b, slot, router)
                                          for b, slot in zip(lists[path], router.add_slots(spec), strict=True)])
               for path, spec in specs.items()}
    for path, plist in proxies.items():
        _set_block_list(module, path, plist)
    memo: dict = {}
    _move_tree(module, home, memo)  # the proxies hold no weights: only the non-block part moves
    blocks = [b for bl in lists.values() for b in bl]
    for block, dev in zip(blocks, devices):
        _move_tree(block, dev, memo)
    return ShardHandle(module, layout, router, proxies, lists, params, buffers)


@contextlib.contextmanager
def sharded(module: torch.nn.Module, layout: BlockLayout, block_devices: Sequence, home):
    """``attach_block_sharding`` for the length of a ``with`` (yields the handle); detached on exit."""
    handle = attach_block_sharding(module, layout, block_devices, home)
    try:
        yield handle
    finally:
        handle.detach()


def _record_placement(module: torch.nn.Module):
    """Every parameter slot (owner, name, Parameter object, device) and buffer slot with its device."""
    params, buffers = [], []
    for mod in module.modules():
        for name, p in mod._parameters.items():
            if p is not None:
                params.append((mod, name, p, p.device))
        for name, b in mod._buffers.items():
            if b is not None:
                buffers.append((mod, name, b.device))
    return params, buffers


def _move_tree(module: torch.nn.Module, dev: torch.device, memo: dict) -> None:
    """Move every parameter and buffer under ``module`` to ``dev``, keeping Parameter objects
    (``p.data = ...``, what ``module.to`` does). Fake tensors cannot change device in place: they
    get a new Parameter (``detach`` puts the original objects back). ``memo`` keeps ties tied."""
    for mod in module.modules():
        for name, p in mod._parameters.items():
            if p is None or p.device == dev:
                continue
            new = memo.get(id(p))
            if new is None:
                if isinstance(p, FakeTensor):
                    new = torch.nn.Parameter(p.detach().to(dev), p.requires_grad)
                else:
                    p.data = p.data.to(dev)
                    new = p
                memo[id(p)] = new
            mod._parameters[name] = new
        for name, b in mod._buffers.items():
            if b is not None and b.device != dev:
                mod._buffers[name] = b.to(dev)
