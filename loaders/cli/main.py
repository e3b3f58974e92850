"""The pack's command line: ``python <pack-dir> <command>``; one module per command.

Each command module has ``NAME``, ``HELP``, ``add_arguments(parser)`` and ``run(args) -> int``;
add a new one to ``COMMANDS``. Commands import ComfyUI through ``loaders/comfyui_import.py``.
"""
from __future__ import annotations

import argparse
import logging
import sys

from ..comfyui_import import ComfyUINotFound
from . import plan_command, selftest_command, shard_workflow_command, worker_command

__all__ = ["main", "COMMANDS"]

COMMANDS = (plan_command, selftest_command, shard_workflow_command, worker_command)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python <sharddit-dir>",
                                     description="ShardDiT: multi-GPU video DiTs in ComfyUI.")
    parser.add_argument("-v", "--verbose", action="store_true", help="log ComfyUI's and ShardDiT's info lines")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for command in COMMANDS:
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

