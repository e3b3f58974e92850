"""The toy DiT of the distributed sequence tests (lobby and Ray): identical copies, its block
layout and token spec, inputs per batch, and a sharded forward."""
import torch
from harness.toy_seq import SeqToyDiT
from sharddit.parallel.blocks.sharding import attach_block_sharding
from sharddit.parallel.blocks.routing import BlockLayout
from sharddit.parallel.sequence.engine import attach_sequence_engine
from sharddit.parallel.sequence.split import TokenSpec

WAN = BlockLayout(("blocks",), (("x",),))
WAN_SPEC = (TokenSpec({"x": 1, "e": 1, "freqs": 1}),)
"""The Wan-like toy's block list and token split (``SeqToyDiT``)."""
MM = BlockLayout(("double_blocks", "single_blocks"), (("img", "txt"), ("x",)))
MM_SPEC = (TokenSpec({"img": 1, "pe": 2}, replicated_streams=("txt",), tail_stream="txt",
                     must_be_none=("modulation_dims_img",)),
           TokenSpec({"x": 1, "pe": 2}, tail_stream="txt", must_be_none=("modulation_dims",)))
"""The HunyuanVideo-like toy's (``SeqToyMMDiT``): double blocks with the text replicated, then single."""


def engine_for(model, ranks):
    """(sharding handle, sequence engine) of ``model`` over ``ranks`` (every block on cpu)."""
    handle = attach_block_sharding(model, WAN, ["cpu"] * len(model.blocks), "cpu")
    proxies = [p for pl in handle.proxies.values() for p in pl]
    return handle, attach_sequence_engine(handle.router, proxies, WAN_SPEC, ranks, timeout_s=60)


def run_sequence(handle, model, *inputs):
    with torch.no_grad(), handle.router.forward_scope(sequence=True):
        return model(*inputs)


def toy_inputs(batch, tokens=24):
    g = torch.Generator().manual_seed(batch)
    return torch.randn(batch, tokens, 8, generator=g), torch.rand(batch, generator=g), \
        torch.randn(batch, 5, 32, generator=g)


def toy_copies(n):
    """``n`` SeqToyDiT models with the same weights (seed 0)."""
    torch.manual_seed(0)
    first = SeqToyDiT(dim=32, heads=4).eval()
    out = [first]
    for _ in range(n - 1):
        m = SeqToyDiT(dim=32, heads=4).eval()
        m.load_state_dict(first.state_dict())
        out.append(m)
    return out
