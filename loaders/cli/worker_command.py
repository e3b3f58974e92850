"""``python <pack-dir> worker --join HOST[:6379] --name NAME [--devices DEV[,DEV...]]``: this machine
joins the Ray cluster at HOST as a node whose devices become members ``NAME/DEVICE`` of the ComfyUI
host's `sequence` mode (``worker_ray``: a thin wrapper over ``ray start --address ... --block`` run
from ComfyUI's Python). Needs Ray (requirements-cluster.txt), ``RAY_AUTH_MODE=token`` and the
cluster's token. ``--ray`` is accepted and changes nothing (it chose Ray when a lobby of ShardDiT's
own was the default; the lobby is gone).
"""
from __future__ import annotations

import math

from ...parallel.placement.devices import MEMBER_NAME_FORM
from .worker_ray import RAY_PORT, run_ray_node
from ...parallel.errors import InputError

NAME = "worker"
HELP = ("Join the Ray cluster at HOST:6379 (the ComfyUI host's SHARDDIT_RAY_ADDRESS) as a ShardDiT worker machine: each "
        "of its devices becomes a member NAME/DEVICE of parallel=sequence. Needs Ray, RAY_AUTH_MODE=token and the "
        "cluster's token; a private network or a VPN between the machines.")


def add_arguments(p) -> None:
    p.add_argument("--join", metavar="HOST[:PORT]", help=f"the Ray head's address (port {RAY_PORT} when omitted); required")
    p.add_argument("--name", help=f"this machine's name in devices strings (e.g. box2 -> 'box2/cuda:0'): "
                                  f"{MEMBER_NAME_FORM}")
    p.add_argument("--devices", default=None,
                   help="the devices this machine serves, each once: 'cpu', 'cuda:N' or a list like 'cuda:0,cuda:1' "
                        "(default: cuda:0 if present, else cpu)")
    p.add_argument("--ray", action="store_true", help="accepted for older command lines; Ray is the only way now")
    p.add_argument("--wait", type=float, default=math.inf, metavar="SECONDS",
                   help="give up (exit 1) when the Ray head has not answered within SECONDS (default: wait until it does)")


def run(args) -> int:
    if not args.wait > 0:
        raise InputError(f"--wait {args.wait!r} is not a positive number of seconds")
    return run_ray_node(args)
