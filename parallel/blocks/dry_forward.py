"""One forward of a DiT on fake devices with the pack's block engine: what the dry run measures.

Pure PyTorch (no ComfyUI). ``simulated_forward`` puts every block's weights on its planned fake
device (``simulate.fake_weights``), attaches the block engine (``sharding.sharded``), runs the
caller's forward under the fake mode and the memory tracker (``simulate``), and leaves the module as
it was, on ``meta``. The dry run (``loaders/plan/fake_forward``) calls it for `blocks` and, with the
`sequence` engine as a second engine, for `sequence`.
"""
from __future__ import annotations

import contextlib

import torch

from ..simulate import MemoryTracker, fake_device_mode, fake_weights, modules_move_in_place
from .routing import BlockLayout
from .sharding import sharded

__all__ = ["simulated_forward"]


def _block_lists(module: torch.nn.Module, layout: BlockLayout) -> list[tuple[torch.nn.Module, str]]:
    """(owner, attribute) of each of ``layout``'s block lists in ``module``."""
    out = []
    for path in layout.block_lists:
        owner = module
        *parents, name = path.split(".")
        for part in parents:
            owner = getattr(owner, part)
        out.append((owner, name))
    return out


@contextlib.contextmanager
def _first_blocks_only(lists: list[tuple[torch.nn.Module, str]]):
    """Keep only the first block of each block list (an empty list stays empty); restored on exit."""
    saved = [(owner, name, getattr(owner, name)) for owner, name in lists]
    for owner, name, blocks in saved:
        setattr(owner, name, torch.nn.ModuleList(list(blocks)[:1]))
    try:
        yield
    finally:
        for owner, name, blocks in saved:
            setattr(owner, name, blocks)


def simulated_forward(module: torch.nn.Module, layout: BlockLayout, block_devices, home, forward,
                      scalars: bool = False, first_only: bool = False, engine=None):
    """One forward of a ``meta`` module on fake devices: per-device weights and peak activations.

    Every block's weights go on its planned device (``block_devices``, global order over
    ``layout.block_lists``), the rest on ``home``; the pack's block engine
    (``sharding.sharded``) routes the forward; ``forward(home)`` calls the module (inside
    ``modules_move_in_place``); afterwards everything is detached and back on ``meta``.

    ``block_devices`` None: every block on ``home``. ``first_only``: only the first block of each
    list takes part (a probe: the blocks of a list are alike, so one of each shows a device's peak;
    an empty list stays empty), all on ``home``. ``engine(handle, mode, tracker)``: attaches a second engine to the sharded module (the
    `sequence` engine) and returns ``(after, close)``: ``after()`` runs after the forward (its value
    is returned beside the memory), ``close()`` always. Returns ``({device: DeviceMemory}, after())``.
    """
    lists = _block_lists(module, layout)
    prune = _first_blocks_only(lists) if first_only else contextlib.nullcontext()
    extra = None
    with prune:
        blocks = [b for owner, name in lists for b in getattr(owner, name)]
        block_devices = [home] * len(blocks) if block_devices is None else block_devices
        with fake_device_mode(scalars) as mode, fake_weights(module, blocks, block_devices, home), \
                modules_move_in_place(module):
            tracker = MemoryTracker(module, *blocks)
            with sharded(module, layout, block_devices, home) as handle:
                after, close = engine(handle, mode, tracker) if engine is not None else (None, None)
                try:
                    with tracker, handle.router.forward_scope(sequence=engine is not None):
                        forward(torch.device(home))
                    extra = after() if after is not None else None
                finally:
                    if close is not None:
                        close()
    return tracker.report(), extra
