"""``selftest``: does sharding work on THIS machine? Tiny random models, real ComfyUI, a few seconds.

Checks, each printed as ``[ShardDiT] selftest ...`` lines:

1. sampling: a tiny Wan 2.1 DiT (ComfyUI's own ``WanModel``, random weights) sampled with
   ComfyUI's sampler unsharded on one device, then sharded by ``shard_model`` over every GPU
   (one GPU: ``cuda:0,cpu``; none: ``cpu,cpu``; blocks split evenly). Where every device is of one
   kind (all CPU, or GPUs of one model) the latents must be bit-identical: the sharded forward
   runs the same kernels in the same order. A CPU shard beside a GPU cannot be: CPU and CUDA
   kernels for matmul, attention and norms sum in different orders, so fp32 results differ in the
   last bits and the difference grows through blocks and steps; then max abs diff <= 1e-3.
2. p2p: ``torch.cuda.can_device_access_peer`` for every GPU pair (informational: without
   peer access hops go through host memory, slower but correct).
3. hop: one hidden-state-sized copy (64 MiB) between each pair of neighbouring devices of the
   shard list, timed with synchronisation; the copy must arrive intact.
4. sequence and prefetch: ``parallel=sequence`` sampling against the unsharded result (one GPU:
   ``cuda:0,cpu``, so blocks really stream), and whether the engine's streamed-block copy overlaps
   compute on a GPU (``sequence_check.py``).
5. dynamic VRAM: on one GPU with ComfyUI's dynamic VRAM on (as its ``main.py`` turns it on),
   ``blocks`` and ``sequence`` over ``cuda:0,cuda:0`` vs the unsharded result, and the switch back
   to core's sampler (``dynamic_check.py``). The other checks also run as ComfyUI would run them.
6. VAE: a tiny Wan 2.1 VAE (ComfyUI's VAE class) decoded by the pack's batched multi-device tiled
   decode and by core's ``vae.decode_tiled`` with the same tiles: max abs diff <= 1e-5 in fp32 on
   one device kind (batched convolutions may round differently), <= 1e-4 across CPU and CUDA.

TF32 is turned off while the checks run so that fp32 comparisons measure ShardDiT, not TF32
rounding (and turned back as it was after them). Torch runs one CPU thread: these models are too small to gain from more, and on a busy machine
OpenMP workers spinning on shared cores made the CPU checks 10-15x slower (measured here).
Exit status: 0 when every check passes, 1 otherwise.
"""
from __future__ import annotations

import itertools
import time
import traceback
from dataclasses import dataclass, field

import torch

import comfy.model_management as mm
import comfy.sample

from ....parallel.placement.devices import DeviceEntry, DevicePlan
from ....parallel.placement.inventory import read_inventory
from ....parallel.units import GiB
from ....parallel.tiling import TileSpec, plan_tiles
from ...comfyui_import import dynamic_vram_status
from .dynamic_check import check_dynamic_vram
from .tiny_models import WAN_DIT, build_wan_dit, build_wan_vae
from .sequence_check import check_prefetch_overlap, check_sequence, sequence_devices
from .switches import comfyui_version, gpu_lines, settings_line, settings_summary
from ...comfy.shard.hooks import get_shard_state
from ...comfy.shard.pipeline import shard_model
from ...comfy.vae.tiled_decode import core_tile_params, decode_tiled

__all__ = ["choose_devices", "run_selftest"]

PREFIX = "[ShardDiT] selftest"
SEED, STEPS, CFG, SAMPLER, SCHEDULER = 42, 3, 4.0, "euler", "simple"
LATENT = (1, 16, 2, 8, 8)
TEXT_TOKENS = 8
SAMPLE_TOL_MIXED = 1e-3
VAE_TOL, VAE_TOL_MIXED = 1e-5, 1e-4
# VAEDecodeTiled widgets (pixels / frames): latent tiles of 4x4 with overlap 1 -> 9 tiles of 8x8.
VAE_TILES = dict(tile_size=32, overlap=8, temporal_size=8, temporal_overlap=4)
HOP_BYTES = 64 << 20


@dataclass
class Check:
    name: str
    ok: bool = True
    lines: list = field(default_factory=list)


def choose_devices(n_gpus: int) -> tuple[str, list[str]]:
    """(unsharded reference device, shard devices) for ``n_gpus`` CUDA devices."""
    if n_gpus == 0:
        return "cpu", ["cpu", "cpu"]
    if n_gpus == 1:
        return "cuda:0", ["cuda:0", "cpu"]
    return "cuda:0", [f"cuda:{i}" for i in range(n_gpus)]


def one_kind(devices) -> bool:
    """All CPU, or all CUDA devices of one GPU model (same kernels, so bit-identical results)."""
    kinds = {torch.device(d).type for d in devices}
    if kinds != {"cuda"}:
        return kinds == {"cpu"}
    return len({torch.cuda.get_device_name(torch.device(d)) for d in devices}) == 1


def _say(line: str) -> None:
    print(f"{PREFIX} {line}", flush=True)


def run_selftest(comfyui_root, import_s: float = 0.0) -> int:
    """Run every check, print the report, return the exit status."""
    flags, threads = _tf32_settings(), torch.get_num_threads()
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.set_num_threads(1)
    try:
        return _run_checks(comfyui_root, import_s)
    finally:  # run in-process (tests), the caller gets its settings back
        for obj, attr, value in flags:
            setattr(obj, attr, value)
        torch.set_num_threads(threads)


def _tf32_settings() -> list:
    """(object, attribute, value) of the TF32 switches, the old API first: torch >= 2.9 also has
    ``fp32_precision``, which setting ``allow_tf32`` changes, so both are put back in this order."""
    out = [(o, "allow_tf32", o.allow_tf32) for o in (torch.backends.cuda.matmul, torch.backends.cudnn)]
    return out + [(o, "fp32_precision", o.fp32_precision) for o in (torch.backends.cuda.matmul, torch.backends.cudnn)
                  if hasattr(o, "fp32_precision")]


def _run_checks(comfyui_root, import_s: float) -> int:
    start = time.perf_counter()
    n_gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    ref, devices = choose_devices(n_gpus)
    _say(f"ComfyUI {comfyui_version()} at {comfyui_root}, torch {torch.__version__}, "
         f"ComfyUI device {mm.get_torch_device()}, dynamic VRAM {dynamic_vram_status()}")
    _say(settings_line(dynamic_vram_status()))
    for line in gpu_lines() + _device_lines():
        _say(line)
    checks = [_run(name, fn) for name, fn in (
        ("sampling", lambda c: check_sampling(c, ref, devices)),
        ("p2p", lambda c: check_p2p(c, n_gpus)),
        ("hop", lambda c: check_hops(c, devices)),
        ("sequence", lambda c: check_sequence(c, sequence_devices(n_gpus))),
        ("prefetch", lambda c: check_prefetch_overlap(c, n_gpus)),
        ("dynamic VRAM", lambda c: check_dynamic_vram(c, dynamic_vram_status())),
        ("VAE", lambda c: check_vae(c, devices)))]
    failed = [c.name for c in checks if not c.ok]
    verdict = f"FAIL ({', '.join(failed)})" if failed else "PASS"
    _say(f"{verdict}: {len(checks) - len(failed)}/{len(checks)} checks passed in "
         f"{time.perf_counter() - start:.1f} s (+ {import_s:.1f} s importing ComfyUI), under "
         f"{settings_summary(dynamic_vram_status())}")
    return 1 if failed else 0


def _run(name: str, fn) -> Check:
    """Run one check, printing its lines; an exception fails it (traceback shown) without stopping the rest."""
    check = Check(name)
    start = time.perf_counter()
    try:
        fn(check)
    except Exception as err:  # the report must go on to the other checks
        check.ok = False
        check.lines.append(f"FAIL: {type(err).__name__}: {err}")
        traceback.print_exc()
    check.lines = check.lines or ["done"]
    check.lines[-1] += f" [{time.perf_counter() - start:.1f} s]"
    for line in check.lines:
        _say(f"{name}: {line}")
    return check


def _device_lines() -> list[str]:
    inv = read_inventory()
    lines = [f"device {d.device} ({d.name}): {d.free_bytes / GiB:.1f} GiB free / {d.total_bytes / GiB:.1f} GiB total"
             for d in inv.devices]
    if not inv.gpus:
        lines.append("no CUDA GPU found: sharding over cpu,cpu (proves the mechanics, not GPU speed)")
    return lines


def _cond(seed: int) -> list:
    g = torch.Generator().manual_seed(seed)
    return [[torch.randn(1, TEXT_TOKENS, WAN_DIT["text_dim"], generator=g), {}]]


def _sample(model) -> torch.Tensor:
    latent = torch.zeros(LATENT)
    noise = comfy.sample.prepare_noise(latent, SEED)
    return comfy.sample.sample(model, noise, STEPS, CFG, SAMPLER, SCHEDULER, _cond(1), _cond(2), latent,
                               denoise=1.0, disable_pbar=True, seed=SEED)


def _max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a.float() - b.float()).abs().max().item()


def check_sampling(check: Check, ref: str, devices: list[str]) -> None:
    """Unsharded on ``ref`` vs sharded over ``devices`` (equal weights: every device gets blocks)."""
    layers = max(4, len(devices))
    model = build_wan_dit(num_layers=layers)
    expected = _sample(model)
    sharded = shard_model(model, DevicePlan(False, tuple(DeviceEntry(d, 1.0) for d in devices)), reserve_vram_gb=0.0)
    ranges = get_shard_state(sharded).plan.block_ranges
    got = _sample(sharded)
    where = ", ".join(f"{r.device} blocks {r.start}-{r.stop - 1}" for r in ranges)
    check.lines.append(f"tiny Wan 2.1 DiT (dim {WAN_DIT['dim']}, {layers} blocks, fp32), {SAMPLER} {STEPS} steps "
                       f"cfg {CFG}, latent {'x'.join(map(str, LATENT))}: {model.load_device} vs {where}")
    diff = _max_diff(got, expected)
    if not torch.isfinite(expected).all() or torch.equal(expected, torch.zeros_like(expected)):
        check.ok = False
        check.lines.append("FAIL: the unsharded reference is not a usable latent (non-finite or all zero)")
    elif one_kind(devices + [ref]):
        check.ok = torch.equal(got, expected)
        check.lines.append(f"{'PASS' if check.ok else 'FAIL'}: bit-exact expected (one device kind), "
                           f"{'identical' if check.ok else 'differs'}, max diff {diff:.3g}")
    else:
        check.ok = diff <= SAMPLE_TOL_MIXED
        check.lines.append(f"{'PASS' if check.ok else 'FAIL'}: max diff {diff:.3g} (limit {SAMPLE_TOL_MIXED:g}: "
                           f"CPU and CUDA kernels sum in different orders)")


def check_p2p(check: Check, n_gpus: int) -> None:
    """Peer-access matrix, rows = from, columns = to. Informational: never fails on 'no'."""
    if n_gpus == 0:
        check.lines.append("no GPU: skipped")
        return
    if n_gpus == 1:
        check.lines.append("one GPU: no GPU pair to check")
        return
    names = [f"cuda:{i}" for i in range(n_gpus)]
    width = max(len(n) for n in names) + 1
    check.lines.append(" " * width + "".join(n.rjust(width) for n in names))
    missing = 0
    for i in range(n_gpus):
        cells = []
        for j in range(n_gpus):
            peer = i == j or torch.cuda.can_device_access_peer(i, j)
            missing += not peer
            cells.append(("-" if i == j else "yes" if peer else "no").rjust(width))
        check.lines.append(names[i].ljust(width) + "".join(cells))
    if missing:
        check.lines.append("pairs without peer access copy through host memory: correct, but hops are slower")


def check_hops(check: Check, devices: list[str]) -> None:
    """Time one hidden-state hop between each pair of neighbouring shard devices."""
    if not any(torch.device(d).type == "cuda" for d in devices):
        check.lines.append("no GPU: skipped")
        return
    for src, dst in itertools.pairwise(devices):
        if src != dst:
            ms, intact = time_hop(torch.device(src), torch.device(dst))
            check.ok &= intact
            rate = HOP_BYTES / (ms / 1e3) / 1e9
            check.lines.append(f"{src} -> {dst}: {HOP_BYTES >> 20} MiB in {ms:.2f} ms ({rate:.1f} GB/s)"
                               f"{'' if intact else ' FAIL: data changed in transit'}")


def _sync(*devices: torch.device) -> None:
    for d in devices:
        if d.type == "cuda":
            torch.cuda.synchronize(d)


def time_hop(src: torch.device, dst: torch.device, repeats: int = 3) -> tuple[float, bool]:
    """Mean ms of ``repeats`` synchronised copies of a HOP_BYTES fp32 tensor (after one warm-up)."""
    x = torch.randn(HOP_BYTES // 4, generator=torch.Generator().manual_seed(SEED)).to(src)
    y = x.to(dst)
    _sync(src, dst)
    t0 = time.perf_counter()
    for _ in range(repeats):
        y = x.to(dst)
        _sync(src, dst)
    ms = (time.perf_counter() - t0) * 1e3 / repeats
    return ms, torch.equal(y.cpu(), x.cpu())


@torch.inference_mode()
def check_vae(check: Check, devices: list[str]) -> None:
    """The pack's batched tiled decode over ``devices`` vs core ``vae.decode_tiled``, same tiles.
    Both decode under inference mode, as ComfyUI's executor runs them (core's decode works in place)."""
    vae = build_wan_vae(torch.device(devices[0]))
    latent = torch.randn(LATENT, generator=torch.Generator().manual_seed(SEED))
    tile, overlap = core_tile_params(vae, **VAE_TILES)
    n_tiles = len(plan_tiles(LATENT, TileSpec.build(tile, overlap, vae.upscale_ratio, vae.upscale_index_formula)))
    expected = vae.decode_tiled(latent, tile_x=tile[2], tile_y=tile[1], overlap=overlap[1],
                                tile_t=tile[0], overlap_t=overlap[0])
    expected = expected.reshape(-1, *expected.shape[-3:])
    got = decode_tiled(vae, {"samples": latent}, **VAE_TILES, tile_batch_size="auto", devices=",".join(devices))
    limit = VAE_TOL if one_kind(devices) else VAE_TOL_MIXED
    same_shape = got.shape == expected.shape
    diff = _max_diff(got, expected) if same_shape else float("inf")
    check.ok = same_shape and diff <= limit
    check.lines.append(f"tiny Wan 2.1 VAE (fp32), latent {'x'.join(map(str, LATENT))} -> "
                       f"{'x'.join(map(str, got.shape))} image, {n_tiles} tiles of {'x'.join(map(str, tile))} "
                       f"on {','.join(devices)} vs core decode_tiled on {vae.device}")
    check.lines.append(f"{'PASS' if check.ok else 'FAIL'}: max diff {diff:.3g} (limit {limit:g})"
                       + ("" if same_shape else f"; shapes differ: core {tuple(expected.shape)}"))
