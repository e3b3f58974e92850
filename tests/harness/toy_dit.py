"""DiT-shaped toy modules for the pure engine tests and the benchmark (no ComfyUI).

``ToyDiT``: Wan-like. Blocks take ``(x, e, freqs, context, transformer_options={...})``; ``e`` is
timestep modulation, ``freqs`` a (cos, sin) tuple, ``transformer_options`` carries a tensor.
Optional inter-block code on the home device after ``inter_block`` indices (like Wan VACE).

``ToyMMDiT``: Hunyuan/Flux-like. Double blocks take ``img, txt`` as keywords and return both;
single blocks take the concatenation ``x``.
"""
from __future__ import annotations

import torch
from torch import nn


class ToyBlock(nn.Module):
    def __init__(self, dim: int, ffn: int):
        super().__init__()
        self.norm = nn.LayerNorm(dim, elementwise_affine=False)
        self.q = nn.Linear(dim, dim)
        self.kv = nn.Linear(dim, 2 * dim)
        self.o = nn.Linear(dim, dim)
        self.ffn = nn.Sequential(nn.Linear(dim, ffn), nn.GELU(approximate="tanh"), nn.Linear(ffn, dim))
        self.modulation = nn.Parameter(torch.randn(1, 3, dim) / dim ** 0.5)

    def forward(self, x, e, freqs, context, transformer_options={}):
        m = (self.modulation + e).chunk(3, dim=1)
        h = self.norm(x) * (1 + m[1]) + m[0]
        cos, sin = freqs
        q = self.q(h) * cos + self.q(h).flip(-1) * sin
        k, v = self.kv(torch.cat([h, context], dim=1)).chunk(2, dim=-1)
        a = torch.nn.functional.scaled_dot_product_attention(q.unsqueeze(1), k.unsqueeze(1), v.unsqueeze(1)).squeeze(1)
        x = x + self.o(a) * m[2]
        x = x + self.ffn(self.norm(x))
        scale = transformer_options.get("scale")
        return x if scale is None else x * scale


class ToyDiT(nn.Module):
    def __init__(self, dim=32, n_blocks=6, ffn=None, in_dim=8, inter_block=()):
        super().__init__()
        self.dim = dim
        self.embed = nn.Linear(in_dim, dim)
        self.time = nn.Linear(1, 3 * dim)
        self.text = nn.Linear(dim, dim)
        self.blocks = nn.ModuleList(ToyBlock(dim, ffn or 4 * dim) for _ in range(n_blocks))
        self.inter = nn.Linear(dim, dim)
        self.inter_block = frozenset(inter_block)
        self.head = nn.Linear(dim, in_dim)
        self.register_buffer("inv_freq", torch.linspace(0.1, 1.0, dim))

    def forward(self, x, t, context, transformer_options=None):
        opts = dict(transformer_options or {})
        x = self.embed(x)
        e = self.time(t.unsqueeze(1)).view(-1, 3, self.dim)
        pos = torch.arange(x.shape[1], device=x.device, dtype=x.dtype).unsqueeze(1) * self.inv_freq
        freqs = (pos.cos(), pos.sin())
        context = self.text(context)
        for i, block in enumerate(self.blocks):
            if i % 2:
                x = block(x, e, freqs, context, transformer_options=opts)
            else:
                x = block(x, e=e, freqs=freqs, context=context, transformer_options=opts)
            if i in self.inter_block:
                x = x + self.inter(x) * 0.5
        return self.head(x)


class ToyDoubleBlock(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.img = ToyBlock(dim, 2 * dim)
        self.txt = nn.Linear(dim, dim)

    def forward(self, img, txt, vec, pe, attn_mask=None, transformer_options={}):
        img = self.img(img, vec, pe, txt, transformer_options)
        txt = txt + self.txt(txt) * attn_mask
        return img, txt


class ToySingleBlock(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.lin = nn.Linear(dim, dim)

    def forward(self, x, vec, pe, attn_mask=None, transformer_options={}):
        return x + self.lin(x) * vec.narrow(1, 0, 1) * attn_mask


class ToyMMDiT(nn.Module):
    def __init__(self, dim=32, n_double=3, n_single=3):
        super().__init__()
        self.dim = dim
        self.img_in = nn.Linear(8, dim)
        self.time = nn.Linear(1, 3 * dim)
        self.double_blocks = nn.ModuleList(ToyDoubleBlock(dim) for _ in range(n_double))
        self.single_blocks = nn.ModuleList(ToySingleBlock(dim) for _ in range(n_single))
        self.out = nn.Linear(dim, 8)

    def forward(self, x, t, txt, control=None, transformer_options=None):
        opts = transformer_options or {}
        img = self.img_in(x)
        vec = self.time(t.unsqueeze(1)).view(-1, 3, self.dim)
        pos = torch.arange(img.shape[1], device=img.device, dtype=img.dtype).unsqueeze(1) / self.dim
        pe = (pos.cos(), pos.sin())
        mask = torch.ones((), device=img.device, dtype=img.dtype) * 0.5
        for i, block in enumerate(self.double_blocks):
            img, txt = block(img=img, txt=txt, vec=vec, pe=pe, attn_mask=mask, transformer_options=opts)
            if control is not None:
                img += control[i]
        x = torch.cat((img, txt), 1)
        for block in self.single_blocks:
            x = block(x, vec=vec, pe=pe, attn_mask=mask, transformer_options=opts)
        return self.out(x.narrow(1, 0, img.shape[1]))
