"""Sizing helpers on meta toy modules (pure torch, CI). fp32 = 4 bytes, bf16 = 2 bytes."""
import torch
from harness.toy_dit import ToyDiT, ToyMMDiT

from sharddit.parallel.blocks.sharding import attach_block_sharding
from sharddit.parallel.blocks.routing import BlockLayout
from sharddit.parallel.placement.sizing import (
    compute_block_bytes,
    compute_non_block_bytes,
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
