"""How `sequence` mode divides one DiT forward: batch groups, token ranges, head ranges (pure).

Work is split by batch first, then by tokens inside a batch group (``plan_groups``):

- with a batch of B (cond + uncond when cfg > 1, times the user's batch) and N ranks, the ranks
  form ``G`` groups, ``G`` the largest divisor of N that is at most B; group g gets a contiguous
  slice of the batch and its ``N / G`` ranks split that slice's tokens. B = 2, N = 2: two groups of
  one rank each (a CFG split: no attention exchange at all); B = 1 (cfg = 1): one group of N.
- tokens: the *main* tokens (image/video tokens, ``L``) are cut in contiguous ranges that differ by
  at most one token; ``T`` replicated text tokens (HunyuanVideo's, which ride beside the image
  tokens in its single blocks and in its rotary table) are kept whole by every rank, on the side
  the model puts them: after the image tokens (a *tail*: ComfyUI < 0.14) or before them (a *head*:
  ``TokenSpec.text_first``, ComfyUI >= 0.14). A rank's rows keep the model's order: its image
  range then the text, or the text then its image range. Nothing is padded, so every rank computes
  exactly the unsharded maths on its rows.
- heads: ``H`` attention heads are cut the same way (a rank may get none when N > H).

``TokenSpec`` says, per block list, which block arguments carry a token axis (and where). A tensor
argument's size on that axis decides: ``L`` -> split, ``L + T`` -> split + tail, ``1`` -> broadcast
(kept whole), anything else -> ``ValueError`` (the caller falls back to ``blocks`` mode).
("tail" below names the ``T`` replicated text tokens wherever they sit.)
Every other tensor whose first dimension is the batch is sliced by batch group; the rest is kept
whole.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import torch

from ..tensor_map import map_tensors
from ..errors import InputError

__all__ = ["PIPELINE_CHUNKS", "Group", "RankSlice", "TokenSpec", "cut_row_table", "even_ranges", "head_chunks",
           "pipeline_schedule", "plan_groups", "share_ranges", "split_items", "stream_parts"]


@dataclass(frozen=True)
class TokenSpec:
    """Token axes of one block list's arguments (by argument name)."""

    token_dims: Mapping[str, int] = field(default_factory=dict)
    """Argument name -> token dimension, stream arguments included (Wan ``x``: 1, ``freqs``: 1).
    Tuples/lists (LTXV's ``pe = (cos, sin)``) apply the dimension to each tensor inside."""
    replicated_streams: tuple[str, ...] = ()
    """Stream arguments every rank of a group keeps whole (HunyuanVideo double blocks' ``txt``)."""
    must_be_none: tuple[str, ...] = ()
    """Arguments that this split does not handle yet: a call that sets one runs whole (``blocks``)."""
    tail_stream: str | None = None
    """Name of the stream argument whose token count is the replicated tail ``T`` of this forward
    (HunyuanVideo: ``txt``); None when the model has no tail."""
    text_first: bool = False
    """The ``T`` replicated tokens come *before* the main tokens in joint tensors (``L + T`` on the
    token axis), as in ComfyUI's HunyuanVideo since 0.14; False: after them. Read off the model."""
    whole: bool = False
    """This block list runs whole, on its owner's device, by design (Kandinsky 5's text blocks: a few
    hundred text tokens before the video is embedded; splitting them would gain nothing)."""
    unbatched: bool = False
    """The hidden state has no batch dimension (MiniMax H3's packed ``[S, C]``: ComfyUI calls it
    with one sample at a time): the forward's batch is 1, its tokens on the stream's token dim."""
    row_tables: tuple[str, ...] = ()
    """Arguments listing ``(start, stop, row)`` ranges of the token axis (MiniMax H3's
    ``mod_segments``: which modulation row applies to which tokens; ``row`` an index, or one per
    token): each rank gets the ranges that meet its tokens, renumbered from its first row
    (``cut_row_table``)."""
    whole_parts: Mapping[str, tuple[int, ...]] = field(default_factory=dict)
    """Stream arguments that are a tuple of hidden states (LTX-2's ``x = (video, audio)``) -> the
    items every rank of a group keeps whole (the audio: a few tokens, attended by all of them); the
    other items are split on the argument's token dim. A block returns the tuple, item by item."""
    frame_tables: tuple[str, ...] = ()
    """Arguments holding one row per frame of ``patches_per_frame`` tokens (LTX-2's
    ``CompressedTimestep``: ``data`` [B, frames, C], expanded per token inside the block), or a
    plain per-token tensor: each rank gets its token range's rows (``frames.cut_frame_rows``)."""
    gather_kv: tuple[str, ...] = ()
    """Block submodules whose attention takes whole queries and keys/values from the split tokens
    (LTX-2's ``video_to_audio_attn``: audio queries, video keys/values): split by heads over the
    group, each rank attending the keys/values of every token for its heads (``ulysses.gathered_kv_attention``)."""


def share_ranges(total: int, parts: int, shares=None) -> list[tuple[int, int]]:
    """``parts`` contiguous ranges covering ``range(total)``, sizes proportional to ``shares`` (one
    per part: each rank's relative speed), or ``even_ranges`` when ``shares`` is None. Largest
    remainder after flooring; every part gets at least one when ``total`` allows, taken from the
    largest parts. Deterministic: every rank and process computes the same ranges."""
    if shares is None:
        return even_ranges(total, parts)
    n = len(shares)
    if n != parts or any(not (s > 0) for s in shares):
        raise InputError(f"shares {tuple(shares)} must be {parts} positive numbers, one per part")
    weight = float(sum(shares))
    exact = [total * s / weight for s in shares]
    sizes = [int(e) for e in exact]
    for i in sorted(range(n), key=lambda i: (sizes[i] - exact[i], i))[:total - sum(sizes)]:
        sizes[i] += 1
    if total >= n:
        for i in range(n):
            if sizes[i] == 0:
                sizes[max(range(n), key=lambda j: (sizes[j], -j))] -= 1
                sizes[i] = 1
    out, start = [], 0
    for size in sizes:
        out.append((start, start + size))
        start += size
    return out


PIPELINE_CHUNKS = 4
"""Head chunks of the pipelined Ulysses exchange between GPU ranks of this process (``ulysses``):
the exchange of chunk c+1 and the return of chunk c run while chunk c (c+1) attends, so only the
first chunk's q/k/v and the last chunk's output stay exposed (about 1/C of the exchange where it
is shorter than the attention). Four: Wan 14B at cfg > 1 on 4 GPUs (40 heads, 20 per rank) then
keeps 5 heads per attention call (a few hundred thread blocks per call at 480p: the GPU stays
full). The cost model gives 3.31× / 3.59× / 3.75× / 3.83× for 1 / 2 / 4 / 8 chunks there (fp8,
480p × 33, 12 GB/s, every block resident): 8 would gain about 2 % of a step for twice the
transfers and attention calls, whose smaller kernels the model does not price."""


def head_chunks(head_ranges, chunks: int = PIPELINE_CHUNKS) -> int:
    """How many head chunks every rank of a group uses: ``chunks``, at most the fewest heads any
    rank of the group holds (every chunk of every rank then has a head; ranks agree because they
    compute the same ranges), at least 1 (1: the unpipelined exchange)."""
    return max(1, min([int(chunks)] + [b - a for a, b in head_ranges]))


def pipeline_schedule(chunks: int) -> list[tuple[str, int]]:
    """The host order of the pipelined Ulysses steps of one rank, which ``ulysses`` runs and the
    cost model (``cost/model``) prices: ``("qkv", c)`` posts chunk c's q/k/v and queues the copies of
    what it receives on the exchange stream; ``("attend", c)`` makes the compute stream wait for
    those copies and queues chunk c's attention; ``("out", c)`` posts chunk c's output (the
    exchange stream waits for that attention) and queues its copies. Chunk c+1's q/k/v go before
    chunk c's attention (they overlap it), chunk c's output right after it (it overlaps chunk
    c+1's). One chunk: the three steps of the unpipelined exchange."""
    ahead = 1  # chunks whose q/k/v are posted before the attention that waits for the earliest
    steps = [("qkv", c) for c in range(min(chunks, 1 + ahead))]
    for c in range(chunks):
        steps += [("attend", c), ("out", c)]
        if c + 1 + ahead < chunks:
            steps.append(("qkv", c + 1 + ahead))
    return steps


def even_ranges(total: int, parts: int) -> list[tuple[int, int]]:
    """``parts`` contiguous ranges covering ``range(total)``, sizes differing by at most one."""
    if parts < 1:
        raise InputError(f"cannot split {total} into {parts} parts")
    base, rem = divmod(total, parts)
    out, start = [], 0
    for i in range(parts):
        stop = start + base + (1 if i < rem else 0)
        out.append((start, stop))
        start = stop
    return out


@dataclass(frozen=True)
class Group:
    """One batch group: its batch slice and its ranks (global rank numbers, in token order)."""

    index: int
    batch: tuple[int, int]
    ranks: tuple[int, ...]
    shares: tuple[float, ...] | None = None
    """Relative speed of each rank of the group (its token and head shares follow); None: even."""


@dataclass(frozen=True)
class RankSlice:
    """What one rank computes in one forward."""

    rank: int
    group: Group
    position: int
    """Position of the rank inside its group (its token range and head range index)."""
    tokens: tuple[int, int]
    """Main-token range ``[start, stop)`` of the rank."""


def plan_groups(batch: int, n_ranks: int, speeds=None) -> list[Group]:
    """Batch groups for ``batch`` samples over ``n_ranks`` ranks (see the module docstring);
    ``speeds``: one relative speed per rank (None or all equal: even shares)."""
    if batch < 1 or n_ranks < 1:
        raise InputError(f"sequence split needs batch >= 1 and ranks >= 1, got {batch}, {n_ranks}")
    n_groups = max(g for g in range(1, n_ranks + 1) if n_ranks % g == 0 and g <= batch)
    per = n_ranks // n_groups
    if speeds is not None and len(set(speeds)) <= 1:
        speeds = None
    out = []
    for i, b in enumerate(even_ranges(batch, n_groups)):
        ranks = tuple(range(i * per, (i + 1) * per))
        shares = tuple(float(speeds[r]) for r in ranks) if speeds is not None and per > 1 else None
        out.append(Group(i, b, ranks, shares))
    return out


def rank_slices(groups: list[Group], main_tokens: int) -> list[RankSlice]:
    """One ``RankSlice`` per rank, in rank order."""
    out = []
    for g in groups:
        ranges = share_ranges(main_tokens, len(g.ranks), g.shares)
        for pos, (rank, rng) in enumerate(zip(g.ranks, ranges, strict=True)):
            out.append(RankSlice(rank, g, pos, rng))
    return sorted(out, key=lambda s: s.rank)


def slice_tokens(t: torch.Tensor, dim: int, rs: RankSlice, main: int, tail: int, what: str,
                 text_first: bool = False) -> torch.Tensor:
    """The rank's rows of ``t`` along ``dim``: its main range and the whole text (if present), in
    the model's order (text after the image tokens, or before them when ``text_first``)."""
    size = t.shape[dim]
    if size == 1:
        return t
    start, stop = rs.tokens
    if size == main:
        return t.narrow(dim, start, stop - start)
    if tail and size == main + tail:
        if text_first:
            return torch.cat([t.narrow(dim, 0, tail), t.narrow(dim, tail + start, stop - start)], dim=dim)
        return torch.cat([t.narrow(dim, start, stop - start), t.narrow(dim, main, tail)], dim=dim)
    raise InputError(f"sequence mode: argument {what!r} has {size} tokens on dim {dim}, expected "
                     f"{main} (image tokens), {main + tail} (with {tail} text tokens) or 1")


def cut_row_table(table, rs: RankSlice, main: int, tail: int, what: str) -> list:
    """A ``(start, stop, row)`` table over the token axis cut to the rank's rows ``rs.tokens``,
    renumbered from 0; a per-token ``row`` (a tensor of ``stop - start``) is sliced with it. Ranges
    outside the rank's rows are dropped. With replicated text tokens (``tail``) the table would
    have to cover them too: not supported (ValueError; the call runs whole)."""
    if tail:
        raise InputError(f"sequence mode: row table {what!r} beside replicated text tokens")
    t0, t1 = rs.tokens
    out = []
    for entry in table:
        a, b, row = entry
        if not (0 <= a <= b <= main):
            raise InputError(f"sequence mode: row table {what!r} has range {a}-{b} outside {main} tokens")
        lo, hi = max(a, t0), min(b, t1)
        if lo >= hi:
            continue
        if isinstance(row, torch.Tensor) and row.dim() > 0:
            row = row[lo - a:hi - a]
        out.append((lo - t0, hi - t0, row))
    return out


def slice_batch(t: torch.Tensor, batch: int, rs: RankSlice) -> torch.Tensor:
    """The rank's batch group of ``t`` when its first dimension is the batch, else ``t``."""
    b0, b1 = rs.group.batch
    if t.dim() == 0 or t.shape[0] != batch or (b0, b1) == (0, batch):
        return t
    return t[b0:b1]


def split_arg(obj, token_dim: int | None, rs: RankSlice, batch: int, main: int, tail: int, what: str,
              text_first: bool = False):
    """A block argument cut for one rank: batch group first, then tokens (a tensor, or each tensor
    inside tuples/lists: LTXV's ``pe = (cos, sin)``); everything else is returned as it is."""
    def cut(t: torch.Tensor) -> torch.Tensor:
        t = slice_batch(t, batch, rs)
        if token_dim is not None:
            t = slice_tokens(t, token_dim if token_dim >= 0 else t.dim() + token_dim, rs, main, tail, what,
                             text_first)
        return t
    return map_tensors(cut, obj, dicts=False)


def stream_parts(streams: dict) -> dict:
    """Stream name -> value, with a tuple-valued stream (LTX-2's ``x = (video, audio)``) given as
    one entry per item, named ``<name>.<i>`` (each item has its own rows on every rank)."""
    out = {}
    for name, value in streams.items():
        if isinstance(value, (tuple, list)):
            out.update({f"{name}.{i}": item for i, item in enumerate(value)})
        else:
            out[name] = value
    return out


def split_items(spec: TokenSpec, name: str, value) -> list:
    """The items of argument ``name`` that carry split tokens: a tuple stream's items but the
    ``whole_parts`` ones, else the value itself."""
    if name in spec.whole_parts and isinstance(value, (tuple, list)):
        return [v for i, v in enumerate(value) if i not in spec.whole_parts[name]]
    return [value]
