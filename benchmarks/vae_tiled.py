"""Benchmark: ShardDiTVAEDecodeTiled vs core VAEDecodeTiled on ComfyUI's Wan 2.1 VAE class (CPU).

    COMFYUI_PATH=/path/to/ComfyUI python benchmarks/vae_tiled.py [--reps 3] [--dim 16]

ComfyUI is imported the way tests do (``tests/harness/comfy_env.load_comfy``: COMFYUI_PATH on
sys.path, never this repo's root; the pack is loaded as a custom node). The VAE is ComfyUI's own
``comfy.ldm.wan.vae.WanVAE`` loaded through ``comfy.sd.VAE`` at reduced width (``--dim``, full
depth; deterministic random weights) so a CPU can afford it. Both nodes get the same latent and
tile parameters; repetitions are interleaved (order alternating) and the median time of each is
compared. Prints decoder calls of each, the max abs difference, and as the LAST line
``ratio=<ours/core>`` (median seconds).
"""
import argparse
import contextlib
import os
import statistics
import sys
import time
from pathlib import Path

import torch

TESTS = Path(__file__).resolve().parents[1] / "tests"
WAN21 = dict(dim=96, z_dim=16, dim_mult=[1, 2, 4, 4], num_res_blocks=2, attn_scales=[],
             temperal_downsample=[False, True, True], dropout=0.0)


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--reps", type=int, default=3, help="interleaved repetitions of each decode")
    p.add_argument("--dim", type=int, default=16, help="WanVAE base width (ComfyUI's real one is 96)")
    p.add_argument("--latent", default="1,16,4,12,12", help="latent shape B,C,T,H,W")
    p.add_argument("--tiles", default="64,16,8,4", help="tile_size,overlap,temporal_size,temporal_overlap")
    p.add_argument("--tile-batch-size", default="auto")
    p.add_argument("--devices", default="auto")
    return p.parse_args()


def load_env():
    if not os.environ.get("COMFYUI_PATH"):
        sys.exit("set COMFYUI_PATH to a ComfyUI >= 0.3.64 tree")
    sys.path.insert(0, str(TESTS))  # tests/ only: its `harness` package holds the bootstrap
    from harness.comfy_env import load_comfy
    from harness.pack import import_pack

    import_pack()  # the repo as package `sharddit`, as the tests' conftest does
    return load_comfy()


def wan21_vae(dim: int):
    """ComfyUI's Wan 2.1 VAE built by comfy.sd.VAE, with WanVAE's width set to ``dim``."""
    import comfy.ldm.wan.vae as wan
    import comfy.sd
    from harness.tiny_models import fill_state_dict

    orig = wan.WanVAE
    wan.WanVAE = lambda **kw: orig(**{**kw, "dim": dim})
    try:
        with torch.device("meta"):
            module = wan.WanVAE(**WAN21)
        return comfy.sd.VAE(sd=fill_state_dict(module, seed=0))
    finally:
        wan.WanVAE = orig


@contextlib.contextmanager
def counting(vae, calls: list):
    decode = vae.first_stage_model.decode
    vae.first_stage_model.decode = lambda *a, **kw: (calls.append(a[0].shape[0]), decode(*a, **kw))[1]
    try:
        yield
    finally:
        del vae.first_stage_model.decode


def timed(fn):
    t0 = time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, out


def main():
    args = parse_args()
    env = load_env()
    torch.manual_seed(0)
    vae = wan21_vae(args.dim)
    shape = tuple(int(v) for v in args.latent.split(","))
    tiles = [int(v) for v in args.tiles.split(",")]
    samples = {"samples": torch.randn(shape, generator=torch.Generator().manual_seed(0))}
    ours_node = env.nodes.NODE_CLASS_MAPPINGS["ShardDiTVAEDecodeTiled"]
    run_core = lambda: env.nodes.VAEDecodeTiled().decode(vae, samples, *tiles)[0]  # noqa: E731
    run_ours = lambda: ours_node.execute(samples, vae, *tiles, tile_batch_size=args.tile_batch_size,  # noqa: E731
                                         devices=args.devices).result[0]
    core_calls, our_calls = [], []
    with counting(vae, core_calls):
        ref = run_core()  # warm-up (also loads the VAE through ComfyUI)
    with counting(vae, our_calls):
        got = run_ours()
    times = {"core": [], "ours": []}
    for r in range(args.reps):
        order = [("core", run_core), ("ours", run_ours)]
        for name, fn in order if r % 2 == 0 else order[::-1]:
            times[name].append(timed(fn)[0])
    core_s, ours_s = statistics.median(times["core"]), statistics.median(times["ours"])
    print(f"Wan 2.1 VAE class (dim {args.dim}, {sum(p.numel() for p in vae.first_stage_model.parameters()) / 1e6:.2f}M "
          f"params), latent {shape}, tiles {tiles}, torch threads {torch.get_num_threads()}")
    print(f"core VAEDecodeTiled: {len(core_calls)} decoder calls (tiles per call {sorted(set(core_calls))}), "
          f"median {core_s:.3f}s of {[round(t, 3) for t in times['core']]}")
    print(f"ShardDiTVAEDecodeTiled (tile_batch_size={args.tile_batch_size}, devices={args.devices}): "
          f"{len(our_calls)} decoder calls (tiles per call {our_calls}), median {ours_s:.3f}s of "
          f"{[round(t, 3) for t in times['ours']]}")
    print(f"output {tuple(got.shape)} vs core {tuple(ref.shape)}; max abs diff {(got - ref).abs().max().item():.3g}")
    print(f"ratio={ours_s / core_s:.3f}")


if __name__ == "__main__":
    main()
