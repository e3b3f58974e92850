"""What the template browser lists (``loaders/workflow/template_category.py``), without ComfyUI:
the pack's own workflows a ComfyUI lacks nodes for are left out (read from each file, subgraphs
included), the ShardDiT category is absent without a templates package. The routes that serve it
inside ComfyUI are tested in test_workflow_routes_comfy.py."""
import json

import pytest

from sharddit.loaders.workflow import template_category as tc
from sharddit.loaders.workflow import templates

pytestmark = pytest.mark.no_blas


def _ui(*types, inner=()):
    """A UI workflow with nodes of ``types`` at the top and ``inner`` inside one subgraph."""
    nodes = [{"id": i + 1, "type": t} for i, t in enumerate(types)]
    sub = {"id": "5b1e0c3a-0000-4000-8000-000000000001", "nodes": [{"id": 1, "type": t} for t in inner], "links": []}
    if inner:
        nodes.append({"id": 99, "type": sub["id"]})
    return {"nodes": nodes, "links": [], "definitions": {"subgraphs": [sub] if inner else []}}


@pytest.fixture
def pack(tmp_path):
    """A pack folder ``mypack`` with three workflows: core nodes only, a 2026 node at the top, a
    2026 node inside a subgraph (plus notes and a reroute, which need no server class)."""
    folder = tmp_path / "mypack" / "workflows"
    folder.mkdir(parents=True)
    files = {"plain": _ui("UNETLoader", "KSampler", "Note", "MarkdownNote", "Reroute"),
             "new_top": _ui("UNETLoader", "NodeOf2026"),
             "new_inside": _ui("SaveVideo", inner=("UNETLoader", "NodeOf2026", "PrimitiveNode"))}
    for name, ui in files.items():
        (folder / f"{name}.json").write_text(json.dumps(ui))
    return folder.parent


def test_missing_node_types_reads_subgraphs_and_skips_frontend_nodes():
    ui = _ui("UNETLoader", "Note", inner=("NodeOf2026", "Reroute", "PrimitiveNode"))
    assert tc.missing_node_types(ui, {"UNETLoader"}) == ["NodeOf2026"]
    assert tc.missing_node_types(ui, {"UNETLoader", "NodeOf2026"}) == []


def test_listing_leaves_out_the_pack_workflows_this_comfyui_cannot_load(pack, monkeypatch):
    monkeypatch.setattr(templates, "video_templates", lambda: {})   # no templates package
    core = {"mypack": ["plain", "new_top", "new_inside"], "otherpack": ["x"]}
    old = tc.filter_listing(core, {"UNETLoader", "KSampler", "SaveVideo"}, pack_dir=pack)
    assert old == {"mypack": ["plain"], "otherpack": ["x"]}
    new = tc.filter_listing(core, {"UNETLoader", "KSampler", "SaveVideo", "NodeOf2026"}, pack_dir=pack)
    assert new == core
    assert "mypack" not in tc.filter_listing({"mypack": ["new_top"]}, {"UNETLoader"}, pack_dir=pack)
    assert core["mypack"] == ["plain", "new_top", "new_inside"], "the answer it was given was changed"


def test_no_shardit_category_without_a_templates_package(monkeypatch):
    monkeypatch.setattr(templates, "video_templates", lambda: {})
    listing = tc.filter_listing({}, {"UNETLoader"})
    assert tc.CATEGORY not in listing and tc.category_names({"UNETLoader"}) == []


def test_every_shipped_workflow_is_listed_where_its_nodes_exist(monkeypatch):
    """The repo's own workflows: each is listed when the ComfyUI has its node types, and left out
    when one of them is missing."""
    monkeypatch.setattr(templates, "video_templates", lambda: {})
    names = sorted(p.stem for p in (tc.PACK_DIR / "workflows").glob("*.json"))
    assert names
    types = {name: set(tc.missing_node_types(json.loads((tc.PACK_DIR / "workflows" / f"{name}.json").read_text()), ()))
             for name in names}
    everything = set().union(*types.values())
    listing = {tc.PACK_DIR.name: names}
    assert tc.filter_listing(listing, everything) == listing
    for name in names:
        lacking = everything - {sorted(types[name])[0]}
        assert name not in tc.filter_listing(listing, lacking).get(tc.PACK_DIR.name, []), name
