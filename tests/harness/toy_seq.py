"""DiT-shaped toys whose attention goes through a ComfyUI-style override hook (pure torch).

``attention(q, k, v, heads, transformer_options=...)`` behaves like ComfyUI 0.3.64's
``optimized_attention`` wrapped by ``wrap_attn``: when ``transformer_options`` carries
``optimized_attention_override`` it is called as ``override(func, q, k, v, heads=..., ...)``.

``SeqToyDiT`` (Wan-like): blocks ``(x, e, freqs, context, transformer_options)``; self-attention on
``[B, L, H*D]`` then cross-attention to the text; ``e`` may be per token (Wan 2.2 5B).
``SeqToyMMDiT`` (HunyuanVideo-like): double blocks ``(img, txt, vec, pe)`` with joint attention
over ``cat(img, txt)`` in ``[B, H, L, D]`` layout (``skip_reshape``), then single blocks over the
concatenation ``x``; ``pe`` covers image then text tokens on dim 2. With ``text_first=True`` every
one of those puts the text tokens first, as ComfyUI's HunyuanVideo does since 0.14.
"""
from __future__ import annotations

import torch
from torch import nn
from torch.nn.functional import scaled_dot_product_attention as sdpa


def _attention_impl(q, k, v, heads, mask=None, skip_reshape=False, skip_output_reshape=False, **kwargs):
    if skip_reshape:
        b, _, length, d = q.shape
    else:
        b, length, c = q.shape
        d = c // heads
        q, k, v = (t.view(b, -1, heads, d).transpose(1, 2) for t in (q, k, v))
    out = sdpa(q, k, v, attn_mask=mask)
    if skip_output_reshape:
        return out
    return out.transpose(1, 2).reshape(b, -1, heads * d)


def attention(q, k, v, heads, transformer_options=None, **kwargs):
    override = (transformer_options or {}).get("optimized_attention_override")
    if override is not None:
        return override(_attention_impl, q, k, v, heads=heads, transformer_options=transformer_options, **kwargs)
    return _attention_impl(q, k, v, heads, **kwargs)


class SeqBlock(nn.Module):
    def __init__(self, dim, heads, ffn):
        super().__init__()
        self.heads = heads
        self.norm = nn.LayerNorm(dim, elementwise_affine=False)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.o = nn.Linear(dim, dim)
        self.cq = nn.Linear(dim, dim)
        self.ckv = nn.Linear(dim, 2 * dim)
        self.co = nn.Linear(dim, dim)
        self.ffn = nn.Sequential(nn.Linear(dim, ffn), nn.GELU(approximate="tanh"), nn.Linear(ffn, dim))
        self.modulation = nn.Parameter(torch.randn(1, 1, 3, dim) / dim ** 0.5)

    def forward(self, x, e, freqs, context, transformer_options={}):
        m = (self.modulation + e).unbind(2)  # e: [B, 1 or L, 3, C]
        h = self.norm(x) * (1 + m[1]) + m[0]
        q, k, v = self.qkv(h).chunk(3, dim=-1)
        q, k = q * freqs, k * freqs  # rotary stand-in: per token
        x = x + self.o(attention(q, k, v, self.heads, transformer_options=transformer_options)) * m[2]
        ck, cv = self.ckv(context).chunk(2, dim=-1)
        x = x + self.co(attention(self.cq(self.norm(x)), ck, cv, self.heads, transformer_options=transformer_options))
        return x + self.ffn(self.norm(x))


class SeqToyDiT(nn.Module):
    def __init__(self, dim=64, heads=4, n_blocks=4, ffn=None, in_dim=8, per_token_e=False):
        super().__init__()
        self.dim, self.per_token_e = dim, per_token_e
        self.embed = nn.Linear(in_dim, dim)
        self.time = nn.Linear(1, 3 * dim)
        self.text = nn.Linear(dim, dim)
        self.blocks = nn.ModuleList(SeqBlock(dim, heads, ffn or 2 * dim) for _ in range(n_blocks))
        self.head = nn.Linear(dim, in_dim)

    def forward(self, x, t, context, transformer_options=None):
        opts = dict(transformer_options or {})
        x = self.embed(x)
        b, length, _ = x.shape
        dev, dt = x.device, x.dtype  # so the toy also runs on CUDA (benchmarks/gpu_check.py)
        tt = t.view(b, 1, 1) if not self.per_token_e else \
            t.view(b, 1, 1) * torch.linspace(0.5, 1.5, length, device=dev, dtype=dt).view(1, length, 1)
        e = self.time(tt).unflatten(-1, (3, self.dim))  # [B, 1 or L, 3, C]
        freqs = 1 + 0.1 * torch.sin(torch.arange(length, dtype=dt, device=dev).view(1, length, 1)
                                    * torch.linspace(0.1, 1, self.dim, device=dev, dtype=dt))
        context = self.text(context)
        for block in self.blocks:
            x = block(x, e, freqs, context, transformer_options=opts)
        return self.head(x)


class MMDouble(nn.Module):
    def __init__(self, dim, heads, text_first=False):
        super().__init__()
        self.heads, self.text_first = heads, text_first
        self.img_qkv, self.txt_qkv = nn.Linear(dim, 3 * dim), nn.Linear(dim, 3 * dim)
        self.img_o, self.txt_o = nn.Linear(dim, dim), nn.Linear(dim, dim)
        self.mod = nn.Linear(dim, dim)

    def forward(self, img, txt, vec, pe, attn_mask=None, modulation_dims_img=None, transformer_options={}):
        b, li, c = img.shape
        d = c // self.heads
        split = lambda t: t.view(b, -1, 3, self.heads, d).permute(2, 0, 3, 1, 4)  # noqa: E731
        iq, ik, iv = split(self.img_qkv(img))
        tq, tk, tv = split(self.txt_qkv(txt))
        pairs = ((tq, iq), (tk, ik), (tv, iv)) if self.text_first else ((iq, tq), (ik, tk), (iv, tv))
        q, k, v = (torch.cat(p, dim=2) * pe for p in pairs)
        a = attention(q, k, v, self.heads, transformer_options=transformer_options, skip_reshape=True, mask=attn_mask)
        lt = txt.shape[1]
        ia, ta = (a[:, lt:], a[:, :lt]) if self.text_first else (a[:, :li], a[:, li:])
        m = self.mod(vec).unsqueeze(1)
        txt += self.txt_o(ta)  # in place, as HunyuanVideo does: each rank must own its copy
        return img + self.img_o(ia) * m, txt


class MMSingle(nn.Module):
    def __init__(self, dim, heads):
        super().__init__()
        self.heads = heads
        self.qkv, self.o = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)

    def forward(self, x, vec, pe, attn_mask=None, modulation_dims=None, transformer_options={}):
        b, length, c = x.shape
        q, k, v = self.qkv(x).view(b, length, 3, self.heads, c // self.heads).permute(2, 0, 3, 1, 4)
        a = attention(q * pe, k * pe, v, self.heads, transformer_options=transformer_options, skip_reshape=True,
                      mask=attn_mask)
        return x + self.o(a) * vec.unsqueeze(1).sigmoid()


class SeqToyMMDiT(nn.Module):
    def __init__(self, dim=64, heads=4, n_double=2, n_single=2, in_dim=8, text_first=False):
        super().__init__()
        self.embed, self.text = nn.Linear(in_dim, dim), nn.Linear(dim, dim)
        self.time = nn.Linear(1, dim)
        self.text_first = text_first
        self.double_blocks = nn.ModuleList(MMDouble(dim, heads, text_first) for _ in range(n_double))
        self.single_blocks = nn.ModuleList(MMSingle(dim, heads) for _ in range(n_single))
        self.head = nn.Linear(dim, in_dim)
        self.dim, self.heads = dim, heads

    def forward(self, x, t, context, transformer_options=None, txt_mask=None):
        opts = dict(transformer_options or {})
        img, txt = self.embed(x), self.text(context)
        vec = self.time(t.view(-1, 1))
        li, lt = img.shape[1], txt.shape[1]
        d = self.dim // self.heads
        pos = torch.arange(li + lt, dtype=img.dtype, device=img.device).view(1, 1, li + lt, 1)
        pe = 1 + 0.05 * torch.cos(pos * torch.linspace(0.1, 1, d, device=img.device, dtype=img.dtype))  # token dim 2
        mask = None
        if txt_mask is not None:
            mask = torch.zeros(1, 1, li + lt, device=img.device, dtype=img.dtype)
            mask[:, 0, slice(0, lt) if self.text_first else slice(li, None)] = txt_mask
        for block in self.double_blocks:
            img, txt = block(img=img, txt=txt, vec=vec, pe=pe, attn_mask=mask, transformer_options=opts)
        xx = torch.cat((txt, img) if self.text_first else (img, txt), 1)
        for block in self.single_blocks:
            xx = block(xx, vec=vec, pe=pe, attn_mask=mask, transformer_options=opts)
        return self.head(xx[:, lt:] if self.text_first else xx[:, :li])
