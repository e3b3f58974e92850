"""Which attention call of a block is its self-attention, in `sequence` mode (pure torch, CI).

The toy here is shaped like ComfyUI's LTXV block: ``attn1`` (self-attention) and ``attn2``
(cross-attention to the text) are submodules that call attention through the override hook, the
way newer ComfyUI (0.38.1, read from ``comfy/ldm/modules/attention.py``) calls it:

- ``optimized_attention(q, k, v, heads, preferred_attention=self.comfy_attention, ...)``: with an
  override installed core drops ``preferred_attention`` and calls ``override(func, q, k, v, ...)``;
  without one it calls ``preferred_attention.function`` when the checkpoint set one (e.g.
  comfy-kitchen's int8 attention), else ``func``;
- q, k, v may come in single-owner containers (``peek()``/``take()``), unwrapped by core for an
  override without ``container_function``;
- core's LTXV STG passes ``stg_skip_self_attn`` in a perturbed block's ``transformer_options``: its
  ``attn1`` then returns its values without calling attention (0.33 ``lightricks/model.py``).

Every comparison is against the unsharded toy on one thread (within ``TOY_SPLIT_BOUND``: a rank's
rows are fewer GEMM rows than the whole sequence's).
"""
import pytest
import torch
from harness.numerics import assert_split_close
from harness.toy_seq import SeqToyDiT, _attention_impl
from torch import nn

from sharddit.parallel.blocks.sharding import attach_block_sharding
from sharddit.parallel.blocks.routing import BlockLayout
from sharddit.parallel.sequence.engine import attach_sequence_engine
from sharddit.parallel.sequence.rank_block import ATTENTION_OVERRIDE, BlockAttention
from sharddit.parallel.sequence.split import TokenSpec

LAYOUT = BlockLayout(("blocks",), (("x",),))
SPEC = (TokenSpec({"x": 1, "e": 1, "freqs": 1}),)
TOKENS, TEXT = 13, 13  # as many text tokens as image tokens: q/k/v shapes cannot tell the calls apart


class Container:
    """A single-owner holder of one tensor, as 0.38.1's ``AttentionTensorContainer`` behaves."""

    __slots__ = ("tensor",)

    def __init__(self, tensor):
        self.tensor = tensor

    def peek(self):
        if self.tensor is None:
            raise RuntimeError("container already consumed")
        return self.tensor

    def take(self):
        t = self.peek()
        self.tensor = None
        return t


class Preferred:
    """A module's ``comfy_attention``: ``function`` is the checkpoint's preferred attention."""

    def __init__(self, function=None):
        self.function = function


def coarse_attention(q, k, v, heads, **kwargs):
    """A preferred attention whose result differs from the default (scores on a coarse grid)."""
    b, _, c = q.shape
    d = c // heads
    q, k, v = (t.view(b, -1, heads, d).transpose(1, 2) for t in (q, k, v))
    scores = torch.round(q @ k.transpose(-1, -2) * d ** -0.5 * 4) / 4
    return (scores.softmax(-1) @ v).transpose(1, 2).reshape(b, -1, c)


CONTAINERS_TO_OVERRIDE = []  # True while a test hands the override containers (a caller that does not unwrap)


def attention(q, k, v, heads, transformer_options, preferred_attention=None):
    """0.38.1's ``wrap_attn`` rules, written for this toy."""
    override = transformer_options.get(ATTENTION_OVERRIDE)
    if override is not None:
        if CONTAINERS_TO_OVERRIDE:
            q, k, v = Container(q), Container(k), Container(v)
        return override(_attention_impl, q, k, v, heads=heads, transformer_options=transformer_options)
    if preferred_attention is not None and preferred_attention.function is not None:
        return preferred_attention.function(q, k, v, heads)
    return _attention_impl(q, k, v, heads)


class ToyCrossAttention(nn.Module):
    def __init__(self, dim, heads, preferred=None):
        super().__init__()
        self.heads = heads
        self.to_q, self.to_k, self.to_v, self.to_out = (nn.Linear(dim, dim) for _ in range(4))
        self.comfy_attention = Preferred(preferred)

    def forward(self, x, context=None, freqs=None, transformer_options=None):
        transformer_options = transformer_options or {}
        self_attn = context is None
        context = x if context is None else context
        q, k, v = self.to_q(x), self.to_k(context), self.to_v(context)
        if self_attn and transformer_options.get("stg_skip_self_attn", False):
            return self.to_out(v)
        if freqs is not None:
            q, k = q * freqs, k * freqs
        out = attention(q, k, v, self.heads, transformer_options, preferred_attention=self.comfy_attention)
        return self.to_out(out)


class ToyLTXBlock(nn.Module):
    def __init__(self, dim, heads, preferred=None):
        super().__init__()
        self.norm = nn.LayerNorm(dim, elementwise_affine=False)
        self.attn1 = ToyCrossAttention(dim, heads, preferred)
        self.attn2 = ToyCrossAttention(dim, heads, preferred)
        self.ff = nn.Sequential(nn.Linear(dim, 2 * dim), nn.GELU(approximate="tanh"), nn.Linear(2 * dim, dim))
        self.modulation = nn.Parameter(torch.randn(1, 1, 3, dim) / dim ** 0.5)

    def forward(self, x, e, freqs, context, transformer_options=None):
        m = (self.modulation + e).unbind(2)
        x = x + self.attn1(self.norm(x) * (1 + m[1]) + m[0], freqs=freqs,
                           transformer_options=transformer_options) * m[2]
        x = x + self.attn2(self.norm(x), context=context, transformer_options=transformer_options)
        return x + self.ff(self.norm(x))


class ToyLTX(SeqToyDiT):
    """``SeqToyDiT``'s embeddings with LTXV-shaped blocks; ``stg_blocks`` perturbed as core's STG does."""

    def __init__(self, dim=32, heads=4, n_blocks=3, preferred=None):
        super().__init__(dim=dim, heads=heads, n_blocks=n_blocks)
        self.blocks = nn.ModuleList(ToyLTXBlock(dim, heads, preferred) for _ in range(n_blocks))
        self.stg_blocks = frozenset()

    def forward(self, x, t, context, transformer_options=None):
        opts = dict(transformer_options or {})
        x = self.embed(x)
        b, length, _ = x.shape
        e = self.time(t.view(b, 1, 1)).unflatten(-1, (3, self.dim))
        freqs = 1 + 0.1 * torch.sin(torch.arange(length, dtype=x.dtype).view(1, length, 1)
                                    * torch.linspace(0.1, 1, self.dim, dtype=x.dtype))
        context = self.text(context)
        for i, block in enumerate(self.blocks):
            block_opts = {**opts, "stg_skip_self_attn": True} if i in self.stg_blocks else opts
            x = block(x, e, freqs, context, transformer_options=block_opts)
        return self.head(x)


def _inputs(batch=1):
    g = torch.Generator().manual_seed(3)
    return (torch.randn(batch, TOKENS, 8, generator=g), torch.rand(batch, generator=g),
            torch.randn(batch, TEXT, 32, generator=g))


def _sharded_vs_unsharded(model, ranks=("cpu", "cpu"), batch=1):
    x, t, ctx = _inputs(batch)
    with torch.no_grad():
        ref = model(x, t, ctx)
    n = len(model.blocks)
    handle = attach_block_sharding(model, LAYOUT, [ranks[g * len(ranks) // n] for g in range(n)], "cpu")
    engine = attach_sequence_engine(handle.router, handle.proxies["blocks"], SPEC, list(ranks), timeout_s=30)
    try:
        with torch.no_grad(), handle.router.forward_scope(sequence=True):
            out = model(x, t, ctx)
        return out, ref, engine.stats
    finally:
        engine.close()
        handle.detach()


@pytest.mark.parametrize("stg_blocks", [frozenset(), frozenset({1}), frozenset({0, 2})])
def test_a_perturbed_blocks_cross_attention_stays_local(stg_blocks):
    """STG: a perturbed block's first (and only) attention call is its cross-attention; run as
    Ulysses, its k/v (the text) would be exchanged as if they were the rank's image rows."""
    torch.manual_seed(0)
    model = ToyLTX().eval()
    model.stg_blocks = stg_blocks
    out, ref, stats = _sharded_vs_unsharded(model)
    assert_split_close(out, ref, what=f"LTXV-shaped toy, STG on blocks {sorted(stg_blocks)}")
    n = len(model.blocks)
    assert stats.fallbacks == 0 and stats.exchanges == [2 * (n - len(stg_blocks))] * 2


def test_the_checkpoints_preferred_attention_is_kept_under_the_override():
    torch.manual_seed(0)
    model = ToyLTX(preferred=coarse_attention).eval()
    out, ref, stats = _sharded_vs_unsharded(model)
    assert_split_close(out, ref, what="preferred attention kept (Ulysses and local calls)")
    assert stats.exchanges == [2 * len(model.blocks)] * 2
    x, t, ctx = _inputs()
    for block in model.blocks:
        block.attn1.comfy_attention.function = block.attn2.comfy_attention.function = None
    with torch.no_grad():
        assert (model(x, t, ctx) - ref).abs().max() > 1e-3, "the preferred attention must change this toy's result"


def test_containers_are_taken_and_give_what_tensors_give():
    torch.manual_seed(0)
    model = ToyLTX().eval()
    model.stg_blocks = frozenset({1})
    CONTAINERS_TO_OVERRIDE.append(True)
    try:
        out, ref, _ = _sharded_vs_unsharded(model)
    finally:
        CONTAINERS_TO_OVERRIDE.clear()
    assert_split_close(out, ref, what="q/k/v handed over in containers")
    assert not hasattr(BlockAttention, "container_function"), \
        "core unwraps containers only for an override without container_function"


def test_one_rank_takes_containers_and_a_mixed_call_is_refused():
    from sharddit.parallel.sequence.split import Group, RankSlice

    rs = RankSlice(rank=0, group=Group(index=0, batch=(0, 1), ranks=(0,)), position=0, tokens=(0, 4))
    attend = BlockAttention(None, rs, 4, False)
    attend.begin_block(None)
    q, k, v = (torch.randn(1, 4, 8) for _ in range(3))
    held = (Container(q), Container(k), Container(v))
    got = attend(_attention_impl, *held, heads=2)
    assert torch.equal(got, _attention_impl(q, k, v, 2)) and all(c.tensor is None for c in held)
    with pytest.raises(TypeError, match=r"\[ShardDiT\].*all tensors or all attention tensor containers"):
        attend(_attention_impl, Container(q), k, v, heads=2)
