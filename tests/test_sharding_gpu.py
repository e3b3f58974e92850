"""Real-CUDA checks of the block sharding engine (skipped without a GPU; run them on the lent
GPU machine, and on a multi-GPU box for the `multi_gpu` ones).

- one GPU: blocks split over ``cuda:0`` and ``cpu``; the result matches the unsharded CUDA run
  within a stated tolerance (CPU and CUDA kernels sum in different orders), hops and constant
  copies are as planned, and detach puts every weight back on ``cuda:0``;
- two GPUs: ``cuda:0,cuda:1`` equals the unsharded ``cuda:0`` run bit for bit when both GPUs are
  the same model (same kernels, same order).
"""
import pytest
import torch
from harness.global_flags import restored
from harness.toy_dit import ToyDiT

from sharddit.parallel.blocks.sharding import attach_block_sharding
from sharddit.parallel.blocks.routing import BlockLayout

LAYOUT = BlockLayout(("blocks",), (("x",),), return_home_after=frozenset({2}))
# CPU vs CUDA fp32 matmuls of size 32 with TF32 off differ by rounding only.
CPU_CUDA_ATOL = 1e-4


@pytest.fixture(autouse=True)
def _global_flags():
    """TF32 is turned off below for the fp32 comparison: put it (and every other process-wide
    setting) back, so later tests in this pytest process run the kernels a user gets."""
    with restored():
        yield


def _inputs(device):
    g = torch.Generator().manual_seed(1)
    x = torch.randn(2, 12, 8, generator=g)
    t = torch.randn(2, generator=g)
    ctx = torch.randn(2, 5, 32, generator=g)
    return x.to(device), t.to(device), ctx.to(device), {"scale": torch.tensor([0.9], device=device)}


def _run(devices, home="cuda:0"):
    torch.manual_seed(0)
    model = ToyDiT(n_blocks=6, inter_block={2}).eval().to(home)
    args = _inputs(home)
    with torch.no_grad():
        ref = model(*args)
        handle = attach_block_sharding(model, LAYOUT, devices, home)
        out = model(*args)
        stats = handle.stats
        handle.detach()
    assert all(p.device == torch.device(home) for p in model.parameters())
    return ref, out, stats


@pytest.mark.gpu
def test_cuda0_plus_cpu_matches_unsharded_cuda():
    torch.backends.cuda.matmul.allow_tf32 = False
    ref, out, stats = _run(["cuda:0"] * 3 + ["cpu"] * 3)
    assert out.device == torch.device("cuda:0")
    assert (out - ref).abs().max().item() <= CPU_CUDA_ATOL
    assert stats.hops == 2 and stats.blocks_run == 6  # cuda:0 -> cpu, and home after the last block
    assert stats.copies_by_device.get("cpu", 0) == stats.constant_copies > 0


@pytest.mark.multi_gpu
def test_two_gpus_bit_identical_to_one():
    if torch.cuda.get_device_name(0) != torch.cuda.get_device_name(1):
        pytest.skip("bit-exactness needs two GPUs of the same model")
    ref, out, stats = _run(["cuda:0"] * 3 + ["cuda:1"] * 3)
    assert torch.equal(out, ref)
    assert stats.hops == 2
