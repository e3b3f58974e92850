"""The shard transform: one ``ShardDiTShardModel`` on every MODEL that leaves a diffusion-model
source, before anything else uses it (LoRAs, patches, samplers), inside the (sub)graph where the
source is; and its inverse.

A source is a node with a MODEL output and no MODEL input: core's ``UNETLoader`` and checkpoint
loaders, ``UnetLoaderGGUF``, any other pack's loader. Not a source: subgraph instances (their
inside is visited instead), reroutes, primitives and get/set nodes, wildcard nodes, ShardDiT's own
loaders (already sharded). A MODEL output nothing reads is left alone; one that already feeds a
Shard node is counted in ``already`` (so a second pass changes nothing).

UI format: the Shard node gets the source's mode (a bypassed loader's Shard node is bypassed with
it, and comes back with it), sits under the source, and what lies below moves down
(``layout.make_room``); what moved is written into the Shard node's ``properties`` so that
``unshard_workflow`` puts it back exactly. API format: the node is added with the next free id of
its subgraph prefix (``"128:74"`` gets ``"128:<n>"``).
"""
from __future__ import annotations

import copy
from dataclasses import dataclass, field

from . import layout
from .graph import (add_link, api_links, as_dict, graph_name, graphs, max_ids, remove_link,
                    set_origin, subgraph_ids, workflow_format)

__all__ = ["SHARD_NODE", "Change", "ShardResult", "shard_workflow", "unshard_workflow"]

SHARD_NODE = "ShardDiTShardModel"
OWN_LOADERS = {"ShardDiTLoadDiffusionModel"}   # shard what they load: a workflow built on them is sharded already
SHARD_TITLE = "Shard DiT Blocks (ShardDiT)"
SHARD_WIDGETS = {"devices": "auto", "reserve_vram_gb": 1.0, "parallel": "auto"}   # the node's widget order
SHARD_HEIGHT = 106    # one socket row and three widgets, as the frontend draws them
SHARD_MIN_WIDTH = 270
RECORD = "sharddit_inserted"   # the Shard node's property holding what the transform moved
NOT_SOURCES = {"Reroute", "PrimitiveNode", "GetNode", "SetNode", "Note", "MarkdownNote"}
# API format carries no types: these classes' MODEL output slots are known; others come from node_io
KNOWN_SOURCES = {"UNETLoader": [0], "CheckpointLoaderSimple": [0], "CheckpointLoader": [0],
                 "unCLIPCheckpointLoader": [0], "ImageOnlyCheckpointLoader": [0], "UnetLoaderGGUF": [0],
                 "UnetLoaderGGUFAdvanced": [0], "DiffusionModelLoaderKJ": [0]}


@dataclass(frozen=True)
class Change:
    graph: str          # the subgraph's name, "" at the top level
    loader_id: object
    loader_type: str
    label: str          # the loader's title, else its model file, else its type
    shard_id: object


@dataclass
class ShardResult:
    workflow: dict
    format: str
    added: list = field(default_factory=list)     # Change per Shard node added (or removed, by unshard)
    already: list = field(default_factory=list)   # Change per Shard node already in place
    reason: str | None = None                     # why nothing changed
    message: str = ""


def _takes_model(types) -> bool:
    return any(t == "*" or "MODEL" in str(t).split(",") for t in types)


def _label(node: dict, title: str | None) -> str:
    if title:
        return title
    values = node.get("widgets_values")
    values = list(values.values()) if isinstance(values, dict) else (values or [])
    name = next((v for v in values if isinstance(v, str) and v), None)
    if name:
        return name.rsplit("/", 1)[-1].rsplit(".", 1)[0]
    return node.get("type") or node.get("class_type")


def _message(added: list, already: list, verb: str) -> str:
    if added:
        noun = "Shard node" if len(added) == 1 else "Shard nodes"
        return f"{len(added)} {noun} {verb}: " + ", ".join(c.label for c in added)
    return ""


# ----------------------------------------------------------------------------- UI format
def _ui_sources(ui: dict, graph: dict) -> list:
    """``[(node, MODEL output slot)]`` of the graph's diffusion-model sources, in node order."""
    skip = NOT_SOURCES | subgraph_ids(ui)
    out = []
    for node in graph["nodes"]:
        if node.get("type") in skip or str(node.get("type", "")).startswith("ShardDiT"):
            continue
        if _takes_model(i.get("type") for i in node.get("inputs") or []):
            continue
        out += [(node, k) for k, o in enumerate(node.get("outputs") or []) if o.get("type") == "MODEL"]
    return out


def _ui_insert(ui: dict, graph: dict, loader: dict, slot: int, ids: list) -> Change:
    node_id, link_id = ids[0] + 1, ids[1] + 1
    ids[:] = [node_id, link_id]
    out = loader["outputs"][slot]
    consumers = list(out["links"])
    lx, ly, lw, lh = layout.node_box(loader)
    width = max(lw, SHARD_MIN_WIDTH)
    box = (lx, ly + lh + layout.GAP, width, SHARD_HEIGHT + layout.TITLE_H)
    record = layout.make_room(graph, loader, box)
    record["counters"] = {k: ui.get(k) for k in ("last_node_id", "last_link_id")}
    record["state"] = dict(ui["state"]) if isinstance(ui.get("state"), dict) else None
    shard = {"id": node_id, "type": SHARD_NODE, "pos": [lx, box[1] + layout.TITLE_H], "size": [width, SHARD_HEIGHT],
             "flags": {}, "order": loader.get("order", 0), "mode": loader.get("mode", 0),
             "inputs": [{"name": "model", "type": "MODEL", "link": link_id}],
             "outputs": [{"name": "MODEL", "type": "MODEL", "links": consumers}],
             "properties": {"Node name for S&R": SHARD_NODE, RECORD: record},
             "widgets_values": list(SHARD_WIDGETS.values())}
    for k in consumers:
        set_origin(graph, k, node_id, 0)
    add_link(graph, {"id": link_id, "origin_id": loader["id"], "origin_slot": slot, "target_id": node_id,
                     "target_slot": 0, "type": "MODEL"}, top=graph is ui)
    out["links"] = [link_id]
    graph["nodes"].append(shard)
    ui["last_node_id"], ui["last_link_id"] = node_id, link_id   # ids stay unique workflow-wide
    if isinstance(ui.get("state"), dict):
        ui["state"].update(lastNodeId=node_id, lastLinkId=link_id)
    return Change(graph_name(ui, graph), loader["id"], loader["type"], _label(loader, loader.get("title")), node_id)


def _ui_shard(ui: dict) -> tuple:
    added, already = [], []
    ids = list(max_ids(ui))
    for graph in graphs(ui):
        by_id = {n["id"]: n for n in graph["nodes"]}
        already += [Change(graph_name(ui, graph), n["id"], n["type"], _label(n, n.get("title")), n["id"])
                    for n in graph["nodes"] if n.get("type") in OWN_LOADERS]
        for loader, slot in _ui_sources(ui, graph):
            consumers = loader["outputs"][slot].get("links") or []
            targets = [by_id.get(as_dict(graph["links"][_index(graph, k)])["target_id"]) for k in consumers]
            shards = [t for t in targets if t is not None and t.get("type") == SHARD_NODE]
            if shards:
                already.append(Change(graph_name(ui, graph), loader["id"], loader["type"],
                                      _label(loader, loader.get("title")), shards[0]["id"]))
            elif consumers:
                added.append(_ui_insert(ui, graph, loader, slot, ids))
    return added, already


def _index(graph: dict, link_id) -> int:
    return next(i for i, k in enumerate(graph["links"]) if as_dict(k)["id"] == link_id)


def _ui_unshard(ui: dict) -> list:
    """Newest Shard node first: each one's record was made on the layout its predecessors left."""
    removed = []
    found = [(g, n) for g in graphs(ui) for n in g["nodes"] if n.get("type") == SHARD_NODE]
    for graph, shard in sorted(found, key=lambda gn: -gn[1]["id"] if isinstance(gn[1]["id"], int) else 0):
        links = {as_dict(k)["id"]: as_dict(k) for k in graph["links"]}
        by_id = {n["id"]: n for n in graph["nodes"]}
        link_in = (shard.get("inputs") or [{}])[0].get("link")
        consumers = list((shard.get("outputs") or [{}])[0].get("links") or [])
        source = links.get(link_in)
        if source is None or source["origin_id"] not in by_id:
            continue   # an unlinked Shard node (or one fed through a subgraph input) stays: nothing to reconnect
        loader = by_id[source["origin_id"]]
        for k in consumers:
            set_origin(graph, k, loader["id"], source["origin_slot"])
        out = loader["outputs"][source["origin_slot"]]
        out["links"] = [k for k in out.get("links") or [] if k != link_in] + consumers
        remove_link(graph, link_in)
        graph["nodes"].remove(shard)
        _restore(ui, graph, (shard.get("properties") or {}).get(RECORD))
        removed.append(Change(graph_name(ui, graph), loader["id"], loader.get("type"),
                              _label(loader, loader.get("title")), shard["id"]))
    return removed[::-1]


def _restore(ui: dict, graph: dict, record: dict | None) -> None:
    """Undo what inserting one Shard node did to the layout and the id counters."""
    if not record:
        return   # a Shard node placed by hand: nothing was moved for it
    layout.undo_room(graph, record)
    for k, v in record.get("counters", {}).items():
        if v is None:
            ui.pop(k, None)
        else:
            ui[k] = v
    if record.get("state") is not None:
        ui["state"] = record["state"]


# ----------------------------------------------------------------------------- API format
def _api_sources(api: dict, node_io) -> list:
    out = []
    for nid, node in api.items():
        cls = node["class_type"]
        if cls.startswith("ShardDiT"):
            continue
        io = node_io(cls) if node_io is not None else None
        if io is not None:
            inputs, outputs = io
            if not _takes_model(inputs):
                out += [(nid, k) for k, t in enumerate(outputs) if t == "MODEL"]
        elif cls in KNOWN_SOURCES:
            out += [(nid, k) for k in KNOWN_SOURCES[cls]]
    return out


def _api_new_id(api: dict, prefix: str) -> str:
    last = [int(k.rsplit(":", 1)[-1]) for k in api if k.rsplit(":", 1)[-1].isdigit()]
    return f"{prefix}{max(last, default=0) + 1}"


def _api_shard(api: dict, node_io) -> tuple:
    added = []
    already = [Change("", nid, node["class_type"], _label({"widgets_values": list(node["inputs"].values())},
                                                          (node.get("_meta") or {}).get("title")), nid)
               for nid, node in api.items() if node["class_type"] in OWN_LOADERS]
    for nid, slot in _api_sources(api, node_io):
        users = api_links(api, [nid, slot])
        shards = [u for u, _ in users if api[u]["class_type"] == SHARD_NODE]
        label = _label({"widgets_values": list(api[nid]["inputs"].values())}, (api[nid].get("_meta") or {}).get("title"))
        if shards:
            already.append(Change("", nid, api[nid]["class_type"], label, shards[0]))
            continue
        if not users:
            continue
        new = _api_new_id(api, nid.rsplit(":", 1)[0] + ":" if ":" in nid else "")
        for user, name in users:
            api[user]["inputs"][name] = [new, 0]
        api[new] = {"inputs": {"model": [nid, slot], **SHARD_WIDGETS}, "class_type": SHARD_NODE,
                    "_meta": {"title": SHARD_TITLE}}
        added.append(Change("", nid, api[nid]["class_type"], label, new))
    return added, already


def _api_unshard(api: dict) -> list:
    removed = []
    for sid in [k for k, v in api.items() if v["class_type"] == SHARD_NODE]:
        source = api[sid]["inputs"].get("model")
        if not (isinstance(source, list) and len(source) == 2):
            continue
        for user, name in api_links(api, [sid, 0]):
            api[user]["inputs"][name] = list(source)
        del api[sid]
        src = api.get(str(source[0]), {})
        label = _label({"widgets_values": list(src.get("inputs", {}).values())}, (src.get("_meta") or {}).get("title"))
        removed.append(Change("", source[0], src.get("class_type", "?"), label, sid))
    return removed


# ----------------------------------------------------------------------------- public
def shard_workflow(workflow: dict, node_io=None) -> ShardResult:
    """A copy of ``workflow`` (UI or API format) with a Shard node after every diffusion-model
    source (see the module doc). ``node_io(class_type) -> (input types, output types) | None``
    tells the API format about classes not in ``KNOWN_SOURCES``. Nothing to shard is not an
    error: the result has ``added == []`` and says why in ``reason``."""
    fmt = workflow_format(workflow)
    wf = copy.deepcopy(workflow)
    added, already = _ui_shard(wf) if fmt == "ui" else _api_shard(wf, node_io)
    reason = None
    if not added and already:
        reason = (f"already sharded: {len(already)} diffusion model{'s' if len(already) > 1 else ''} "
                  f"go{'' if len(already) > 1 else 'es'} through a Shard node or ShardDiT's own loader ("
                  + ", ".join(c.label for c in already) + ")")
    elif not added:
        reason = ("nothing to shard: no diffusion-model loader (a node with a MODEL output and no MODEL input, "
                  "such as Load Diffusion Model or Load Checkpoint) feeds anything in this workflow")
    return ShardResult(wf, fmt, added, already, reason, _message(added, already, "added") or reason)


def unshard_workflow(workflow: dict) -> ShardResult:
    """A copy of ``workflow`` without its Shard nodes: each one's users read its input again; what
    the transform moved to make room moves back."""
    fmt = workflow_format(workflow)
    wf = copy.deepcopy(workflow)
    removed = _ui_unshard(wf) if fmt == "ui" else _api_unshard(wf)
    reason = None if removed else "nothing to unshard: no Shard DiT Blocks (ShardDiT) node in this workflow"
    return ShardResult(wf, fmt, removed, [], reason, _message(removed, [], "removed") or reason)
