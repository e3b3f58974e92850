"""Ulysses self-attention across the ranks of one batch group (pure PyTorch).

Each rank holds its own token rows of q, k, v (all heads) and, optionally, the replicated text
tokens, after its rows or (``text_first``) before them, as the model orders them. One all-to-all gives every rank *all* tokens of its share of the heads; the user's
attention function runs on that (full sequence, fewer heads: per head exactly the unsharded
maths); a second all-to-all gives every rank its own rows back with all heads. ``heads`` that the
group size does not divide are split unevenly; a rank with no heads sends and receives but does
not attend.

**Pipelined by head chunks** (GPU ranks of this process: ``threads.ThreadExchange.pipeline_chunks``
> 1): the heads of every rank are cut into C chunks (``split.head_chunks``: at most the fewest
heads a rank holds, so uneven counts such as 40 heads over 3 ranks or 56 heads chunk the same way
on every rank). Chunk c+1's q/k/v are exchanged on each rank's exchange stream while chunk c
attends on its compute stream, and chunk c's output goes back while chunk c+1 attends
(``split.pipeline_schedule``: the order the cost model prices). Attention is per head, so each
head's maths is the unchunked one. On CPU ranks, fake devices and worker processes C is 1: the
path above, unchanged. ``gathered_kv_attention`` (LTX-2's cross-modal attention: whole queries,
few rows back) is never chunked: its exchange is the keys/values alone, with no output rows of
the size of the queries to hide, and it keeps this path.

Layouts (ComfyUI's ``optimized_attention``): ``q`` is ``[B, L, H*D]``, or ``[B, H, L, D]`` with
``skip_reshape=True`` (Flux/HunyuanVideo); the output is ``[B, L, H*D]``, or ``[B, H, L, D]`` with
``skip_output_reshape=True``.
"""
from __future__ import annotations

import torch

from .split import RankSlice, even_ranges, head_chunks, pipeline_schedule, share_ranges
from .stream import wait_on
from ..errors import NotSupported, RunError

__all__ = ["gathered_kv_attention", "ulysses_attention"]


def _head_slice(x: torch.Tensor, h0: int, h1: int, head_dim: int, heads_first: bool) -> torch.Tensor:
    if heads_first:
        return x[:, h0:h1]
    return x[..., h0 * head_dim:h1 * head_dim]


def ulysses_attention(exchange, rs: RankSlice, main: int, attend, args: tuple, kwargs: dict,
                      text_first: bool = False):
    """``attend(q, k, v, heads, **kwargs)`` over the group's whole sequence in the model's token
    order (text tokens after the image tokens, or before them when ``text_first``), this rank's
    rows back."""
    kwargs = dict(kwargs)
    q, k, v = args[:3]
    heads = args[3] if len(args) > 3 else kwargs.pop("heads")
    extra = args[4:]
    heads_first = bool(kwargs.get("skip_reshape", False))
    tok = 2 if heads_first else 1
    head_dim = q.shape[-1] if heads_first else q.shape[-1] // heads
    n, pos = len(rs.group.ranks), rs.position
    shares = getattr(rs.group, "shares", None)  # a faster rank takes more tokens and heads
    head_ranges = share_ranges(heads, n, shares)
    token_ranges = share_ranges(main, n, shares)
    mine = rs.tokens[1] - rs.tokens[0]
    tail = q.shape[tok] - mine
    if q.shape[tok] != k.shape[tok] or k.shape[tok] != v.shape[tok]:
        raise RunError(f"sequence mode: self-attention q/k/v token counts differ "
                       f"({q.shape[tok]}, {k.shape[tok]}, {v.shape[tok]})")

    def heads_of(x, h0, h1):
        return _head_slice(x, h0, h1, head_dim, heads_first)

    own, text = (tail, 0) if text_first else (0, mine)  # where this rank's rows and the text start
    chunks = head_chunks(head_ranges, exchange.pipeline_chunks()) if hasattr(exchange, "pipeline_chunks") else 1
    if chunks > 1:
        return _pipelined(exchange, pos, chunks, head_ranges, token_ranges, (q, k, v), tok, own, text, mine, tail,
                          main, text_first, heads, head_dim, attend, extra, kwargs)
    parts = [tuple(heads_of(x.narrow(tok, own, mine), h0, h1) for x in (q, k, v)) for h0, h1 in head_ranges]
    # what position j sends this one: its own rows of this rank's heads (known here: no header)
    expect = [[_resized(t, tok, b - a) for t in parts[pos]] for a, b in token_ranges]
    recv = exchange.all_to_all(pos, parts, expect)
    h0, h1 = head_ranges[pos]
    full = []
    for i, x in enumerate((q, k, v)):
        pieces = [recv[j][i] for j in range(n)]
        if tail:
            t = heads_of(x.narrow(tok, text, tail), h0, h1)
            pieces = [t] + pieces if text_first else pieces + [t]
        full.append(torch.cat(pieces, dim=tok))
    out = _attend_heads(attend, full, h1 - h0, heads, head_dim, extra, kwargs)

    out_heads_first = bool(kwargs.get("skip_output_reshape", False))
    otok = 2 if out_heads_first else 1
    rows_at, text_at = (tail, 0) if text_first else (0, main)  # in the whole sequence
    back = [(out.narrow(otok, rows_at + a, b - a), out.narrow(otok, text_at, tail) if tail else None)
            for a, b in token_ranges]
    hdim = 1 if out_heads_first else back[pos][0].dim() - 1
    width = 1 if out_heads_first else head_dim  # position j sends this rank's rows of j's heads
    expect = [[None if t is None else _resized(t, hdim, (b - a) * width) for t in back[pos]] for a, b in head_ranges]
    recv = exchange.all_to_all(pos, back, expect)
    hdim = 1 if out_heads_first else -1
    rows = torch.cat([recv[j][0] for j in range(n)], dim=hdim)
    if not tail:
        return rows
    text_rows = torch.cat([recv[j][1] for j in range(n)], dim=hdim)
    return torch.cat([text_rows, rows] if text_first else [rows, text_rows], dim=otok)


def _pipelined(exchange, pos: int, chunks: int, head_ranges, token_ranges, qkv, tok: int, own: int, text: int,
               mine: int, tail: int, main: int, text_first: bool, heads: int, head_dim: int, attend, extra, kwargs):
    """``ulysses_attention`` with the heads in ``chunks`` chunks, run in ``pipeline_schedule``'s
    order over ``exchange.start`` (copies on the exchange stream, ordered by events)."""
    ops, n = exchange.ops, len(head_ranges)
    cur = ops.current_stream(exchange.places[pos])
    heads_first = bool(kwargs.get("skip_reshape", False))
    out_heads_first = bool(kwargs.get("skip_output_reshape", False))
    otok = 2 if out_heads_first else 1
    rows_at, text_at = (tail, 0) if text_first else (0, main)
    hdim = 1 if out_heads_first else -1
    sub = [[(a + c0, a + c1) for c0, c1 in even_ranges(b - a, chunks)] for a, b in head_ranges]
    rows = [x.narrow(tok, own, mine) for x in qkv]
    sent, qkv_in, backs, outs = [], {}, {}, {}
    for step, c in pipeline_schedule(chunks):
        if step == "qkv":  # to position j: this rank's rows of j's chunk-c heads
            parts = [tuple(_head_slice(x, *sub[j][c], head_dim, heads_first) for x in rows) for j in range(n)]
            ops.kernel(cur, writes=[t for p in parts for t in p], label=f"q/k/v {c}")  # the projections made them
            sent += [t for p in parts for t in p]
            qkv_in[c] = exchange.start(pos, parts, f"q/k/v {c}")
        elif step == "attend":
            recv, done = qkv_in.pop(c)
            if wait_on("attention_waits_exchange"):
                ops.wait(cur, done)
            h0, h1 = sub[pos][c]
            full = []
            for i, x in enumerate(qkv):
                pieces = [recv[j][i] for j in range(n)]
                if tail:
                    t = _head_slice(x.narrow(tok, text, tail), h0, h1, head_dim, heads_first)
                    pieces = [t] + pieces if text_first else pieces + [t]
                full.append(torch.cat(pieces, dim=tok))
            out = _attend_heads(attend, full, h1 - h0, heads, head_dim, extra, kwargs)
            back = [(out.narrow(otok, rows_at + a, b - a), out.narrow(otok, text_at, tail) if tail else None)
                    for a, b in token_ranges]
            backs[c] = back
            ops.kernel(cur, reads=[t for r in recv for t in r], writes=[t for p in back for t in p if t is not None],
                       label=f"attention {c}")
        else:  # chunk c's output rows back to their ranks
            back = backs.pop(c)
            sent += [t for p in back for t in p if t is not None]
            outs[c] = exchange.start(pos, back, f"out {c}")
    for _, done in outs.values():  # every output copy done before the heads are put together
        if wait_on("gather_waits_outputs"):
            ops.wait(cur, done)
    got = [outs[c][0] for c in range(chunks)]
    # heads in model order: position j's chunks in order, positions in order
    rows_out = torch.cat([got[c][j][0] for j in range(n) for c in range(chunks)], dim=hdim)
    text_out = torch.cat([got[c][j][1] for j in range(n) for c in range(chunks)], dim=hdim) if tail else None
    ops.kernel(cur, reads=[t for g in got for r in g for t in r if t is not None], label="gather heads")
    exchange.settle(pos)
    ops.kernel(cur, writes=sent, label="reuse")  # the allocator may hand what this rank posted to the next kernel
    if not tail:
        return rows_out
    return torch.cat([text_out, rows_out] if text_first else [rows_out, text_out], dim=otok)


def _resized(t: torch.Tensor, dim: int, size: int) -> tuple:
    """(dtype, shape) of ``t`` with dimension ``dim`` of length ``size``."""
    shape = list(t.shape)
    shape[dim] = size
    return (t.dtype, tuple(shape))


def _attend_heads(attend, qkv, n_heads: int, heads: int, head_dim: int, extra, kwargs):
    q, k, v = qkv
    heads_first = bool(kwargs.get("skip_reshape", False))
    out_heads_first = bool(kwargs.get("skip_output_reshape", False))
    if n_heads == 0:  # more ranks than heads: this rank only relays
        b, length = q.shape[0], q.shape[2 if heads_first else 1]
        shape = (b, 0, length, head_dim) if out_heads_first else (b, length, 0)
        return torch.empty(shape, dtype=v.dtype, device=v.device)
    mask = kwargs.get("mask")
    if isinstance(mask, torch.Tensor) and mask.dim() == 4 and mask.shape[1] == heads and heads > 1:
        raise NotSupported("sequence mode: a per-head self-attention mask is not supported; "
                           "use parallel=blocks for this model")
    return attend(q, k, v, n_heads, *extra, **kwargs)


def gathered_kv_attention(exchange, rs: RankSlice, main: int, attend, args: tuple, kwargs: dict):
    """``attend(q, k, v, heads, ...)`` with whole queries (the same on every rank) and keys/values
    split by tokens (each rank holds its own rows: LTX-2's video->audio attention, audio queries
    and video keys/values). Split by heads instead, as Ulysses does: one all-to-all gives each rank
    the keys/values of *all* tokens for its share of the heads, it attends its heads' queries
    (per head exactly the unsharded maths), and a second all-to-all gives every rank every head's
    output (the queries' rows: few). Bytes received per rank: ``2 x L x width x (g-1) / g^2``."""
    kwargs = dict(kwargs)
    q, k, v = args[:3]
    heads = args[3] if len(args) > 3 else kwargs.pop("heads")
    heads_first = bool(kwargs.get("skip_reshape", False))
    tok = 2 if heads_first else 1
    head_dim = q.shape[-1] if heads_first else q.shape[-1] // heads
    n, pos = len(rs.group.ranks), rs.position
    shares = getattr(rs.group, "shares", None)
    head_ranges, token_ranges = share_ranges(heads, n, shares), share_ranges(main, n, shares)
    mine = token_ranges[pos][1] - token_ranges[pos][0]
    if k.shape[tok] != mine or v.shape[tok] != mine:
        raise RunError(f"sequence mode: split keys/values have {k.shape[tok]} and {v.shape[tok]} "
                       f"tokens, expected this rank's {mine}")
    parts = [tuple(_head_slice(x, h0, h1, head_dim, heads_first) for x in (k, v)) for h0, h1 in head_ranges]
    expect = [[_resized(t, tok, b - a) for t in parts[pos]] for a, b in token_ranges]
    recv = exchange.all_to_all(pos, parts, expect)
    full = [torch.cat([recv[j][i] for j in range(n)], dim=tok) for i in (0, 1)]
    h0, h1 = head_ranges[pos]
    out = _attend_heads(attend, [_head_slice(q, h0, h1, head_dim, heads_first), *full], h1 - h0, heads, head_dim,
                        args[4:], kwargs)
    heads_out = bool(kwargs.get("skip_output_reshape", False))
    hdim, width = (1, 1) if heads_out else (-1, head_dim)
    expect = [[_resized(out, hdim, (b - a) * width)] for a, b in head_ranges]
    recv = exchange.all_to_all(pos, [(out,)] * n, expect)
    return torch.cat([recv[j][0] for j in range(n)], dim=hdim)
