"""``python <pack-dir> worker --join HOST:PORT --name NAME [--devices DEV[,DEV...]]``: serve a ComfyUI
host's distributed `sequence` mode from this machine (``parallel/distributed/worker.py``).
``python <pack-dir> worker --new-secret`` prints a fresh shared secret for the host and its workers.

The worker needs the host's secret (``SHARDDIT_DIST_SECRET`` or ``SHARDDIT_DIST_SECRET_FILE``):
without one it stops before connecting; with another than the host's it is refused when it
reads the host's signed lobby entry, before it registers.

One serving process per device (the torchrun norm): each registers as the member ``NAME/DEVICE``
(``box2/cuda:1``). With one device this process serves it; with several it starts one child per
device (``python <pack-dir> worker ... --devices DEV``, so each child is exactly the one-device
worker) and Ctrl+C stops them all; the parent imports no ComfyUI and touches no GPU, and each
child makes its device current (``distributed/join.bind_device``) before ComfyUI's import makes a CUDA
context, so each reports its own GPU's free memory and runs its kernels there. Each child imports
ComfyUI: the host describes its blocks (model class, config, tensor layout) and the worker builds
them with its own ComfyUI classes (``loaders/comfy/worker_blocks``), then receives their weights
(patched with LoRAs) as raw bytes; nothing is unpickled. Reads no model file.

``python <pack-dir> worker --ray --join HOST:6379 --name box2 --devices cuda:0,cuda:1`` (preview):
join a Ray cluster instead of the lobby, as a thin wrapper over ``ray start --address HOST:6379
--block`` run from this Python, the node labelled with the name and its devices as resources
(``parallel/cluster/node.py``); needs ``RAY_AUTH_MODE=token`` and the cluster's token. The host's
sampling does not use Ray members yet.
"""
from __future__ import annotations

import math
import os
import signal
import subprocess
import sys
import time

from ...parallel.placement.devices import MEMBER_NAME_FORM, check_member_name
from ...parallel.distributed.config import DEFAULT_PORT, dist_timeout, parse_addr
from ...parallel.distributed.connect import (
    HostUnreachable,
    HostUnresolved,
    resolve_host,
    wait_for_port,
)
from ...parallel.distributed.secret import HOW_TO_MAKE, dist_secret, new_secret
from ..comfyui_import import import_comfyui
from .worker_devices import check_cuda, parse_worker_devices
from .worker_ray import RAY_PORT, run_ray_node

NAME = "worker"
HELP = ("Join a ComfyUI host (started with SHARDDIT_DIST_ADDR=HOST:PORT) as a ShardDiT worker: each of its devices "
        "becomes a rank of parallel=sequence when a devices string names it NAME/DEVICE. Needs the host's "
        "SHARDDIT_DIST_SECRET; private networks or a VPN only (nothing is encrypted).")
PACK_DIR = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
STOP_WAIT_S = 30.0


def add_arguments(p) -> None:
    p.add_argument("--new-secret", action="store_true",
                   help="print a fresh shared secret and exit: give it to the host and every worker as "
                        "SHARDDIT_DIST_SECRET (or in a file only you can read, named by SHARDDIT_DIST_SECRET_FILE)")
    p.add_argument("--join", metavar="HOST:PORT",
                   help=f"the host's SHARDDIT_DIST_ADDR (port {DEFAULT_PORT} when omitted); with --ray the Ray "
                        f"head's address (port {RAY_PORT} when omitted); required")
    p.add_argument("--name", help=f"this worker's name in devices strings (e.g. box2 -> 'box2/cuda:0'): "
                                                  f"{MEMBER_NAME_FORM}")
    p.add_argument("--devices", default=None,
                   help="the devices this worker serves, each once: 'cpu', 'cuda:N' or a list like 'cuda:0,cuda:1' "
                        "(one process per device; default: cuda:0 if present, else cpu)")
    p.add_argument("--ray", action="store_true",
                   help="(preview) join the Ray cluster at --join as a Ray node (ray start) instead of the host's "
                        "lobby; needs RAY_AUTH_MODE=token and the cluster's token (requirements-cluster.txt)")
    p.add_argument("--wait", type=float, default=math.inf, metavar="SECONDS",
                   help="give up (exit 1) when the host has not answered within SECONDS (default: wait until it does)")


def check_arguments(args) -> tuple[str, int, list[str] | None]:
    """(host, port, devices or None for the default): every argument checked, the host name
    resolved, before ComfyUI is imported or anything connects (ValueError: exit 2)."""
    for option, value in (("--join", args.join), ("--name", args.name)):
        if value is None:
            raise ValueError(f"{option} is required (python <pack-dir> worker --join HOST:PORT --name NAME)")
    host, port = parse_addr(args.join, "--join")
    check_member_name(args.name, "--name")
    if dist_secret() is None:  # a bad one raises here, naming the variable
        raise ValueError(f"[ShardDiT] worker {args.name!r} needs the host's shared secret, and none is set: "
                         + HOW_TO_MAKE)
    requested = parse_worker_devices(args.devices) if args.devices is not None else None
    if requested and any(d.startswith("cuda") for d in requested):  # before waiting for the host
        import torch

        check_cuda(requested, torch)
    if not args.wait > 0:
        raise ValueError(f"--wait {args.wait!r} is not a positive number of seconds")
    dist_timeout()  # SHARDDIT_DIST_TIMEOUT, named with its range when bad
    try:
        resolve_host(host, port)
    except HostUnresolved as e:
        raise ValueError(f"--join {args.join!r}: {str(e).removeprefix('[ShardDiT] ')}") from None
    return host, port, requested


def run(args) -> int:
    if getattr(args, "new_secret", False):
        print(new_secret())
        return 0
    if getattr(args, "ray", False):
        return run_ray_node(args)  # the Ray path (preview; worker_ray.py imports no Ray itself)
    host, port, requested = check_arguments(args)
    try:  # before ComfyUI's slow import: whether the host answers is said within seconds
        wait_for_port(host, port, args.wait, say=lambda m: print(m, flush=True), hint=_hint(host, port))
    except HostUnreachable as e:
        print(f"{e}; worker {args.name!r} gives up (--wait {args.wait:g})", flush=True)
        return 1
    except KeyboardInterrupt:
        print(f"[ShardDiT] worker {args.name!r}: stopped", flush=True)
        return 0
    import torch

    devices = requested or ["cuda:0" if torch.cuda.is_available() else "cpu"]
    check_cuda(devices, torch)
    _check_host(host, port, args.name, devices)
    if len(devices) > 1:  # before ComfyUI's import, which would make a CUDA context on cuda:0 here
        return _run_members(args, devices)
    return start_one(args, host, port, devices[0])


def start_one(args, host: str, port: int, device: str) -> int:
    """Serve one device: make it this process's CUDA device first (``bind_device``), then import
    ComfyUI (which makes its CUDA context on the current device) and serve."""
    from ...parallel.distributed.worker import bind_device

    bind_device(device)
    try:
        import_comfyui(use_cuda=True, quiet=not getattr(args, "verbose", False))
    except KeyboardInterrupt:  # stopped while starting (e.g. by the parent of several members)
        print(f"[ShardDiT] worker {args.name!r}: stopped", flush=True)
        return 0
    return _serve_one(host, port, args.name, device, args.wait)


def _check_host(host: str, port: int, name: str, devices: list[str]) -> None:
    """The host's lobby accepts this worker's secret and protocol, checked once before ComfyUI's
    slow import and before any child starts (``WorkerRefused``, a ValueError: exit 2)."""
    from ...parallel.distributed.lobby import require_secret
    from ...parallel.distributed.worker import check_lobby, connect

    store = connect(host, port, dist_timeout(), wait_s=10.0, say=lambda m: print(m, flush=True))
    check_lobby(store, require_secret(), f"{name}/{','.join(devices)}", f"the host at {host}:{port}")
    del store


def _hint(host: str, port: int) -> str:
    return f"is ComfyUI running there with SHARDDIT_DIST_ADDR={host}:{port}?"


def _serve_one(host: str, port: int, name: str, device: str, wait_s: float = math.inf) -> int:
    import torch.distributed as dist

    from ...parallel.distributed.worker import WorkerRefused, serve
    from ..comfy.worker_blocks import register_comfy

    register_comfy()  # this worker builds ComfyUI's own blocks from the host's description

    print(f"[ShardDiT] worker {name!r}: serving {device} as {name}/{device}; joining {host}:{port}", flush=True)
    try:
        serve(host, port, name, device, dist_timeout(), say=lambda m: print(m, flush=True), wait_s=wait_s,
              comfyui=_comfyui_version())
    except (HostUnreachable, HostUnresolved) as e:
        print(f"{e}; worker {name!r} gives up (--wait {wait_s:g})", flush=True)
        return 1
    except WorkerRefused as e:
        print(f"{e}", file=sys.stderr, flush=True)
        return 2
    except KeyboardInterrupt:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl+C must not break the cleanup
        if dist.is_initialized():
            dist.destroy_process_group()
        print(f"[ShardDiT] worker '{name}/{device}': stopped", flush=True)
    return 0


def _comfyui_version() -> str:
    try:
        import comfyui_version

        return str(comfyui_version.__version__)
    except (ImportError, AttributeError):
        return ""


def member_command(args, device: str) -> list[str]:
    """The command line of the child serving ``device``: the one-device worker for that device."""
    head = [sys.executable, PACK_DIR] + (["-v"] if getattr(args, "verbose", False) else []) + ["worker"]
    wait = ["--wait", f"{args.wait:g}"] if math.isfinite(getattr(args, "wait", math.inf)) else []
    return head + ["--join", args.join, "--name", args.name, "--devices", device] + wait


def _run_members(args, devices: list[str]) -> int:
    """One child per device, each the one-device worker; waits for them, stops them all on Ctrl+C."""
    children = {}
    for device in devices:  # own session: Ctrl+C reaches this process only, which stops each child once
        children[device] = subprocess.Popen(member_command(args, device), start_new_session=True)
        print(f"[ShardDiT] worker {args.name!r}: started {args.name}/{device} (pid {children[device].pid})", flush=True)
    try:
        while True:
            gone = {d: c.returncode for d, c in children.items() if c.poll() is not None}
            if gone:
                device, code = next(iter(gone.items()))
                print(f"[ShardDiT] worker {args.name!r}: the process serving {device} exited with {code}; stopping "
                      f"the others ({', '.join(d for d in children if d not in gone) or 'none left'})", flush=True)
                _stop(children)
                return 1
            time.sleep(0.5)
    except KeyboardInterrupt:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        _stop(children)
        print(f"[ShardDiT] worker {args.name!r}: stopped ({', '.join(devices)})", flush=True)
        return 0


def _stop(children: dict) -> None:
    """Ctrl+C each live child, wait for it (``STOP_WAIT_S``), kill one that does not stop."""
    for child in children.values():
        if child.poll() is None:
            child.send_signal(signal.SIGINT)
    for device, child in children.items():
        try:
            child.wait(STOP_WAIT_S)
        except subprocess.TimeoutExpired:
            print(f"[ShardDiT] worker: the process serving {device} did not stop in {STOP_WAIT_S:.0f} s; killing it",
                  flush=True)
            child.kill()
            child.wait()

