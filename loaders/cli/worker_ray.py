"""``python <pack-dir> worker --join HOST[:PORT] --name NAME [--devices ...]``: this machine joins a
Ray cluster as a node whose devices become members ``NAME/DEVICE``.

A thin wrapper over ``ray start --address HOST:PORT --block`` run from this Python (ComfyUI's),
the node labelled with the name and holding one resource per device (``parallel/cluster/node.py``).
Every argument is checked first, then token authentication (``RAY_AUTH_MODE=token``, or
``SHARDDIT_CLUSTER_INSECURE=1`` said loudly), then that Ray is installed, then that the head's
port answers (said within seconds, bounded by ``--wait``), before ``ray start`` runs. Ctrl+C
stops the node (Ray ends its processes) and this command.
"""
from __future__ import annotations

import importlib.util
import json
import logging
import os
import signal
import subprocess
import sys

from ...parallel.cluster.node import ray_start_command
from ...parallel.cluster.rank_actor import PACK_DIR_ENV, SETUP_ENV
from ...parallel.cluster.settings import INSTALL_HINT, check_auth
from ...parallel.distributed.config import HostUnreachable, HostUnresolved, parse_addr, resolve_host, wait_for_port
from ...parallel.placement.devices import check_member_name
from .worker_devices import check_cuda, parse_worker_devices
from ...parallel.errors import InputError

__all__ = ["RAY_PORT", "node_environment", "ray_join_address", "ray_node_command", "run_ray_node", "setup_rank"]

RAY_PORT = 6379  # Ray's GCS port
PACK_DIR = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
log = logging.getLogger("sharddit")


def node_environment(env=os.environ) -> dict:
    """The node's environment (its rank actors inherit it): where this pack is, and the setup each
    rank runs before serving (``setup_rank``: ComfyUI's block classes)."""
    return {**env, PACK_DIR_ENV: PACK_DIR, SETUP_ENV: f"{__name__.split('.')[0]}.loaders.cli.worker_ray:setup_rank"}


def setup_rank(device: str) -> str:
    """Run in a rank actor before it serves: make ``device`` current, import this node's ComfyUI
    (``COMFYUI_PATH``, or the ComfyUI the pack sits in) and register its block builders, so the
    rank builds the host's blocks with ComfyUI's own classes. Returns ComfyUI's version ('' when
    this node has no ComfyUI: then only the blocks of other registered families can run here)."""
    from ...parallel.distributed.members import bind_device
    from ..comfyui_import import ComfyUINotFound, import_comfyui

    if device.startswith("cuda"):
        bind_device(device)
    try:
        import_comfyui(use_cuda=True, quiet=True)
    except ComfyUINotFound as e:
        log.warning("%s; this member builds no ComfyUI blocks", e)
        return ""
    from ..comfy.remote.worker_blocks import register_comfy
    register_comfy()
    try:
        import comfyui_version

        return str(comfyui_version.__version__)
    except (ImportError, AttributeError):
        return ""


def ray_node_command(args) -> list[str]:
    """``worker``: the checked ``ray start`` command (ValueError: exit 2)."""
    for option, value in (("--join", args.join), ("--name", args.name)):
        if value is None:
            raise InputError(f"{option} is required (python <pack-dir> worker --join HOST:{RAY_PORT} "
                             "--name NAME)")
    check_member_name(args.name, "--name")
    address = ray_join_address(args.join)
    try:
        resolve_host(*parse_addr(address, "--join"))
    except HostUnresolved as e:
        raise InputError(f"--join {args.join!r}: {e.reason}") from None
    devices = parse_worker_devices(args.devices) if args.devices is not None else None
    if devices is None or any(d.startswith("cuda") for d in devices):
        import torch

        devices = devices or ["cuda:0" if torch.cuda.is_available() else "cpu"]
        check_cuda(devices, torch)
    check_auth(f"worker {args.name!r} (a Ray node)")
    if importlib.util.find_spec("ray") is None:
        raise InputError(f"worker needs Ray in {sys.executable}: {INSTALL_HINT}")
    return ray_start_command(address, args.name, devices)


def ray_join_address(text: str) -> str:
    """``--join`` with ``--ray``: ``HOST[:PORT]`` -> ``HOST:PORT`` (Ray's 6379 when omitted)."""
    text = text.strip()
    host, port = parse_addr(text if ":" in text.split("]")[-1] else f"{text}:{RAY_PORT}", "--join")
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def run_ray_node(args) -> int:
    """Run ``ray start --block`` until it exits or Ctrl+C (which stops the node: Ray ends its processes)."""
    cmd = ray_node_command(args)
    host, port = parse_addr(ray_join_address(args.join), "--join")
    try:  # ray start's own wait is silent for ~20 s, then a traceback: say it, and honour --wait
        wait_for_port(host, port, args.wait, say=lambda m: print(m, flush=True),
                      hint=f"is `ray start --head --port {port}` running there?")
    except (HostUnreachable, HostUnresolved) as e:
        print(f"{e}; worker {args.name!r} gives up (--wait {args.wait:g})", flush=True)
        return 1
    members = ", ".join(f"{args.name}/{r.rsplit('/', 1)[-1]}" for r in json.loads(cmd[cmd.index("--resources") + 1]))
    print(f"[ShardDiT] worker {args.name!r}: joining the Ray cluster at {args.join} as {members}", flush=True)
    child = subprocess.Popen(cmd, env=node_environment())  # its CUDA_VISIBLE_DEVICES numbers --devices
    try:
        return child.wait()
    except KeyboardInterrupt:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        _stop(child)
        print(f"[ShardDiT] worker {args.name!r}: stopped (left the Ray cluster)", flush=True)
        return 0


def _stop(child, wait_s: float = 30.0) -> None:
    """Stop ``ray start --block`` as Ctrl+C in a terminal would (a signal sent to this process
    alone does not reach it): SIGINT, then SIGTERM, then SIGKILL, ``wait_s`` each."""
    for stop in (lambda: child.send_signal(signal.SIGINT), child.terminate, child.kill):
        if child.poll() is not None:
            return
        stop()
        try:
            child.wait(wait_s)
            return
        except subprocess.TimeoutExpired:
            continue
