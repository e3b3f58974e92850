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


def _module(name: str):
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
