"""The pack's command line: ``python <pack-dir> <command>``; one module per command.

Each command module has ``NAME``, ``HELP``, ``add_arguments(parser)`` and ``run(args) -> int``;
add a new one to ``COMMANDS`` (command name -> module). Only the command that runs is imported:
``shard-workflow`` is plain JSON work and must not wait for torch, which ``plan`` and the others
import. ``--help`` imports them all to list their help. Commands import ComfyUI through
``loaders/comfyui_import.py``.
"""
from __future__ import annotations

import argparse
import importlib
import logging
import sys

from ..comfyui_import import ComfyUINotFound

__all__ = ["main", "COMMANDS"]

COMMANDS = {"plan": "plan_command", "selftest": "selftest_command", "shard-workflow": "shard_workflow_command",
            "worker": "worker_command"}
NO_TORCH = {"shard-workflow"}   # commands that run without torch
TORCH_FIX = ("pip install torch in the Python that runs ComfyUI (the CUDA build for your GPUs: "
             "https://pytorch.org/get-started/locally/), or run this command with ComfyUI's own Python")


def require_torch() -> None:
    """Exit 2 naming the fix when this Python has no torch (a bare ImportError traceback otherwise)."""
    try:
        import torch  # noqa: F401
    except ImportError as err:
        print(f"error: [ShardDiT] torch is not installed in {sys.executable} ({err}): {TORCH_FIX}", file=sys.stderr)
        raise SystemExit(2) from None


def _module(name: str):
    if name not in NO_TORCH:
        require_torch()   # before the command's imports, which need it
    return importlib.import_module(f"{__package__}.{COMMANDS[name]}")


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    chosen = next((a for a in argv if not a.startswith("-")), None)
    names = [chosen] if chosen in COMMANDS else list(COMMANDS)   # unknown or none: argparse lists them all
    parser = argparse.ArgumentParser(prog="python <sharddit-dir>",
                                     description="ShardDiT: multi-GPU video DiTs in ComfyUI.")
    parser.add_argument("-v", "--verbose", action="store_true", help="log ComfyUI's and ShardDiT's info lines")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in names:
        command = _module(name)
        p = sub.add_parser(command.NAME, help=command.HELP, description=command.HELP)
        command.add_arguments(p)
        p.set_defaults(run=command.run)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, format="%(message)s")
    try:
        return args.run(args)
    except (ComfyUINotFound, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
