"""Core ComfyUI's workflow templates, sharded: read, insert ShardDiT's Shard node, convert, run.

ComfyUI 0.29 installs its templates as the ``comfyui_workflow_templates_json`` package (folder
``templates/``); 0.3.64 has no such package and none of the 2026 models, so ``template_path``
returns None there and the tests skip. The templates are UI-format workflows with subgraphs
(``definitions.subgraphs``; a node whose ``type`` is a subgraph's id is an instance of it).

- The Shard node is inserted by the product's transform (``loaders/workflow/shard_transform.py``
  ``shard_workflow``), never here.
- ``ui_to_api(ui, widget_inputs)``: the API prompt the frontend would queue. Subgraphs are
  flattened the way the frontend does it (inner node ``71`` of instance ``128`` becomes
  ``"128:71"``); a subgraph input the instance leaves unlinked keeps the inner widget's value.
  Widget names come from the real node classes (``comfy_widget_inputs``), not a checked-in
  table: the templates use 2026 nodes (``ComfySwitchNode``, ``ComfyMathExpression``,
  ``PrimitiveInt``) that the shipped workflows' table does not list.
- ``run_prompt(api, node_ids)``: runs the prompt in this process through ComfyUI's own
  ``validate_prompt`` and ``PromptExecutor`` (no server: seconds, not a subprocess start) and
  returns the outputs of the given nodes.
"""
from __future__ import annotations

import asyncio
import dataclasses
import json
import types
from pathlib import Path

TEMPLATES_PACKAGE = "comfyui_workflow_templates_json"
# loader type -> its MODEL output slot: read only by the old sharded-template workflows' tests
# (tests/test_template_workflows.py), removed with them (issue 29 item 1)
DIT_LOADERS = {"UNETLoader": 0, "CheckpointLoaderSimple": 0}
SHARD_NODE = "ShardDiTShardModel"
FRONTEND_ONLY = {"Note", "MarkdownNote"}
# Frontend nodes never sent: a reroute passes its link on, a legacy PrimitiveNode's value is
# already in the widget it feeds.
VIRTUAL = {"Reroute", "PrimitiveNode"}
CONTROL_VALUES = {"fixed", "increment", "decrement", "randomize"}
WIDGET_TYPES = {"INT", "FLOAT", "STRING", "BOOLEAN", "COMBO", "COLOR"}
SUBGRAPH_IN, SUBGRAPH_OUT = -10, -20
FRONTEND_WIDGET, REST = "<frontend widget>", "<frontend widgets>"   # saved in widgets_values, never sent   # the ids of a subgraph's input and output nodes in its links


def template_path(name: str) -> Path | None:
    """The installed template ``name`` (e.g. ``video_wan2_2_14B_t2v.json``), None when the
    templates package is not installed (ComfyUI before the 2026 templates)."""
    try:
        from importlib import resources

        root = resources.files(TEMPLATES_PACKAGE) / "templates"
    except ModuleNotFoundError:
        return None
    path = Path(str(root)) / name
    return path if path.is_file() else None


def load_template(name: str) -> dict:
    path = template_path(name)
    if path is None:
        raise FileNotFoundError(f"template {name!r} not in the installed {TEMPLATES_PACKAGE} package")
    return json.loads(path.read_text())


# ----------------------------------------------------------------------------- graph access
def graphs(ui: dict) -> list:
    """The top-level graph and every subgraph definition (each has ``nodes`` and ``links``)."""
    return [ui, *ui.get("definitions", {}).get("subgraphs", [])]


def _link(link) -> dict:
    """A link as a dict: top-level links are lists, subgraph links dicts."""
    if isinstance(link, dict):
        return link
    keys = ("id", "origin_id", "origin_slot", "target_id", "target_slot", "type")
    return dict(zip(keys, link))


def model_files(ui: dict) -> list:
    """``[(folder, file name)]`` the template's loaders list in ``properties.models`` (what the
    frontend offers to download), over all subgraphs."""
    return sorted({(m["directory"], m["name"]) for g in graphs(ui) for n in g["nodes"]
                   for m in n.get("properties", {}).get("models", []) or []})


def node_types(ui: dict) -> set:
    """The node classes a workflow needs from the server (no subgraph instances, no frontend-only nodes)."""
    subgraphs = {g["id"] for g in graphs(ui)[1:]}
    return {n["type"] for g in graphs(ui) for n in g["nodes"]} - subgraphs - FRONTEND_ONLY - VIRTUAL


def nodes_of(ui: dict, node_type: str) -> list:
    return [n for g in graphs(ui) for n in g["nodes"] if n["type"] == node_type]


# ----------------------------------------------------------------------------- UI -> API
def _widgets_of(input_types: dict, prefix: str = "") -> list:
    """``[(name, control_after_generate, dynamic options)]`` in the frontend's order (required,
    then optional); a dynamic combo's options map each key to its own widgets (``"combo.sub"``)."""
    out = []
    for section in ("required", "optional"):
        for name, spec in input_types.get(section, {}).items():
            typ, opts = spec[0], (spec[1] if len(spec) > 1 and isinstance(spec[1], dict) else {})
            if str(typ) == "COMFY_DYNAMICCOMBO_V3":
                options = {str(getattr(o["key"], "value", o["key"])): _widgets_of(o["inputs"], f"{prefix}{name}.")
                           for o in opts["options"]}
                out.append((prefix + name, False, options))
            elif (isinstance(typ, (list, tuple)) or str(typ) in WIDGET_TYPES or opts.get("widgetType") in WIDGET_TYPES) \
                    and not opts.get("forceInput"):   # widgetType: a multi-type input shown as that widget
                out.append((prefix + name, bool(opts.get("control_after_generate")), None))
                if (isinstance(typ, (list, tuple)) or str(typ) == "COMBO") and any(
                        k.endswith("_upload") and v for k, v in opts.items()):   # LoadImage's, LoadVideo's file combo
                    out.append((FRONTEND_WIDGET, False, None))   # the upload button saves a value too
    return out


def comfy_widget_inputs(mappings) -> callable:
    """``class_type -> [(name, control_after_generate, dynamic options)]``: a node's widgets,
    read from the real ``INPUT_TYPES``. A V3 class that accepts any input (``CustomCombo``) or
    has a widget the frontend draws itself (``widgetType`` ``PAINTER``) ends with ``REST``: the
    values after its own widgets are the frontend's, not sent."""
    def widgets(class_type):
        cls = mappings[class_type]
        spec = cls.INPUT_TYPES()
        custom = any(len(v) > 1 and isinstance(v[1], dict) and v[1].get("widgetType") not in (None, *WIDGET_TYPES)
                     for section in ("required", "optional") for v in (spec.get(section) or {}).values())
        rest = [(REST, False, None)] if custom or getattr(cls, "ACCEPT_ALL_INPUTS", False) is True else []
        return _widgets_of(spec) + rest
    return widgets


@dataclasses.dataclass(frozen=True)
class Literal:
    """A value, not a link: an unlinked subgraph input promoted to a widget on its instance."""
    value: object


def _promoted(sub: dict, slot: int, widgets, skip: set):
    """The value the frontend sends for subgraph input ``slot`` when its instance leaves it
    unlinked: the inner widget it is promoted from (``proxyWidgets``), as that widget holds it;
    None when no inner widget takes the input (then its targets get nothing)."""
    nodes = {n["id"]: n for n in sub["nodes"]}
    for link in map(_link, sub["links"]):
        node = nodes.get(link["target_id"]) if link["origin_id"] == SUBGRAPH_IN and link["origin_slot"] == slot else None
        if node is None or node["type"] in skip:   # a nested instance, a frontend-only node
            continue
        inp = node["inputs"][link["target_slot"]]
        if inp.get("widget"):
            values = widget_values(node, widgets(node["type"]))
            if inp["widget"]["name"] in values:
                return Literal(values[inp["widget"]["name"]])
    return None


class _Scope:
    """One graph being flattened: ``prefix`` for its node ids, ``inputs`` the resolved source
    (``[id, slot]`` or None) of each subgraph input slot."""

    def __init__(self, ui: dict, graph: dict, prefix: str = "", inputs: dict | None = None, parent=None):
        self.ui, self.graph, self.prefix, self.inputs, self.parent = ui, graph, prefix, inputs or {}, parent
        self.nodes = {n["id"]: n for n in graph["nodes"]}
        self.links = {_link(k)["id"]: _link(k) for k in graph["links"]}
        self.defs = {g["id"]: g for g in ui.get("definitions", {}).get("subgraphs", [])}

    def child(self, instance: dict) -> _Scope:
        sub = self.defs[instance["type"]]
        by_name = {i["name"]: i.get("link") for i in instance.get("inputs", [])}
        inputs = {}
        for k, sin in enumerate(sub["inputs"]):
            link = by_name.get(sin["name"])
            inputs[k] = _promoted(sub, k, self.widgets, set(self.defs) | FRONTEND_ONLY | VIRTUAL) if link is None else self.source(self.links[link])
        scope = _Scope(self.ui, sub, f"{self.prefix}{instance['id']}:", inputs, self)
        scope.widgets = self.widgets
        return scope

    def source(self, link: dict):
        """The API reference ``[node id, slot]`` a link carries, through subgraph boundaries,
        reroutes and bypassed nodes; None for an unlinked subgraph input or a legacy PrimitiveNode
        (the target keeps its widget value)."""
        origin, slot = link["origin_id"], link["origin_slot"]
        if origin == SUBGRAPH_IN:
            return self.inputs.get(slot)
        node = self.nodes[origin]
        if node["type"] == "PrimitiveNode":   # the target's own widget already holds its value
            return None
        if node["type"] in self.defs and node.get("mode", 0) != 4:   # a bypassed instance passes its inputs on
            child = self.child(node)
            inner = next(k for k in child.links.values() if k["target_id"] == SUBGRAPH_OUT and k["target_slot"] == slot)
            return child.source(inner)
        if node["type"] == "Reroute" or node.get("mode", 0) == 4:
            typ = node["outputs"][slot]["type"]
            inp = next((i for i in node.get("inputs", []) if i.get("link") is not None
                        and (node["type"] == "Reroute" or i["type"] == typ)), None)
            return None if inp is None else self.source(self.links[inp["link"]])
        return [f"{self.prefix}{node['id']}", slot]

    def emit(self, api: dict, widgets) -> None:
        for node in self.graph["nodes"]:
            if node["type"] in FRONTEND_ONLY | VIRTUAL or node.get("mode", 0) != 0:
                continue
            if node["type"] in self.defs:
                self.child(node).emit(api, widgets)
                continue
            inputs = widget_values(node, widgets(node["type"]))
            for inp in node.get("inputs", []):
                src = None if inp.get("link") is None else self.source(self.links[inp["link"]])
                if isinstance(src, Literal):   # a widget input keeps its own value, as before
                    inputs.setdefault(inp["name"], src.value)
                elif src is not None:
                    inputs[inp["name"]] = src
            entry = {"inputs": inputs, "class_type": node["type"]}
            if node.get("title"):
                entry["_meta"] = {"title": node["title"]}
            api[f"{self.prefix}{node['id']}"] = entry


def widget_values(node: dict, widgets: list) -> dict:
    """A UI node's ``widgets_values`` mapped onto widget names: the frontend's
    control_after_generate value after a seed-like INT is dropped, a dynamic combo's value is
    followed by the widgets of the option it chose. Trailing ``None``s are display-only widgets
    (``PreviewAny``'s text boxes)."""
    if isinstance(node.get("widgets_values"), dict):   # some nodes save a name -> value dict
        return dict(node["widgets_values"])
    values = list(node.get("widgets_values") or [])
    out = {}
    pending = list(widgets)
    while pending and values:
        name, control, options = pending.pop(0)
        if name == REST:
            values = []
            break
        if name == FRONTEND_WIDGET:
            values.pop(0)
            continue
        out[name] = values.pop(0)
        if options is not None:
            pending[:0] = options.get(str(out[name]), [])
        if values and (control or type(out[name]) is int) and values[0] in CONTROL_VALUES:
            values.pop(0)
    if any(v is not None for v in values):
        raise ValueError(f"node {node['id']} ({node['type']}): {len(values)} widgets_values left over "
                         f"after {list(out)}: {values!r}")
    return out


def ui_to_api(ui: dict, widgets) -> dict:
    """The API prompt for a UI workflow with subgraphs (see the module doc); ``widgets`` is
    ``comfy_widget_inputs(NODE_CLASS_MAPPINGS)``."""
    api = {}
    scope = _Scope(ui, ui)
    scope.widgets = widgets
    scope.emit(api, widgets)
    return api


def api_ids(api: dict, class_type: str) -> list:
    return sorted(k for k, v in api.items() if v["class_type"] == class_type)


# ----------------------------------------------------------------------------- running
def validate(api: dict) -> tuple:
    """ComfyUI's own ``validate_prompt`` of the whole prompt: ``(ok, error, outputs, node_errors)``."""
    import execution

    return asyncio.run(execution.validate_prompt("sharddit-template", api, None))


def new_executor():
    """A ``PromptExecutor`` with ComfyUI's classic cache, as the server keeps one across prompts:
    run a second prompt through it and the nodes whose inputs did not change are not run again."""
    import execution

    server = types.SimpleNamespace(client_id=None, last_node_id=None, send_sync=lambda *a, **k: None,
                                   send_progress_text=lambda *a, **k: None)
    return execution.PromptExecutor(server, cache_type=execution.CacheType.CLASSIC,
                                    cache_args={"lru": 0, "ram": 0, "ram_inactive": 0})


def run_prompt(api: dict, outputs: list, executor=None) -> dict:
    """Run ``api`` in this process through ComfyUI's ``validate_prompt`` and ``PromptExecutor``
    (ComfyUI >= 0.29); ``{node id: that node's outputs} (one list per output slot, as ComfyUI caches them)`` for the ids in ``outputs``.

    The whole prompt is validated (every output node and what feeds it), but only ``outputs``
    and their inputs run: the tests compare latents, so the VAE decode and video save are skipped.
    ``executor`` (``new_executor()``) keeps the outputs of earlier prompts, as a server does;
    default a fresh one.

    Raises AssertionError with ComfyUI's own messages when validation or a node fails."""
    valid = validate(api)
    assert valid[0], f"ComfyUI rejected the prompt: {valid[1]} {json.dumps(valid[3], default=str)[:2000]}"
    executor = executor or new_executor()
    executor.execute(api, "sharddit-template", {}, list(outputs))
    errors = [m for m in executor.status_messages if m[0] == "execution_error"]
    assert executor.success and not errors, f"the prompt failed: {json.dumps(errors, default=str)[:3000]}"

    return cached_outputs(executor, outputs)


def cached_outputs(executor, node_ids) -> dict:
    """``{node id: its outputs}`` as ``executor``'s cache holds them after a run."""
    async def fetch():
        return {k: (await executor.caches.outputs.get(k)).outputs for k in node_ids}
    return asyncio.run(fetch())
