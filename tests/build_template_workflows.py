"""Writes the ShardDiT versions of ComfyUI's own 2026 video templates (issue 24 item 3).

People open core's templates (package ``comfyui_workflow_templates_json``, installed with ComfyUI
0.29), so the pack ships those same graphs, sharded, instead of graphs of its own: each
``workflows/<template>_sharddit.json`` is the installed template with

- a **Shard DiT Blocks (ShardDiT)** node (``devices`` auto, ``parallel`` auto) right after every
  active DiT loader, inside the subgraph where the loader is (``harness.templates.insert_shard``);
  the nodes below the loader in that graph move down to make room (``_make_room``), groups that
  span the loader grow, nothing else changes (notes, groups, subgraphs, values);
- a new left column at the top level: a ShardDiT note (what changed, *Will it fit?*) and a muted
  **Placement Plan (ShardDiT)** set to the template's model, size, frames, dtype and cfg;
- a view (``extra.ds``) that shows the whole top-level graph in a 1600x1000 window.

``workflows/api/<name>_api.json`` is its API form (``harness.templates.ui_to_api``: subgraphs
flattened as the frontend queues them, ids ``"<instance>:<inner>"``; the muted Plan node and the
notes are not sent).

Needs ComfyUI 0.29 (the templates package and the 2026 nodes' widget names)::

    COMFYUI_PATH=/path/to/ComfyUI python tests/build_template_workflows.py          # rewrite
    COMFYUI_PATH=/path/to/ComfyUI python tests/build_template_workflows.py --check  # exit 1 if stale

tests/test_template_workflows_comfy.py checks that the committed files equal this output.
"""
from __future__ import annotations

import json
import sys
import uuid
from dataclasses import dataclass
from pathlib import Path

TESTS = Path(__file__).resolve().parent
if str(TESTS) not in sys.path:
    sys.path.insert(0, str(TESTS))
from harness import templates as tpl  # noqa: E402
from workflow_tools import (TEMPLATE_SUFFIX, TITLE_H, WORKFLOWS_DIR, min_node_height, node_table,  # noqa: E402
                            write_or_check)

GAP = 30                     # between a loader and its Shard node, and between columns
COLUMN_W, NOTE_H, PLAN_H = 540, 320, 780
GROUP_TITLE = "ShardDiT: will it fit?"
GROUP_COLOR = "#3f789e"
# The saved view: the top-level graph inside a 1600x1000 window, centred, at most 80 %. The 0.29
# frontend's canvas fills the window under its side bar (59 px), its tabs (38 px) and the floating
# breadcrumb and Run bar (to y 85); the minimap sits over the bottom-right corner.
WINDOW = (70, 95, 1590, 990)    # x0, y0, x1, y1 in CSS pixels of the canvas
MAX_SCALE = 0.8


@dataclass(frozen=True)
class Template:
    """One core template and the Plan node's settings for it (the template's own values)."""
    template: str
    model: str                 # the plan preset for this model
    width: int
    height: int
    frames: int
    dtype: str
    cfg: float
    title: str
    extra: str = ""

    @property
    def name(self) -> str:
        return Path(self.template).stem + TEMPLATE_SUFFIX


TEMPLATES = [
    Template("video_wan2_2_14B_t2v.json", "wan2.2-t2v-a14b", 640, 640, 81, "fp8", 3.5,
             "Wan 2.2 14B text to video",
             "Both experts (high and low noise) get a Shard node; ComfyUI keeps one expert on the GPUs at a "
             "time. With the Lightning LoRA switched on (4 steps, cfg 1) only `sequence` makes a step faster "
             "than one GPU; `parallel` auto takes it where the cost model predicts a gain."),
    # 1280x704: the high-resolution stage's latent (the template's 1280x720 halved for the first stage,
    # 640x360 -> 20x11 latent cells of 32 px, upscaled x2 -> 40x22 = 1280x704); frames: duration
    # 5 s x 25 fps + 1 = 126, which EmptyLTXVLatentVideo rounds to 8k+1 = 121
    Template("video_ltx2_3_t2v.json", "ltx-2.3", 1280, 704, 121, "fp8", 1.0,
             "LTX-2.3 text to video",
             "LTX-2.3's checkpoint holds the DiT, the audio and video VAEs: the Shard node sits on Load "
             "Checkpoint's MODEL output, so both stages (low and high resolution) sample sharded."),
    Template("video_hunyuan_video_1.5_720p_t2v.json", "hunyuanvideo-1.5", 1280, 720, 121,
             "fp16", 6.0, "HunyuanVideo 1.5 720p text to video",
             "The 1080p super-resolution stage (bypassed; Ctrl+B to enable) loads its own model without a "
             "Shard node: add one after its Load Diffusion Model if it does not fit one GPU."),
    Template("video_kandinsky5_t2v.json", "kandinsky5-lite", 768, 512, 121, "bf16", 5.0,
             "Kandinsky 5 Lite text to video"),
]


def preset_for(t: Template, presets) -> str:
    if t.model not in presets:
        raise ValueError(f"{t.template}: plan preset {t.model!r} is not among ShardDiT's presets {sorted(presets)}")
    return t.model


# ----------------------------------------------------------------------------- the Shard nodes
def _bottom(node) -> float:
    return node["pos"][1] + node["size"][1]


def _make_room(graph: dict, line: float, delta: float) -> None:
    """Moves every node and group of ``graph`` that starts below ``line`` down by ``delta``; a
    group that spans the line grows by ``delta``. Relative positions below the line are kept."""
    for node in graph["nodes"]:
        if node["pos"][1] - TITLE_H >= line:
            node["pos"] = [node["pos"][0], node["pos"][1] + delta]
    for group in graph.get("groups", []):
        x, y, w, h = group["bounding"]
        if y >= line:
            group["bounding"] = [x, y + delta, w, h]
        elif y + h > line:
            group["bounding"] = [x, y, w, h + delta]


def place_shards(ui: dict, height: int) -> None:
    """Each Shard node right below its loader, as wide as it, the graph opened up to fit it."""
    for graph in tpl.graphs(ui):
        nodes = {n["id"]: n for n in graph["nodes"]}
        links = {tpl._link(k)["id"]: tpl._link(k) for k in graph["links"]}
        for shard in [n for n in graph["nodes"] if n["type"] == tpl.SHARD_NODE]:
            loader = nodes[links[shard["inputs"][0]["link"]]["origin_id"]]
            line = _bottom(loader) + GAP / 2
            shard["pos"], shard["size"] = [0, -1e9], [loader["size"][0], height]   # out of the way while moving
            _make_room(graph, line, TITLE_H + height + GAP)
            shard["pos"] = [loader["pos"][0], _bottom(loader) + GAP + TITLE_H]
            shard["properties"] = {"cnr_id": "sharddit", "Node name for S&R": tpl.SHARD_NODE}


# ----------------------------------------------------------------------------- the ShardDiT column
def note_text(t: Template, preset: str) -> str:
    plan = f"`{preset}`"
    lines = [f"## {t.title}, sharded (ShardDiT)", "",
             "ComfyUI's own template, unchanged but for one node: **Shard DiT Blocks (ShardDiT)** right after "
             "the diffusion model loader (open the subgraph to see it). `devices` auto spreads the model's "
             "blocks over your GPUs (the fewest that fit, from their free VRAM); `parallel` auto picks "
             "`blocks` or `sequence`. Needs ComfyUI 0.29 or newer.", ""]
    if t.extra:
        lines += [t.extra, ""]
    lines += ["**Will it fit?** Placement Plan (ShardDiT), below, is muted: select it, press Ctrl+M, then Run. "
              f"It draws your GPUs and where the model goes (a dry run: no weights needed), set to {plan} at "
              f"{t.width}×{t.height}, {t.frames} frames, {t.dtype}, cfg {t.cfg:g}. Imagined GPUs: devices "
              "`cuda:0=16GiB,cuda:1=16GiB`."]
    return "\n".join(lines)


def _extent(ui: dict) -> tuple:
    boxes = [g["bounding"] for g in ui.get("groups", [])] + [
        [n["pos"][0], n["pos"][1] - TITLE_H, n["size"][0], n["size"][1] + TITLE_H] for n in ui["nodes"]]
    return (min(b[0] for b in boxes), min(b[1] for b in boxes),
            max(b[0] + b[2] for b in boxes), max(b[1] + b[3] for b in boxes))


def add_plan_column(ui: dict, t: Template, preset: str, plan_widgets: list) -> None:
    """The ShardDiT note and the muted Plan node in a group left of the template's top level."""
    x0, y0, _, _ = _extent(ui)
    x, top = x0 - GAP - 10 - COLUMN_W, y0 + 80
    note_id, plan_id = ui["last_node_id"] + 1, ui["last_node_id"] + 2
    values = dict(devices="auto", model=preset, width=t.width, height=t.height, frames=t.frames, batch="auto",
                  dtype=t.dtype, reserve_vram_gb=1.0, parallel="auto", cfg=t.cfg, gpu="", link_gbps=0.0)
    ui["nodes"] += [
        {"id": note_id, "type": "MarkdownNote", "pos": [x, top], "size": [COLUMN_W, NOTE_H], "flags": {},
         "order": len(ui["nodes"]), "mode": 0, "inputs": [], "outputs": [], "title": "ShardDiT",
         "properties": {}, "widgets_values": [note_text(t, preset)], "color": "#432", "bgcolor": "#653"},
        {"id": plan_id, "type": "ShardDiTPlan", "pos": [x, top + NOTE_H + GAP + TITLE_H],
         "size": [COLUMN_W, PLAN_H], "flags": {}, "order": len(ui["nodes"]) + 1, "mode": 2,
         "title": "Placement Plan (ShardDiT) - un-mute to check", "inputs": [],
         "outputs": [{"name": "plan", "type": "STRING", "links": []}],
         "properties": {"cnr_id": "sharddit", "Node name for S&R": "ShardDiTPlan"},
         "widgets_values": [values[name] for name in plan_widgets]}]
    ui["last_node_id"] = plan_id
    gid = max([g.get("id", 0) for g in ui.get("groups", [])], default=0) + 1
    ui.setdefault("groups", []).append(
        {"id": gid, "title": GROUP_TITLE, "color": GROUP_COLOR, "font_size": 24, "flags": {},
         "bounding": [x - 10, top - TITLE_H - 70, COLUMN_W + 20, NOTE_H + GAP + TITLE_H + PLAN_H + TITLE_H + 80]})


def fit_view(ui: dict) -> dict:
    """Zoom and offset that show the whole top level inside ``WINDOW``, centred."""
    x0, y0, x1, y1 = _extent(ui)
    y0 -= 24   # the source badge above a title bar
    wx0, wy0, wx1, wy1 = WINDOW
    scale = round(min(MAX_SCALE, (wx1 - wx0) / (x1 - x0), (wy1 - wy0) / (y1 - y0)), 3)
    ox = (wx0 + (wx1 - wx0 - (x1 - x0) * scale) / 2) / scale - x0
    oy = (wy0 + (wy1 - wy0 - (y1 - y0) * scale) / 2) / scale - y0
    return {"scale": scale, "offset": [round(ox, 1), round(oy, 1)]}


# ----------------------------------------------------------------------------- rendering
def with_defaults(api: dict, mappings) -> dict:
    """Every widget a node has, as the frontend queues it: a template saved by an older frontend
    lacks widgets added since (0.29's CreateVideo ``bit_depth``); the frontend creates them with
    their default and sends them."""
    for node in api.values():
        types = mappings[node["class_type"]].INPUT_TYPES()
        for section in ("required", "optional"):
            for name, spec in types.get(section, {}).items():
                opts = spec[1] if len(spec) > 1 and isinstance(spec[1], dict) else {}
                if name in node["inputs"] or opts.get("forceInput") or "default" not in opts:
                    continue
                if isinstance(spec[0], (list, tuple)) or str(spec[0]) in tpl.WIDGET_TYPES:
                    node["inputs"][name] = opts["default"]
    return api


def build(t: Template, widgets, presets, mappings) -> tuple:
    """``(ui, api)`` of one template's ShardDiT workflow."""
    table = node_table()
    preset = preset_for(t, presets)
    ui = tpl.insert_shard(tpl.load_template(t.template), devices="auto", parallel="auto", reserve_vram_gb=1.0)
    place_shards(ui, min_node_height(table[tpl.SHARD_NODE]))
    add_plan_column(ui, t, preset, [i.name for i in table["ShardDiTPlan"].widgets])
    ui["id"] = str(uuid.uuid5(uuid.NAMESPACE_URL, f"sharddit/workflows/{t.name}"))
    ui["extra"]["ds"] = fit_view(ui)
    return ui, with_defaults(tpl.ui_to_api(ui, widgets), mappings)


def dumps(obj) -> str:
    return json.dumps(obj, indent=2, ensure_ascii=False) + "\n"


def render_all(mappings, presets, out_dir: Path = WORKFLOWS_DIR) -> dict:
    """``{path: text}`` of every template workflow (UI and API); ``mappings`` is ComfyUI's
    ``NODE_CLASS_MAPPINGS`` (with this pack), ``presets`` the Plan node's model names."""
    widgets = tpl.comfy_widget_inputs(mappings)
    files = {}
    for t in TEMPLATES:
        ui, api = build(t, widgets, presets, mappings)
        files[out_dir / f"{t.name}.json"] = dumps(ui)
        files[out_dir / "api" / f"{t.name}_api.json"] = dumps(api)
    return files


def main(argv) -> int:
    from harness.comfy_env import load_comfy
    from harness.pack import import_pack

    import_pack()
    env = load_comfy()
    from sharddit.loaders.simulator import presets

    return write_or_check(render_all(env.nodes.NODE_CLASS_MAPPINGS, presets.preset_names()), argv, "template workflows")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
