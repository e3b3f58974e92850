"""``python <pack-dir> plan``: will this model fit these GPUs? (dry-run simulation, no weights).

Exit codes: 0 fits, 3 does not fit (the shortfall per device, worker devices too, is printed), 2 bad
input or no ComfyUI. Worker devices (``box2/cuda:0=24GiB``): ``loaders/plan/worker_shares``.
Order (``run``): every argument, ComfyUI's import, the model's own checks, the cluster's members
(``--workers``, ``plan_workers``), the simulation; so nothing is printed before an error.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import re
import sys
from dataclasses import dataclass

from ...parallel.cost.inputs import (DEFAULT_CFG, DEFAULT_GPU, DEFAULT_LINK_GBPS, GPU_PEAK_TFLOPS, check_cfg, gpu_names,
                                     parse_link_gbps)
from ...parallel.placement.devices import DevicePlan, parse_device_plan
from ...parallel.distributed.config import WEIGHTS_ENV, WEIGHTS_MODES, dist_weights
from ...parallel.cost.workers import DEFAULT_NET_GBPS, parse_net_gbps, split_worker_spec
from ...parallel.placement.inventory import Inventory, inventory_from_spec
from ...parallel.cost.mode import DEFAULT_PARALLEL, PARALLEL_MODES
from ...parallel.placement.plan_types import DEFAULT_DEVICES, DEFAULT_RESERVE_VRAM_GB
from ..comfy.models.checks import check_device_entries
from ..comfyui_import import import_comfyui
from .plan_workers import read_workers, workers_address
from ..plan.presets import preset_names
from ...parallel.errors import InputError, reason_of

NAME = "plan"
HELP = ("Simulate one DiT forward of a video model on real or imagined GPUs (no GPU or weights "
        "needed) and say whether it fits.")
EXIT_FITS, EXIT_DOES_NOT_FIT = 0, 3


def add_arguments(p) -> None:
    p.add_argument("--model", required=True,
                   help=f"a preset ({', '.join(preset_names())}) or a .safetensors diffusion model (header only)")
    p.add_argument("--devices", default=DEFAULT_DEVICES,
                   help="'auto' (this machine's GPUs), a list 'cuda:0,cuda:1', or imagined GPUs with their free "
                        "memory 'cuda:0=24GiB,cuda:1=12GiB'; worker devices of other machines as NAME/DEVICE, "
                        "with their free memory 'box2/cuda:0=24GiB' or from --workers")
    p.add_argument("--size", default="832x480", type=_size, help="WIDTHxHEIGHT in pixels (default 832x480)")
    p.add_argument("--frames", default=81, type=int, help="video frames (default 81)")
    p.add_argument("--batch", type=int, choices=(1, 2),
                   help="1, or 2 = cond+uncond together (default: 2 if it fits, else 1, as ComfyUI does)")
    p.add_argument("--dtype", choices=("bf16", "fp16", "fp8"),
                   help="weight dtype (fp8: 1-byte weights, bf16 compute); default bf16, or the file's own")
    p.add_argument("--reserve-vram-gb", type=float, default=DEFAULT_RESERVE_VRAM_GB,
                   help=f"GiB to leave free on every GPU (default {DEFAULT_RESERVE_VRAM_GB}, as the nodes)")
    p.add_argument("--parallel", default=DEFAULT_PARALLEL, choices=PARALLEL_MODES,
                   help="strategy to report: 'blocks' (capacity), 'sequence' (speed) or 'auto' (default: the "
                        "fastest that fits, predicted by the cost model)")
    p.add_argument("--cfg", default=None, type=_cfg,
                   help=f"guidance scale (default {DEFAULT_CFG:g}; MiniMax H3: 1, as core's templates sample it): "
                        "1 = cond only (batch 1); > 1 = cond + uncond every step, which sequence mode splits over "
                        "the GPUs first")
    p.add_argument("--gpu", metavar="NAME[,NAME...]", type=_gpu,
                   help=f"GPU kind for the speed prediction ({', '.join(GPU_PEAK_TFLOPS)}); default: the "
                        f"devices' NVML names, else {DEFAULT_GPU}")
    p.add_argument("--link-gbps", metavar="X", type=_link,
                   help=f"GB/s of one GPU-to-GPU copy (default {DEFAULT_LINK_GBPS:g}: PCIe 4.0 without P2P, "
                        "through host memory; ~25 with P2P; NVLink in the hundreds)")
    p.add_argument("--dist-weights", choices=WEIGHTS_MODES,
                   help=f"with worker devices: what a worker keeps (default: {WEIGHTS_ENV}, else auto): 'share' its "
                        "equal share, 'all' every block (nothing streams per step), 'auto' all when every worker "
                        "has room")
    p.add_argument("--net-gbps", metavar="X", type=_net,
                   help=f"with worker devices: Gbit/s of the network between the machines (default "
                        f"{DEFAULT_NET_GBPS:g}: 10 GbE; InfiniBand-class 100 and up)")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.add_argument("--png", metavar="FILE", help="also write the plan as a picture (the one the Plan node shows)")
    p.add_argument("--workers", metavar="HOST:PORT",
                   help="also list the members of the Ray cluster at HOST:PORT (the host's SHARDDIT_RAY_ADDRESS; "
                        "needs RAY_AUTH_MODE=token and its token); worker devices in --devices without =SIZE take "
                        "their free memory from them")


def _size(text: str) -> tuple[int, int]:
    m = re.fullmatch(r"\s*(\d+)\s*[xX*]\s*(\d+)\s*", text)
    if not m:
        raise argparse.ArgumentTypeError(f"{text!r} is not WIDTHxHEIGHT, e.g. 1280x720")
    return int(m.group(1)), int(m.group(2))


def _cfg(text: str) -> float:
    try:
        return check_cfg(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(reason_of(err)) from None


def _gpu(text: str) -> str:
    try:
        gpu_names(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(f"{reason_of(err)}; e.g. --gpu \"RTX 4090\" (or one per GPU: \"RTX 5090,RTX 4090\")") from None
    return text


def _net(text: str) -> float:
    try:
        return parse_net_gbps(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(reason_of(err)) from None


def _link(text: str) -> float:
    try:
        parse_link_gbps(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(reason_of(err)) from None
    return float(text)


@dataclass(frozen=True)
class PlanArgs:
    """The arguments as ``check_plan_args`` read them: the devices parsed once."""

    devices: DevicePlan
    """This machine's devices (``auto`` over imagined GPUs where they were given with sizes)."""
    imagined: Inventory | None
    """The GPUs ``--devices`` gave with their free memory (None: this machine's, read by the plan)."""
    workers: tuple
    """(name, device, free bytes or None) of each worker device (``NAME/DEVICE[=SIZE]``)."""
    cluster: str | None
    """``--workers`` as HOST:PORT (None: not given)."""
    weights: str
    """What a worker keeps (``--dist-weights``, else ``SHARDDIT_DIST_WEIGHTS``, else auto)."""


def run(args) -> int:
    """Check every argument (exit 2 before ComfyUI's import), then what needs the model (its size
    grid, a file's header), then read the cluster's members (``--workers``), and only then simulate:
    a bad argument or an absent cluster never comes after a printed plan."""
    given = check_plan_args(args)
    import_comfyui()
    from ..plan.dry_run import run_simulation  # ComfyUI's model code: after the import
    from ..plan.setup import check_simulation

    setup = check_simulation(args.model, given.devices, *args.size, args.frames, args.batch, args.dtype,
                             args.reserve_vram_gb, given.imagined, args.parallel, args.cfg, args.gpu, args.link_gbps,
                             len(given.workers))
    workers, members = read_workers(given.cluster, given.workers)
    report = run_simulation(setup, args.gpu, args.link_gbps, workers, given.weights, args.net_gbps)
    note = setup.inventory.hidden_note if given.imagined is None else ""  # GPUs the driver has, hidden here
    if note:
        print(f"[ShardDiT] {note}", file=sys.stderr if args.json else sys.stdout)
    print(json.dumps(report.to_dict(), indent=1) if args.json else report.to_text())
    if args.png:
        from ..plan.picture import draw_plan_picture, picture_from_report

        draw_plan_picture(picture_from_report(report)).save(args.png)
        print(f"[ShardDiT] plan picture written to {args.png}")
    if members is not None:  # after the JSON, on stderr, so stdout stays one JSON document
        print(members.text, file=sys.stderr if args.json else sys.stdout)
    return EXIT_FITS if report.fits else EXIT_DOES_NOT_FIT


def check_plan_args(args) -> PlanArgs:
    """Every argument that needs no ComfyUI: InputError naming the value and the fix (exit 2)."""
    if args.model not in preset_names() and not os.path.isfile(args.model):
        raise InputError(f"--model {args.model!r} is neither a preset ({', '.join(preset_names())}) nor "
                         "an existing .safetensors file: pass a preset or the path of a diffusion model file")
    reserve = args.reserve_vram_gb
    if not math.isfinite(reserve) or reserve < 0:
        raise InputError(f"--reserve-vram-gb {reserve!r} is not valid: give the GiB to keep free on every "
                         f"GPU, a number >= 0 (default {DEFAULT_RESERVE_VRAM_GB:g})")
    if args.frames < 1:
        raise InputError(f"--frames {args.frames} is not valid: give at least 1 frame (Wan and "
                         "HunyuanVideo take 4k+1 frames, e.g. 81; LTX-Video 8k+1, e.g. 97)")
    if args.png:
        _check_png(args.png)
    check_device_entries(args.devices, "--devices")   # 20,001 entries: the limit, not a long "does not fit"
    local, workers = split_worker_spec(args.devices)  # worker parts: NAME/DEVICE[=SIZE], each listed once
    imagined = inventory_from_spec(local) if "=" in local else None
    devices = parse_device_plan("auto" if imagined is not None else local)  # '' is refused, as the nodes do
    cluster = workers_address(args.workers) if args.workers is not None else None
    weights = args.dist_weights or dist_weights()  # SHARDDIT_DIST_WEIGHTS: auto, share or all
    return PlanArgs(devices, imagined, workers, cluster, weights)


def _check_png(path: str) -> None:
    folder = os.path.dirname(os.path.abspath(path))
    if os.path.isdir(path):
        raise InputError(f"--png {path!r} is a folder: give a file name, e.g. "
                         f"{os.path.join(path, 'plan.png')}")
    if not os.path.isdir(folder):
        raise InputError(f"--png {path!r}: the folder {folder!r} does not exist; create it or give "
                         "another path")
    if not os.access(folder, os.W_OK):
        raise InputError(f"--png {path!r}: the folder {folder!r} is not writable; give another path")
