"""``python <pack-dir> shard-workflow IN.json [-o OUT.json]``: any workflow made multi-GPU.

Adds one Shard DiT Blocks (ShardDiT) node after every diffusion-model loader of a UI or API
workflow (``loaders/workflow/shard_transform.py``); ``--unshard`` removes them; ``--template NAME`` reads one
of the video templates the installed ComfyUI has. Writes to ``-o`` (default: standard output).
Exit codes: 0 written (also when the workflow was already sharded: it is written unchanged), 2 an
unreadable file, not a workflow, or nothing to shard.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

from ..workflow.shard_transform import shard_workflow, unshard_workflow
from ..workflow.graph import WorkflowError
from ..workflow.templates import load_template, video_templates
from ...parallel.errors import InputError

NAME = "shard-workflow"
HELP = ("Add a Shard DiT Blocks (ShardDiT) node after every diffusion-model loader of a ComfyUI workflow "
        "(UI or API JSON), or remove them with --unshard.")


def add_arguments(p) -> None:
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("input", nargs="?", help="the workflow JSON file (UI format as saved, or API format)")
    src.add_argument("--template", metavar="NAME",
                     help="an installed core video template (e.g. video_wan2_2_14B_t2v); --list-templates lists them")
    src.add_argument("--list-templates", action="store_true", help="list the installed video templates and exit")
    p.add_argument("-o", "--output", help="where to write the result (default: standard output)")
    p.add_argument("--unshard", action="store_true", help="remove the Shard nodes instead (the inverse)")


def _read(args) -> dict:
    if args.template:
        try:
            return load_template(args.template)
        except FileNotFoundError as err:
            raise InputError(f"{err}. Install ComfyUI's templates (pip install comfyui-workflow-templates) or "
                             f"pass a file instead") from None
    path = Path(args.input)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        raise InputError(f"cannot read {path}: {err}") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as err:
        raise InputError(f"{path} is not JSON ({err}); save the workflow from ComfyUI (Save or Export (API))") from None


def run(args) -> int:
    if args.list_templates:
        names = video_templates()
        print("\n".join(names) if names else "no comfyui_workflow_templates package installed", file=sys.stdout)
        return 0 if names else 2
    workflow = _read(args)
    try:
        result = (unshard_workflow if args.unshard else shard_workflow)(workflow)
    except WorkflowError as err:
        raise InputError(f"{args.input or args.template}: {err.reason}") from None
    if not result.added and not result.already:
        print(f"error: {args.input or args.template}: {result.reason}", file=sys.stderr)
        return 2
    text = json.dumps(result.workflow, indent=2, ensure_ascii=False) + "\n"
    if args.output:
        Path(args.output).write_text(text, encoding="utf-8")
    else:
        sys.stdout.write(text)
    print(f"[ShardDiT] {result.message}", file=sys.stderr)
    return 0
