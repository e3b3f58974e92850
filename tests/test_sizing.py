"""Sizing helpers on meta toy modules (pure torch, CI). fp32 = 4 bytes, bf16 = 2 bytes."""
import pytest
import torch
from harness.toy_dit import ToyDiT, ToyMMDiT

from sharddit.parallel.sharding import BlockLayout, attach_block_sharding
from sharddit.parallel.sizing import (
    compute_block_bytes,
    compute_non_block_bytes,
    compute_tokens,
    estimate_activation_bytes,
)

WAN = BlockLayout(("blocks",), (("x",),))
MM = BlockLayout(("double_blocks", "single_blocks"), (("img", "txt"), ("x",)))

# ToyBlock(dim=32, ffn=128), fp32:
#   q 32*32+32 = 1056, kv 32*64+64 = 2112, o 1056, ffn 32*128+128 + 128*32+32 = 8352,
#   modulation 3*32 = 96 -> 12672 params * 4 B = 50688 B
TOY_BLOCK = 50688
# ToyDiT non-block: embed 8*32+32 = 288, time 1*96+96 = 192, text 1056, inter 1056, head 32*8+8 = 264,
#   buffer inv_freq 32 -> 2888 * 4 B = 11552 B
TOY_REST = 11552


def _meta(cls, **kw):
    with torch.device("meta"):
        return cls(**kw)


def test_block_and_non_block_bytes_on_meta():
    model = _meta(ToyDiT, n_blocks=3)
    assert compute_block_bytes(model, WAN) == (TOY_BLOCK,) * 3
    assert compute_non_block_bytes(model, WAN) == TOY_REST
    total = sum(t.numel() * 4 for t in list(model.parameters()) + list(model.buffers()))
    assert total == 3 * TOY_BLOCK + TOY_REST


def test_bytes_follow_dtype_and_see_through_proxies():
    model = ToyDiT(n_blocks=2).to(torch.bfloat16)
    handle = attach_block_sharding(model, WAN, ["cpu", "cpu"], "cpu")
    assert compute_block_bytes(model, WAN) == (TOY_BLOCK // 2,) * 2
    assert compute_non_block_bytes(model, WAN) == TOY_REST // 2
    handle.detach()


def test_two_lists_in_global_order():
    model = _meta(ToyMMDiT, n_double=2, n_single=3)
    # double: ToyBlock(32, ffn 64): ffn 32*64+64 + 64*32+32 = 4192 (not 8352) -> 8512 params,
    #   + txt 1056 = 9568 -> 38272 B
    # single: 32*32 + 32 = 1056 params -> 4224 B
    assert compute_block_bytes(model, MM) == (38272, 38272, 4224, 4224, 4224)


def test_tied_tensor_counted_once():
    model = _meta(ToyDiT, n_blocks=2)
    model.blocks[1].q.weight = model.blocks[0].q.weight  # 32*32*4 = 4096 B shared
    assert compute_block_bytes(model, WAN) == (TOY_BLOCK, TOY_BLOCK - 4096)


def test_tokens_from_latent():
    assert compute_tokens((2, 16, 21, 60, 104), (1, 2, 2)) == 21 * 30 * 52 == 32760
    assert compute_tokens((16, 21, 61, 103), (1, 2, 2)) == 21 * 31 * 52  # padded up
    assert compute_tokens((1, 128, 11, 15, 26), (1, 1, 1)) == 4290  # LTXV 480p x 81
    with pytest.raises(ValueError, match="fewer dims"):
        compute_tokens((4, 4), (1, 2, 2))


def test_activation_estimate_formula():
    # Wan 2.1 14B at 480p x 81, bf16, batch 1: 32760 * (5120 + 2*5120 + 2*13824) * 2 B
    wan = estimate_activation_bytes(32760, 5120, 1, 2, ffn_dim=13824)
    assert wan == 32760 * 43008 * 2
    assert 2.6 < wan / 2**30 < 2.65
    assert estimate_activation_bytes(32760, 5120, 2, 2, ffn_dim=13824) == 2 * wan
    # attention phase dominates when the FFN is narrow: 1 + 5 = 6 * dim
    assert estimate_activation_bytes(10, 8, 1, 4, ffn_dim=8) == 10 * 6 * 8 * 4
    assert estimate_activation_bytes(10, 8, 1, 4, ffn_dim=8, context_tokens=3) == (480 + 48) * 4
    with pytest.raises(ValueError, match="tokens=0"):
        estimate_activation_bytes(0, 8, 1, 2)
