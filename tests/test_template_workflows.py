"""The sharded core templates (workflows/*_sharddit.json, tests/build_template_workflows.py), pure.

No ComfyUI: the files' own structure. That they equal the generator's output from the installed
templates, and that ComfyUI 0.29 validates their API twins, is test_template_workflows_comfy.py;
that the 0.29 frontend opens them cleanly and queues exactly the API twins, test_browser_ui.py.
"""
import json

import pytest

import build_template_workflows as btw
import workflow_tools as wt
from harness import templates as tpl
from sharddit.loaders.simulator import presets
from sharddit.parallel.placement.devices import parse_devices

pytestmark = pytest.mark.no_blas  # no BLAS arithmetic: left out of the other-MKL_CBWR rerun in .ci/run

SPECS = {t.name: t for t in btw.TEMPLATES}
PAIRS = wt.workflow_pairs(kind="template")
IDS = [name for name, _, _ in PAIRS]


def _load(name):
    _, ui, api = next(p for p in PAIRS if p[0] == name)
    return wt.load(ui), wt.load(api)


def test_the_four_templates_are_shipped_with_api_twins_and_thumbnails():
    assert sorted(IDS) == sorted(SPECS), "workflows/*_sharddit.json differ from build_template_workflows.TEMPLATES"
    for name, ui, api in PAIRS:
        assert api.is_file(), f"{name} has no API twin"
        text = ui.read_text(encoding="utf-8")
        assert text == json.dumps(json.loads(text), indent=2, ensure_ascii=False) + "\n", f"{ui.name}: keep indent 2"
        thumb = ui.with_suffix(".jpg").read_bytes()
        assert thumb[:3] == b"\xff\xd8\xff" and 5_000 < len(thumb) < 400_000, f"{name}.jpg: not a JPEG of sensible size"


@pytest.mark.parametrize("name", IDS)
def test_a_shard_node_sits_after_every_active_dit_loader(name):
    """UI: every active loader's MODEL goes to one Shard node only; API: each Shard node reads a
    loader, nothing else reads a loader's MODEL, and placement is ``auto``."""
    ui, api = _load(name)
    for graph in tpl.graphs(ui):
        nodes = {n["id"]: n for n in graph["nodes"]}
        links = {tpl._link(k)["id"]: tpl._link(k) for k in graph["links"]}
        for loader in [n for n in graph["nodes"] if n["type"] in tpl.DIT_LOADERS and n.get("mode", 0) == 0]:
            out = loader["outputs"][tpl.DIT_LOADERS[loader["type"]]]["links"]
            assert len(out) == 1 and nodes[links[out[0]]["target_id"]]["type"] == tpl.SHARD_NODE, loader["id"]
    shards = tpl.api_ids(api, tpl.SHARD_NODE)
    loaders = {i for i, v in api.items() if v["class_type"] in tpl.DIT_LOADERS}
    assert shards and {api[s]["inputs"]["model"][0] for s in shards} == loaders
    for node_id, node in api.items():
        for key, value in node["inputs"].items():
            if isinstance(value, list) and value[0] in loaders and value[1] == tpl.DIT_LOADERS[api[value[0]]["class_type"]]:
                assert node["class_type"] == tpl.SHARD_NODE, f"{node_id}.{key} reads the loader past the Shard node"
    for s in shards:
        inputs = api[s]["inputs"]
        assert (inputs["devices"], inputs["parallel"], inputs["reserve_vram_gb"]) == ("auto", "auto", 1.0)
        parse_devices(inputs["devices"])


@pytest.mark.parametrize("name", IDS)
def test_shard_nodes_overlap_nothing_in_their_graph(name):
    ui, _ = _load(name)
    table = wt.node_table()
    for graph in tpl.graphs(ui):
        boxes = {n["id"]: wt.node_box(n, table) for n in graph["nodes"]}
        for shard in [n for n in graph["nodes"] if n["type"] == tpl.SHARD_NODE]:
            a = boxes[shard["id"]]
            assert shard["size"][1] >= wt.min_node_height(table[tpl.SHARD_NODE])
            for other, b in boxes.items():
                assert other == shard["id"] or not (a[0] < b[0] + b[2] and b[0] < a[0] + a[2] and a[1] < b[1] + b[3]
                                                    and b[1] < a[1] + a[3]), f"Shard node {shard['id']} overlaps {other}"
            group = [g for g in graph.get("groups", []) if g["bounding"][1] <= a[1] <= g["bounding"][1] + g["bounding"][3]
                     and g["bounding"][0] <= a[0] <= g["bounding"][0] + g["bounding"][2]]
            assert all(a[1] + a[3] <= g["bounding"][1] + g["bounding"][3] for g in group), "Shard node sticks out of its group"


@pytest.mark.parametrize("name", IDS)
def test_plan_node_is_muted_and_set_to_the_template(name):
    """The muted Placement Plan: the template's model (its preset, or the nearest one while the
    preset is not in this ShardDiT), size, frames, dtype and cfg; widgets in the schema's order."""
    ui, api = _load(name)
    spec = SPECS[name]
    plans = [n for n in ui["nodes"] if n["type"] == "ShardDiTPlan"]
    assert len(plans) == 1 and plans[0]["mode"] == 2 and not tpl.api_ids(api, "ShardDiTPlan")
    widgets = [i.name for i in wt.sharddit_schemas()["ShardDiTPlan"].widgets]
    values = dict(zip(widgets, plans[0]["widgets_values"]))
    assert len(values) == len(plans[0]["widgets_values"]) == len(widgets)
    assert values["model"] == btw.preset_for(spec, presets.preset_names()) and values["model"] in presets.preset_names()
    assert (values["width"], values["height"], values["frames"], values["dtype"], values["cfg"]) == \
        (spec.width, spec.height, spec.frames, spec.dtype, spec.cfg)
    assert values["devices"] == values["parallel"] == values["batch"] == "auto"


@pytest.mark.parametrize("name", IDS)
def test_sharddit_column_has_the_will_it_fit_note_and_overlaps_nothing(name):
    ui, _ = _load(name)
    table = wt.node_table()
    note = next(n for n in ui["nodes"] if n["type"] == "MarkdownNote" and n.get("title") == "ShardDiT")
    assert "**Will it fit?**" in note["widgets_values"][0] and "Ctrl+M" in note["widgets_values"][0]
    group = next(g for g in ui["groups"] if g["title"] == btw.GROUP_TITLE)
    gx, gy, gw, gh = group["bounding"]
    ours = [n for n in ui["nodes"] if n is note or n["type"] == "ShardDiTPlan"]
    for n in ours:
        x, y, w, h = wt.node_box(n, table)
        assert gx <= x and x + w <= gx + gw and gy <= y and y + h <= gy + gh, f"node {n['id']} outside its group"
    for n in ui["nodes"]:
        x, y, w, h = wt.node_box(n, table)
        assert n in ours or x + w <= gx or x >= gx + gw or y + h <= gy or y >= gy + gh, f"node {n['id']} under the ShardDiT column"
    for g in ui["groups"]:
        x, y, w, h = g["bounding"]
        assert g is group or x + w <= gx or x >= gx + gw or y + h <= gy or y >= gy + gh, f"group {g['title']!r} under the ShardDiT column"


def test_readme_shows_every_workflow_with_its_thumbnail():
    """README's Workflows section: each UI workflow (both kinds) by name, with its JPEG."""
    text = (wt.REPO / "README.md").read_text()
    for name, ui, _ in wt.workflow_pairs(kind="all"):
        assert f'<img src="workflows/{name}.jpg"' in text and f"`{name}`" in text, name
        assert ui.with_suffix(".jpg").is_file(), name
