"""``selftest`` checks of `parallel=sequence`: split sampling vs unsharded, and prefetch overlap.

- sequence: the tiny Wan 2.1 DiT sampled unsharded, then with ``parallel=sequence`` over two ranks
  (no GPU: ``cpu,cpu``; one GPU: ``cuda:0,cpu``; more: every GPU), at cfg > 1 (cond and uncond on
  different ranks) and at cfg = 1 (tokens split, q/k/v exchanged per block). On one GPU the second
  rank is the CPU, so each rank streams the blocks the other owns: ``cuda:0,cuda:0`` would make
  every rank own every block, and the side-stream copies, their events and the cross-device
  copies would never run. Each rank that does not own every block must have streamed some. A
  split changes matrix shapes (one sample of two, a rank's rows), and BLAS picks kernels by shape
  and CPU: on CPU max abs diff <= 1e-4 (measured: 0 to 1.2e-5 on AVX2 hosts, 4.8e-5 on an AVX-512
  host after 4 steps), with a GPU <= 1e-3 (fp32; CPU and CUDA kernels also sum in different
  orders, the bound of the mixed ``sampling`` check). "identical" when bit-exact.
- prefetch (GPU only): the engine's own copy, ``sequence/stream.BlockStream.prefetch`` of a block-sized
  module held in host RAM as the loader holds a ``cpu`` share (pageable), issued after a matmul
  was queued on the compute stream (the engine's order: block g's kernels, then the copy of g+1),
  timed alone and together: "overlaps" when together they take clearly less than one after the
  other. Informational.
"""
from __future__ import annotations

import time

import torch

import comfy.sample

from ....parallel.placement.devices import DevicePlan
from ...comfy.shard.hooks import get_shard_state
from ...comfy.shard.pipeline import shard_model
from .tiny_models import WAN_DIT, build_wan_dit

__all__ = ["check_prefetch_overlap", "check_sequence", "sample_tiny", "sequence_devices"]

SEED, STEPS, SAMPLER, SCHEDULER = 42, 3, "euler", "simple"
LATENT = (1, 16, 2, 8, 8)  # 32 tokens: 16 per rank
TEXT_TOKENS = 512  # as Wan's text encoder pads: text projections keep > 10 rows per sample
GPU_TOL = 1e-3
CPU_TOL = 1e-4  # the split bound of the comfy tests (tests/harness/numerics.py)


def sequence_devices(n_gpus: int) -> list[str]:
    if n_gpus == 0:
        return ["cpu", "cpu"]
    if n_gpus == 1:
        return ["cuda:0", "cpu"]
    return [f"cuda:{i}" for i in range(n_gpus)]


def _cond(seed: int) -> list:
    g = torch.Generator().manual_seed(seed)
    return [[torch.randn(1, TEXT_TOKENS, WAN_DIT["text_dim"], generator=g), {}]]


def sample_tiny(model, cfg: float) -> torch.Tensor:
    latent = torch.zeros(LATENT)
    noise = comfy.sample.prepare_noise(latent, SEED)
    return comfy.sample.sample(model, noise, STEPS, cfg, SAMPLER, SCHEDULER, _cond(1), _cond(2), latent,
                               denoise=1.0, disable_pbar=True, seed=SEED)


def check_sequence(check, devices: list[str]) -> None:
    """Unsharded vs ``parallel=sequence`` over ``devices``, at cfg 4 and cfg 1."""
    model = build_wan_dit(num_layers=4)
    sharded = shard_model(model, DevicePlan.of_devices(devices), reserve_vram_gb=0.0, parallel="sequence")
    engine = get_shard_state(sharded).router.engine
    on_cpu = all(torch.device(d).type == "cpu" for d in devices)
    for cfg in (4.0, 1.0):
        expected = sample_tiny(model, cfg)
        got = sample_tiny(sharded, cfg)
        diff = (got.float() - expected.float()).abs().max().item()
        st = engine.stats
        how = "cond/uncond split" if len(st.groups) > 1 else f"tokens split, {sum(st.exchanges)} exchanges"
        limit = CPU_TOL if on_cpu else GPU_TOL
        missing = _ranks_that_streamed_nothing(get_shard_state(sharded), devices, st.bytes_streamed)
        ok = bool(torch.isfinite(got).all()) and diff <= limit and not missing
        same = "identical" if torch.equal(got, expected) else f"max diff {diff:.3g}"
        streamed = "/".join(f"{b / 2**20:.1f}" for b in st.bytes_streamed)
        check.ok = check.ok and ok
        check.lines.append(f"cfg {cfg:g} on {','.join(devices)} ({how}): {'PASS' if ok else 'FAIL'}: "
                           f"{same} (limit {limit:g}), streamed {streamed} MiB per rank"
                           + (f"; FAIL: rank(s) {missing} own some blocks not and streamed none" if missing else ""))


def _ranks_that_streamed_nothing(state, devices, streamed) -> list[int]:
    """Ranks whose device does not hold every block, yet copied no block bytes from an owner."""
    owners = {r.device for r in state.plan.block_ranges}
    return [i for i, d in enumerate(devices) if (owners - {d}) and streamed[i] == 0]


def check_prefetch_overlap(check, n_gpus: int) -> None:
    if n_gpus == 0:
        check.lines.append("no GPU: skipped")
        return
    from ....parallel.sequence.stream import BlockStream

    dev = torch.device("cuda:0")
    with torch.device("meta"):
        block = torch.nn.Sequential(torch.nn.Linear(8192, 8192, bias=False))  # 256 MiB fp32, ~ a 14B block / 2.6
    block = block.to_empty(device="cpu")  # host RAM, pageable: how the loader holds a cpu share
    with torch.no_grad():
        block[0].weight.fill_(1.0)
    ring = BlockStream(dev)
    a = torch.randn(4096, 4096, device=dev)
    nbytes = block[0].weight.numel() * 4
    copies = iter(range(1 << 30))  # a new block index each time: every prefetch copies

    def compute():
        for _ in range(8):
            a @ a

    def copy():
        ring.prefetch(next(copies), block)

    def timed(*fns) -> float:
        torch.cuda.synchronize(dev)
        start = time.perf_counter()
        for fn in fns:
            fn()
        torch.cuda.synchronize(dev)
        return time.perf_counter() - start

    timed(compute, copy)  # warm-up: the ring's buffers and side stream exist after it
    t_compute, t_copy, t_both = timed(compute), timed(copy), timed(compute, copy)
    ring.release()
    overlaps = t_both < 0.8 * (t_compute + t_copy)
    check.lines.append(f"copy {nbytes >> 20} MiB pageable host->GPU through the engine's ring (BlockStream.prefetch) "
                       f"{t_copy * 1e3:.1f} ms, matmuls {t_compute * 1e3:.1f} ms, matmuls then copy {t_both * 1e3:.1f} "
                       f"ms: {'overlaps' if overlaps else 'does NOT overlap'} (informational)")
