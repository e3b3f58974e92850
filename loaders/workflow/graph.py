"""Reading and editing the two workflow formats ComfyUI uses.

- UI format (what the frontend saves): ``nodes`` and ``links`` at the top, and one more
  ``{nodes, links, groups}`` per subgraph in ``definitions.subgraphs``; a node whose ``type`` is a
  subgraph's id is an instance of it. Top-level links are lists
  ``[id, origin, origin_slot, target, target_slot, type]``, subgraph links are dicts with those keys.
- API format (what ``POST /prompt`` takes): ``{id: {"class_type", "inputs"}}``, a link being an
  input value ``[source id, output slot]``.
"""
from __future__ import annotations
from ...parallel.errors import InputError

LINK_KEYS = ("id", "origin_id", "origin_slot", "target_id", "target_slot", "type")


class WorkflowError(InputError):
    """The data is not a ComfyUI workflow in either format."""


def workflow_format(workflow) -> str:
    """``"ui"`` or ``"api"``; raises WorkflowError naming what was found instead."""
    if isinstance(workflow, dict) and isinstance(workflow.get("nodes"), list) and isinstance(workflow.get("links"), list):
        return "ui"
    if isinstance(workflow, dict) and workflow and all(
            isinstance(v, dict) and isinstance(v.get("class_type"), str) and isinstance(v.get("inputs"), dict)
            for v in workflow.values()):
        return "api"
    if isinstance(workflow, dict) and isinstance(workflow.get("prompt"), dict):
        return workflow_format(workflow["prompt"])
    if not isinstance(workflow, dict):
        what = f"a JSON {type(workflow).__name__}"
    else:
        what = f"an object with keys {sorted(workflow)[:6]}" if workflow else "an empty object"
    raise WorkflowError(f"not a ComfyUI workflow: found {what}; expected a UI workflow (\"nodes\" and \"links\", as "
                        f"saved by ComfyUI's Save) or an API prompt ({{id: {{\"class_type\", \"inputs\"}}}}, as saved "
                        f"by Export (API))")


def graphs(ui: dict) -> list:
    """The top-level graph and every subgraph definition."""
    return [ui, *((ui.get("definitions") or {}).get("subgraphs") or [])]


def graph_name(ui: dict, graph: dict) -> str:
    return "" if graph is ui else str(graph.get("name") or graph.get("id"))


def subgraph_ids(ui: dict) -> set:
    return {g.get("id") for g in graphs(ui)[1:]}


def as_dict(link) -> dict:
    return dict(link) if isinstance(link, dict) else dict(zip(LINK_KEYS, link))


def find_link(graph: dict, link_id) -> int:
    for i, link in enumerate(graph["links"]):
        if as_dict(link)["id"] == link_id:
            return i
    raise KeyError(f"link {link_id} not in graph")


def set_origin(graph: dict, link_id, origin_id, origin_slot) -> None:
    link = graph["links"][find_link(graph, link_id)]
    if isinstance(link, list):
        link[1], link[2] = origin_id, origin_slot
    else:
        link["origin_id"], link["origin_slot"] = origin_id, origin_slot


def add_link(graph: dict, link: dict, top: bool) -> None:
    """Append ``link`` in the graph's own form (lists at the top level, dicts in subgraphs, unless
    the graph already holds the other form)."""
    as_list = isinstance(graph["links"][0], list) if graph["links"] else top
    graph["links"].append([link[k] for k in LINK_KEYS] if as_list else {k: link[k] for k in LINK_KEYS})


def remove_link(graph: dict, link_id) -> None:
    del graph["links"][find_link(graph, link_id)]


def max_ids(ui: dict) -> tuple:
    """``(largest node id, largest link id)`` over the whole workflow and its saved counters."""
    state = ui.get("state") or {}
    nodes = [n["id"] for g in graphs(ui) for n in g["nodes"] if isinstance(n.get("id"), int)]
    links = [as_dict(k)["id"] for g in graphs(ui) for k in g["links"]]
    return (max([0, ui.get("last_node_id") or 0, state.get("lastNodeId") or 0, *nodes]),
            max([0, ui.get("last_link_id") or 0, state.get("lastLinkId") or 0, *links]))


def api_links(api: dict, ref: list) -> list:
    """``[(node id, input name)]`` whose input is the link ``ref`` (``[source id, slot]``)."""
    return [(nid, name) for nid, node in api.items() for name, value in node["inputs"].items()
            if isinstance(value, list) and len(value) == 2 and str(value[0]) == str(ref[0]) and value[1] == ref[1]]
