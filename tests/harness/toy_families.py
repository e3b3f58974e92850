"""Toys shaped like the 2026 families' `sequence` layouts (pure torch; attention through the override
hook of ``toy_seq``), for the pure tests and ``benchmarks/sequence_parallel.py --family``.

``PackedToy`` (MiniMax H3-shaped): one sample's text and video rows packed in one ``[S, C]`` sequence
(no batch dimension), blocks ``(x, t_emb, mod_segments, rope_freqs)``: joint self-attention over every
row in ``[1, H, S, D]`` layout, a SwiGLU MLP, and modulation per row range (``mod_segments``:
``(start, stop, row)``, one range for the text, one per video frame).

``TextThenVisualToy`` (Kandinsky 5-shaped): text blocks ``(x, time_embed)`` refine the text alone,
then visual blocks ``(visual_embed, text_embed, time_embed, freqs)``: self-attention in ``[B, H, L, D]``
layout, cross-attention to the text, GELU FFN.

``AVToy`` (LTX-2.3-shaped): blocks ``(x=(video, audio), v_context, v_timestep, a_timestep, v_pe)``
return the pair: video self-attention (``attn1``), audio self-attention, video cross-attention to the
text, audio->video attention (video queries, audio keys/values), video->audio attention
(``video_to_audio_attn``: audio queries, video keys/values), an FFN per stream; the video timesteps
are ``FrameRows`` (LTX-2's ``CompressedTimestep``: one row per frame, expanded per token).
"""
from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from .toy_seq import attention

PACKED_SPEC = {"x": 0, "rope_freqs": 2}
"""``TokenSpec`` token dims of ``PackedToy`` (with ``unbatched=True, row_tables=("mod_segments",)``)."""


class PackedBlock(nn.Module):
    def __init__(self, dim, heads, ffn):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim, bias=False)
        self.out = nn.Linear(dim, dim, bias=False)
        self.fc1 = nn.Linear(dim, 2 * ffn, bias=False)
        self.fc2 = nn.Linear(ffn, dim, bias=False)
        self.mod = nn.Linear(dim, 2 * dim)

    def forward(self, x, t_emb, mod_segments, rope_freqs, transformer_options={}):
        shift, scale = self.mod(t_emb).chunk(2, dim=-1)  # one row per modulation kind
        h = F.layer_norm(x, x.shape[-1:])
        for a, b, row in mod_segments:
            h[a:b] = h[a:b] * (1 + scale[row]) + shift[row]
        s, c = x.shape
        q, k, v = (t.view(s, self.heads, c // self.heads).transpose(0, 1).unsqueeze(0) for t in self.qkv(h).chunk(3, -1))
        q, k = q * rope_freqs, k * rope_freqs  # rotary stand-in: [1, 1, S, 1] per row
        x = x + self.out(attention(q, k, v, self.heads, skip_reshape=True,
                                   transformer_options=transformer_options).squeeze(0))
        g, u = self.fc1(F.layer_norm(x, x.shape[-1:])).chunk(2, dim=-1)
        return x + self.fc2(F.silu(g) * u)


class PackedToy(nn.Module):
    def __init__(self, dim=64, heads=4, n_blocks=4, ffn=None, in_dim=8, text_dim=16):
        super().__init__()
        self.embed, self.text = nn.Linear(in_dim, dim), nn.Linear(text_dim, dim)
        self.time = nn.Linear(1, dim)
        self.blocks = nn.ModuleList(PackedBlock(dim, heads, ffn or 2 * dim) for _ in range(n_blocks))
        self.head = nn.Linear(dim, in_dim)

    def forward(self, x, t, context, transformer_options=None):
        """``x`` [1, frames, rows per frame, in_dim], ``context`` [1, T, text_dim], ``t`` [1]."""
        opts = dict(transformer_options or {})
        frames, per = x.shape[1], x.shape[2]
        text = self.text(context[0])
        h = torch.cat([text, self.embed(x[0].flatten(0, 1))])  # [S, C]: text rows, then video rows
        s = h.shape[0]
        t_emb = self.time(torch.stack([t.view(1), 0.5 * t.view(1)]))  # row 0: text, row 1: video
        n = text.shape[0]
        segments = [(0, n, 0)] + [(n + f * per, n + (f + 1) * per, 1) for f in range(frames)]
        rope = 1 + 0.1 * torch.sin(torch.arange(s, dtype=h.dtype)).view(1, 1, s, 1)
        for block in self.blocks:
            h = block(h, t_emb, segments, rope, transformer_options=opts)
        return self.head(h[n:]).view(1, frames, per, -1)


class TextBlock(nn.Module):
    def __init__(self, dim, heads):
        super().__init__()
        self.heads, self.qkv, self.o = heads, nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.mod = nn.Linear(dim, dim)

    def forward(self, x, time_embed, transformer_options={}):
        h = F.layer_norm(x, x.shape[-1:]) * (1 + self.mod(time_embed).unsqueeze(1))
        q, k, v = self.qkv(h).chunk(3, dim=-1)
        return x + self.o(attention(q, k, v, self.heads, transformer_options=transformer_options))


class SelfAttention(nn.Module):
    """Kandinsky 5's ``TransformerDecoderBlock.self_attention``: the module that calls attention."""

    def __init__(self, dim, heads):
        super().__init__()
        self.heads, self.qkv, self.o = heads, nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)

    def forward(self, h, freqs, transformer_options={}):
        b, length, c = h.shape
        q, k, v = (t.view(b, length, self.heads, c // self.heads).transpose(1, 2) for t in self.qkv(h).chunk(3, -1))
        q, k = q * freqs, k * freqs  # [1, 1, L, 1]
        return self.o(attention(q, k, v, self.heads, skip_reshape=True, transformer_options=transformer_options))


class VisualBlock(nn.Module):
    def __init__(self, dim, heads, ffn):
        super().__init__()
        self.heads = heads
        self.self_attention = SelfAttention(dim, heads)
        self.cq, self.ckv, self.co = nn.Linear(dim, dim), nn.Linear(dim, 2 * dim), nn.Linear(dim, dim)
        self.ffn = nn.Sequential(nn.Linear(dim, ffn), nn.GELU(approximate="tanh"), nn.Linear(ffn, dim))
        self.mod = nn.Linear(dim, dim)

    def forward(self, visual_embed, text_embed, time_embed, freqs, transformer_options={}):
        x = visual_embed
        h = F.layer_norm(x, x.shape[-1:]) * (1 + self.mod(time_embed).unsqueeze(1))
        x = x + self.self_attention(h, freqs, transformer_options=transformer_options)
        ck, cv = self.ckv(text_embed).chunk(2, dim=-1)
        x = x + self.co(attention(self.cq(F.layer_norm(x, x.shape[-1:])), ck, cv, self.heads,
                                  transformer_options=transformer_options))
        return x + self.ffn(F.layer_norm(x, x.shape[-1:]))


class TextThenVisualToy(nn.Module):
    def __init__(self, dim=64, heads=4, text_blocks=2, visual_blocks=4, ffn=None, in_dim=8, text_dim=16):
        super().__init__()
        self.embed, self.text, self.time = nn.Linear(in_dim, dim), nn.Linear(text_dim, dim), nn.Linear(1, dim)
        self.text_blocks = nn.ModuleList(TextBlock(dim, heads) for _ in range(text_blocks))
        self.visual_blocks = nn.ModuleList(VisualBlock(dim, heads, ffn or 2 * dim) for _ in range(visual_blocks))
        self.head = nn.Linear(dim, in_dim)

    def forward(self, x, t, context, transformer_options=None):
        """``x`` [B, L, in_dim], ``t`` [B], ``context`` [B, T, text_dim]."""
        opts = dict(transformer_options or {})
        time_embed = self.time(t.view(-1, 1))
        text = self.text(context)
        for block in self.text_blocks:
            text = block(text, time_embed, transformer_options=opts)
        v = self.embed(x)
        freqs = 1 + 0.1 * torch.sin(torch.arange(v.shape[1], dtype=v.dtype)).view(1, 1, -1, 1)
        for block in self.visual_blocks:
            v = block(v, text, time_embed, freqs, transformer_options=opts)
        return self.head(v)


AV_SPEC = {"token_dims": {"x": 1, "v_pe": 1}, "whole_parts": {"x": (1,)}, "frame_tables": ("v_timestep",),
           "gather_kv": ("video_to_audio_attn",)}
"""``TokenSpec`` keywords of ``AVToy`` (as the LTX-2 entry of ``parallel/families.py``)."""


class FrameRows:
    """LTX-2's ``CompressedTimestep`` in small: ``data`` [B, frames, C], each row for ``patches_per_frame`` tokens."""

    __slots__ = ("batch_size", "data", "num_frames", "patches_per_frame")

    def __init__(self, data, per):
        self.data, self.patches_per_frame = data, per
        self.batch_size, self.num_frames = data.shape[:2]

    def expand(self):
        return self.data.repeat_interleave(self.patches_per_frame, dim=1)


class Attn(nn.Module):
    """Queries from ``x``, keys/values from ``context`` (else ``x``), ``inner`` wide, one attention call."""

    def __init__(self, dim, heads, inner, kv_dim=None):
        super().__init__()
        self.heads, self.q, self.kv = heads, nn.Linear(dim, inner), nn.Linear(kv_dim or dim, 2 * inner)
        self.o = nn.Linear(inner, dim)

    def forward(self, x, context=None, pe=None, transformer_options=None):
        q, (k, v) = self.q(x), self.kv(x if context is None else context).chunk(2, dim=-1)
        if pe is not None:
            q, k = q * pe, k * pe  # rotary stand-in, per token
        return self.o(attention(q, k, v, self.heads, transformer_options=transformer_options))


def _n(x):
    return F.layer_norm(x, x.shape[-1:])


class AVBlock(nn.Module):
    def __init__(self, dim, a_dim, heads, a_heads):
        super().__init__()
        self.attn1, self.audio_attn1 = Attn(dim, heads, dim), Attn(a_dim, a_heads, a_dim)
        self.attn2 = Attn(dim, heads, dim)
        self.audio_to_video_attn = Attn(dim, a_heads, a_dim, kv_dim=a_dim)
        self.video_to_audio_attn = Attn(a_dim, a_heads, a_dim, kv_dim=dim)
        self.ff = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(approximate="tanh"), nn.Linear(4 * dim, dim))
        self.audio_ff = nn.Sequential(nn.Linear(a_dim, 4 * a_dim), nn.GELU(approximate="tanh"), nn.Linear(4 * a_dim, a_dim))

    def forward(self, x, v_context, v_timestep, a_timestep, v_pe, transformer_options=None):
        vx, ax = x
        opts = transformer_options
        scale = 1 + v_timestep.expand()
        vx = vx + self.attn1(_n(vx) * scale, pe=v_pe, transformer_options=opts)
        ax = ax + self.audio_attn1(_n(ax) * (1 + a_timestep), transformer_options=opts)
        vx = vx + self.attn2(_n(vx), context=v_context, transformer_options=opts)
        vx = vx + self.audio_to_video_attn(_n(vx), context=_n(ax), transformer_options=opts)
        ax = ax + self.video_to_audio_attn(_n(ax), context=_n(vx) * scale, transformer_options=opts)
        return vx + self.ff(_n(vx) * scale), ax + self.audio_ff(_n(ax))


class AVToy(nn.Module):
    def __init__(self, dim=64, heads=4, n_blocks=4, in_dim=8, text_dim=16, a_dim=None, a_heads=2):
        super().__init__()
        a_dim = a_dim or dim // 2
        self.embed, self.a_embed, self.text = nn.Linear(in_dim, dim), nn.Linear(in_dim, a_dim), nn.Linear(text_dim, dim)
        self.time, self.a_time = nn.Linear(1, dim), nn.Linear(1, a_dim)
        self.transformer_blocks = nn.ModuleList(AVBlock(dim, a_dim, heads, a_heads) for _ in range(n_blocks))
        self.head, self.a_head = nn.Linear(dim, in_dim), nn.Linear(a_dim, in_dim)

    def forward(self, x, t, context, transformer_options=None):
        """``x`` = (video [B, frames, tokens per frame, in_dim], audio [B, A, in_dim]), ``t`` [B, frames]
        (a timestep per frame), ``context`` [B, T, text_dim]; returns (video, audio) as given."""
        opts = dict(transformer_options or {})
        video, audio = x
        b, _, per = video.shape[:3]
        vx, ax = self.embed(video.flatten(1, 2)), self.a_embed(audio)
        v_t = FrameRows(self.time(t.unsqueeze(-1)), per)
        a_t = self.a_time(t.mean(1).view(b, 1, 1))
        pe = 1 + 0.1 * torch.sin(torch.arange(vx.shape[1], dtype=vx.dtype)).view(1, -1, 1)
        text = self.text(context)
        for block in self.transformer_blocks:
            vx, ax = block((vx, ax), text, v_t, a_t, pe, transformer_options=opts)
        return self.head(vx).view(video.shape), self.a_head(ax)
