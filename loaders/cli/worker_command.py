"""``python <pack-dir> worker --join HOST:PORT --name NAME [--devices cpu|cuda:N]``: serve a ComfyUI
host's distributed `sequence` mode from this machine (``parallel/dist_worker.py``).

Imports ComfyUI (the host sends its block modules, already patched with LoRAs, and their classes
live in ComfyUI); reads no model file. Prints what it offers, serves sessions until Ctrl+C.
"""
from __future__ import annotations

import os
import socket

from ...parallel.devices import parse_device
from ...parallel.dist_config import DEFAULT_PORT, dist_timeout, parse_addr
from ..comfyui_import import import_comfyui

NAME = "worker"
HELP = ("Join a ComfyUI host (started with SHARDDIT_DIST_ADDR=HOST:PORT) as a ShardDiT worker: its devices "
        "become ranks of parallel=sequence when a devices string names them NAME/DEVICE. Trusted networks only.")


def add_arguments(p) -> None:
    p.add_argument("--join", required=True, metavar="HOST:PORT",
                   help=f"the host's SHARDDIT_DIST_ADDR (port {DEFAULT_PORT} when omitted)")
    p.add_argument("--name", required=True, help="this worker's name in devices strings (e.g. box2 -> 'box2/cuda:0')")
    p.add_argument("--devices", default=None,
                   help="the device this worker serves: 'cpu' or 'cuda:N' (default: cuda:0 if present, else cpu)")


def _free_bytes(device: str) -> int:
    import torch
    if device.startswith("cuda"):
        return int(torch.cuda.mem_get_info(torch.device(device))[0])
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError):
        return 0


def run(args) -> int:
    host, port = parse_addr(args.join, "--join")
    import_comfyui(use_cuda=True, quiet=not getattr(args, "verbose", False))
    import torch
    import torch.distributed as dist

    from ...parallel.dist_worker import serve

    text = args.devices or ("cuda:0" if torch.cuda.is_available() else "cpu")
    if "," in text:
        raise ValueError(f"--devices {text!r}: a worker serves one device for now; start one worker per device "
                         "(each with its own --name)")
    device = parse_device(text)
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(f"--devices {device!r}: torch sees no CUDA GPU here; use --devices cpu")
    offer = {"host": socket.gethostname(), "pid": os.getpid(), "devices": {device: _free_bytes(device)}}
    print(f"[ShardDiT] worker {args.name!r}: offering {device} ({offer['devices'][device] / 2**30:.1f} GiB free); "
          f"joining {host}:{port}", flush=True)
    try:
        serve(host, port, args.name, device, dist_timeout(), offer, say=lambda m: print(m, flush=True))
    except KeyboardInterrupt:
        if dist.is_initialized():
            dist.destroy_process_group()
        print(f"[ShardDiT] worker {args.name!r}: stopped", flush=True)
    return 0
