"""What the template browser lists, decided at request time from the files themselves:

- the ShardDiT category (``CATEGORY``): core's ``video_*`` templates as this ComfyUI installed them
  (``templates.video_templates``), each passed through the shard transform; a template is listed
  when the transform adds a Shard node and this ComfyUI has every node it needs;
- the pack's own ``workflows/*.json`` (listed by core under the pack's folder name): a workflow
  that needs a node this ComfyUI lacks is left out (a 2026 workflow on an older ComfyUI would open
  with "Some Nodes Are Missing").

Plain JSON work: the node classes this ComfyUI has are an argument (``known``); nothing here
imports ComfyUI or aiohttp (``routes`` serves it).
"""
from __future__ import annotations

import json
import logging
from pathlib import Path

from . import templates
from .graph import WorkflowError, graphs, subgraph_ids
from .shard_transform import shard_workflow

__all__ = ["CATEGORY", "PACK_DIR", "category_names", "filter_listing", "missing_node_types", "sharded_template"]

CATEGORY = "ShardDiT"   # the module name the frontend shows as the category's title
PACK_DIR = Path(__file__).resolve().parents[2]
WORKFLOW_FOLDER = "workflows"
# Nodes the frontend draws and never sends to the server (no class needed in NODE_CLASS_MAPPINGS).
FRONTEND_ONLY = {"Note", "MarkdownNote", "Reroute", "PrimitiveNode"}
log = logging.getLogger(__name__)


def missing_node_types(ui: dict, known) -> list:
    """The node classes the UI workflow ``ui`` uses (inside its subgraphs too) that are not in
    ``known``; subgraph instances and frontend-only nodes need none."""
    inner = subgraph_ids(ui)
    used = {n.get("type") for g in graphs(ui) for n in g.get("nodes", [])}
    return sorted(t for t in used - inner - FRONTEND_ONLY if isinstance(t, str) and t not in known)


def _read(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        log.warning("[ShardDiT] template browser: cannot read %s (%s); not listed", path, e)
        return None


def sharded_template(name: str, known, node_io=None) -> dict | None:
    """Core's template ``name`` with its Shard nodes (``shard_transform``'s result as a dict), None
    when it is not installed, cannot be read, has nothing to shard or needs nodes this ComfyUI lacks."""
    path = templates.template_path(name)
    ui = _read(path) if path is not None else None
    if ui is None:
        return None
    try:
        result = shard_workflow(ui, node_io)
    except WorkflowError as e:
        log.warning("[ShardDiT] template browser: %s is not a workflow (%s); not listed", path, e)
        return None
    if not result.added or missing_node_types(result.workflow, known):
        return None
    return result.workflow


def category_names(known, node_io=None) -> list:
    """The names the ShardDiT category lists (sorted; [] without a templates package)."""
    return sorted(name for name in templates.video_templates() if sharded_template(name, known, node_io))


def _pack_workflow_loads(pack_dir: Path, name: str, known) -> bool:
    ui = _read(pack_dir / WORKFLOW_FOLDER / f"{name}.json")
    if ui is None:
        return False
    try:
        missing = missing_node_types(ui, known)
    except (WorkflowError, AttributeError, TypeError):
        return True   # not a UI workflow: core lists it as it is
    if missing:
        log.info("[ShardDiT] template browser: %s needs nodes this ComfyUI lacks (%s); not listed",
                 name, ", ".join(missing))
    return not missing


def filter_listing(listing: dict, known, node_io=None, pack_dir: Path = PACK_DIR) -> dict:
    """Core's ``GET /workflow_templates`` answer (``{module: [names]}``) with the pack's own
    workflows (``pack_dir/workflows``, listed under the folder's name) this ComfyUI cannot load left
    out and the ShardDiT category added (when non-empty)."""
    out = dict(listing)
    own = pack_dir.name
    if isinstance(out.get(own), list):
        out[own] = [n for n in out[own] if isinstance(n, str) and _pack_workflow_loads(pack_dir, n, known)]
        if not out[own]:
            del out[own]
    names = category_names(known, node_io)
    if names:
        out[CATEGORY] = names
    return out
