"""Ulysses self-attention across the ranks of one batch group (pure PyTorch).

Each rank holds its own token rows of q, k, v (all heads) and, optionally, the replicated text
tokens, after its rows or (``text_first``) before them, as the model orders them. One all-to-all gives every rank *all* tokens of its share of the heads; the user's
attention function runs on that (full sequence, fewer heads: per head exactly the unsharded
maths); a second all-to-all gives every rank its own rows back with all heads. ``heads`` that the
group size does not divide are split unevenly; a rank with no heads sends and receives but does
not attend.

Layouts (ComfyUI's ``optimized_attention``): ``q`` is ``[B, L, H*D]``, or ``[B, H, L, D]`` with
``skip_reshape=True`` (Flux/HunyuanVideo); the output is ``[B, L, H*D]``, or ``[B, H, L, D]`` with
``skip_output_reshape=True``.
"""
from __future__ import annotations

import torch

from .split import RankSlice, share_ranges

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
        raise RuntimeError(f"[ShardDiT] sequence mode: self-attention q/k/v token counts differ "
                           f"({q.shape[tok]}, {k.shape[tok]}, {v.shape[tok]})")

    def heads_of(x, h0, h1):
        return _head_slice(x, h0, h1, head_dim, heads_first)

    own, text = (tail, 0) if text_first else (0, mine)  # where this rank's rows and the text start
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
        raise NotImplementedError("[ShardDiT] sequence mode: a per-head self-attention mask is not supported; "
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
        raise RuntimeError(f"[ShardDiT] sequence mode: split keys/values have {k.shape[tok]} and {v.shape[tok]} "
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
