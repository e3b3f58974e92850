"""The pack's command line: ``python <pack-dir> <command>``; one module per command.

Each command module has ``NAME``, ``HELP``, ``add_arguments(parser)`` and ``run(args) -> int``;
add a new one to ``_COMMANDS``. ``find_comfyui`` / ``import_comfyui`` give commands ComfyUI's own
code (CPU only, nothing touches CUDA) without the pack's ``nodes/`` ever shadowing ``nodes.py``.
"""
from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path

__all__ = ["main", "find_comfyui", "import_comfyui", "ComfyUINotFound"]

PACK_DIR = Path(__file__).resolve().parents[1]


class ComfyUINotFound(RuntimeError):
    """No ComfyUI tree: the message says how to set COMFYUI_PATH."""


def _commands():
    from . import cli_plan, cli_selftest

    return (cli_plan, cli_selftest)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python <sharddit-dir>",
                                     description="ShardDiT: multi-GPU video DiTs in ComfyUI.")
    parser.add_argument("-v", "--verbose", action="store_true", help="log ComfyUI's and ShardDiT's info lines")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for command in _commands():
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


def find_comfyui() -> Path:
    """COMFYUI_PATH, else the ComfyUI this pack sits in (``ComfyUI/custom_nodes/<pack>``)."""
    env = os.environ.get("COMFYUI_PATH")
    if env:
        root = Path(env).expanduser().resolve()
        if not (root / "comfy" / "model_detection.py").is_file():
            raise ComfyUINotFound(
                f"[ShardDiT] COMFYUI_PATH={env!r} is not a ComfyUI folder (no comfy/model_detection.py "
                "in it): set COMFYUI_PATH to the folder that holds ComfyUI's main.py and comfy/")
        return root
    if PACK_DIR.parent.name == "custom_nodes" and (PACK_DIR.parents[1] / "comfy").is_dir():
        return PACK_DIR.parents[1]
    raise ComfyUINotFound(
        f"[ShardDiT] cannot find ComfyUI: the pack at {PACK_DIR} is not inside ComfyUI/custom_nodes/ and "
        "COMFYUI_PATH is not set. Set it to your ComfyUI folder (the one with main.py and comfy/), e.g. "
        f"COMFYUI_PATH=/path/to/ComfyUI python {PACK_DIR} plan ...")


def import_comfyui() -> Path:
    """Put ComfyUI's root on sys.path and import what the simulator needs, in CPU mode."""
    root = find_comfyui()
    if str(root) not in sys.path:
        sys.path.insert(0, str(root))
    import comfy.options

    comfy.options.enable_args_parsing(False)
    from comfy.cli_args import args

    args.cpu = True  # model_management then never initialises CUDA
    args.use_pytorch_cross_attention = True
    import comfy.model_detection  # noqa: F401

    return root
