"""Per-frame tables cut to a rank's tokens (``TokenSpec.frame_tables``; pure).

LTX-2 passes its video timesteps to the blocks as ComfyUI's ``CompressedTimestep``: ``data``
[B, frames, C], one row per latent frame of ``patches_per_frame`` tokens, expanded per token inside
the block (``expand``, ``expand_for_computation``: tensors [B, tokens, ...]). A rank whose token
range starts and ends on frame boundaries gets the same kind of object over its frames. One whose
range cuts a frame gets its frames' rows too, as an object of a subclass made here of the table's
own class (so the block's ``isinstance`` still holds) whose expansions are narrowed to the rank's
tokens: one row per frame stays one row per frame, never one per token (with cross-attention
AdaLN, 14 hidden states' worth per token over LTX-2.3's three tables).
"""
from __future__ import annotations

import copy

import torch

from ..tensor_map import slot_values
from .split import RankSlice, slice_batch, slice_tokens
from ..errors import InputError

__all__ = ["cut_frame_rows"]

_NARROWED: dict[type, type] = {}


def _narrowed_type(base: type) -> type:
    """``base`` with ``expand`` and ``expand_for_computation`` narrowed to ``[offset, offset + length)``."""
    sub = _NARROWED.get(base)
    if sub is not None:
        return sub

    def expand(self):
        return base.expand(self).narrow(1, self.offset, self.length).contiguous()

    def expand_for_computation(self, *args, **kwargs):
        return tuple(t.narrow(1, self.offset, self.length).contiguous()
                     for t in base.expand_for_computation(self, *args, **kwargs))

    sub = type(base.__name__, (base,), {"__slots__": ("length", "offset"), "__module__": __name__,
                                        "expand": expand, "expand_for_computation": expand_for_computation})
    return _NARROWED.setdefault(base, sub)


def cut_frame_rows(obj, rs: RankSlice, batch: int, main: int, what: str):
    """The rank's rows of a per-frame table: its batch group, then the frames its tokens touch (see
    the module docstring). A plain tensor is cut on dim 1 like any token argument; None stays None."""
    if obj is None or isinstance(obj, torch.Tensor):
        return None if obj is None else slice_tokens(slice_batch(obj, batch, rs), 1, rs, main, 0, what)
    data, per = slice_batch(obj.data, batch, rs), obj.patches_per_frame
    new = copy.copy(obj)
    new.batch_size = data.shape[0]
    if per == 1 and data.shape[1] == 1:  # one row for every token
        new.data = data
        return new
    if data.shape[1] * per != main:
        raise InputError(f"sequence mode: argument {what!r} has {data.shape[1]} frames of {per} tokens, "
                         f"expected {main} tokens")
    t0, t1 = rs.tokens
    f0, f1 = t0 // per, -(-t1 // per)
    new.data, new.num_frames = data[:, f0:f1], f1 - f0
    if t0 % per == 0 and t1 % per == 0:
        return new
    cut = object.__new__(_narrowed_type(type(obj)))
    for name, value in slot_values(new).items():
        setattr(cut, name, value)
    cut.offset, cut.length = t0 - f0 * per, t1 - t0
    return cut
