"""The shard transform (loaders/workflow/shard_transform.py, layout.py) on small workflows built here, no
ComfyUI (the workflows: harness.shard_workflows): where the Shard node goes (UI with a subgraph, groups, a Note, a Reroute, a bypassed
loader, an unused loader, a ShardDiT loader, two consumers, native reroutes; API with flattened
subgraph ids), what is left alone, idempotence, the exact inverse, the reasons when nothing
changes, the errors for data that is not a workflow, the layout (nodes below move, groups grow,
nothing newly overlaps). The command line: tests/test_shard_transform_cli.py.
"""
from __future__ import annotations

import copy

import pytest
from harness.shard_workflows import api_workflow, node, ui_workflow
from sharddit.loaders.workflow import layout
from sharddit.loaders.workflow.shard_transform import SHARD_NODE, shard_workflow, unshard_workflow
from sharddit.loaders.workflow.graph import WorkflowError

pytestmark = pytest.mark.no_blas


def _graphs(ui):
    return [ui, *ui["definitions"]["subgraphs"]]


def _by_id(graph):
    return {n["id"]: n for n in graph["nodes"]}


def _link(graph, link_id):
    for k in graph["links"]:
        d = k if isinstance(k, dict) else dict(zip(("id", "origin_id", "origin_slot", "target_id", "target_slot", "type"), k))
        if d["id"] == link_id:
            return d
    raise KeyError(link_id)


def _overlaps(graph):
    boxes = [(n["id"], layout.node_box(n)) for n in graph["nodes"]]
    return {(a, b) for i, (a, x) in enumerate(boxes) for b, y in boxes[i + 1:]
            if x[0] < y[0] + y[2] and y[0] < x[0] + x[2] and x[1] < y[1] + y[3] and y[1] < x[1] + x[3]}


@pytest.fixture(scope="module")
def sharded():
    ui = ui_workflow()
    result = shard_workflow(ui)
    assert ui == ui_workflow(), "the input was modified"
    return ui, result


def test_ui_one_shard_node_per_used_source_in_its_own_graph(sharded):
    _, result = sharded
    assert result.format == "ui" and result.reason is None
    assert [(c.graph, c.loader_id, c.loader_type) for c in result.added] == [
        ("", 1, "UNETLoader"), ("", 6, "UNETLoader"), ("Stage", 20, "CheckpointLoaderSimple")]
    assert [c.label for c in result.added] == ["Wan high noise", "wan_low", "ltx"]
    assert result.message == "3 Shard nodes added: Wan high noise, wan_low, ltx"
    top, sub = _graphs(result.workflow)
    shards = {c.loader_id: c.shard_id for c in result.added}
    assert {n["id"] for n in top["nodes"] if n["type"] == SHARD_NODE} == {shards[1], shards[6]}
    assert [n["id"] for n in sub["nodes"] if n["type"] == SHARD_NODE] == [shards[20]]
    ids = [n["id"] for g in _graphs(result.workflow) for n in g["nodes"]]
    assert len(ids) == len(set(ids)) and min(shards.values()) > 22
    assert result.workflow["last_node_id"] == max(ids)


def test_ui_shard_node_takes_every_consumer_of_the_loader(sharded):
    ui, result = sharded
    shards = {c.loader_id: c.shard_id for c in result.added}
    for graph, loader, consumers in ((0, 1, [1]), (0, 6, [4]), (1, 20, [21, 22])):
        g = _graphs(result.workflow)[graph]
        nodes = _by_id(g)
        shard = nodes[shards[loader]]
        (into,) = nodes[loader]["outputs"][0]["links"]
        assert (_link(g, into)["origin_id"], _link(g, into)["target_id"]) == (loader, shard["id"])
        assert shard["inputs"][0]["link"] == into
        assert shard["outputs"][0]["links"] == consumers   # the Reroute (1), both KSamplers (21, 22)
        assert all(_link(g, k)["origin_id"] == shard["id"] for k in consumers)
        assert shard["widgets_values"] == ["auto", 1.0, "auto"]
    sub = _graphs(result.workflow)[1]
    assert _link(sub, 22)["parentId"] == 1 and sub["reroutes"] == ui["definitions"]["subgraphs"][0]["reroutes"]
    assert all(isinstance(k, dict) for k in sub["links"]) and all(isinstance(k, list) for k in result.workflow["links"])


def test_ui_bypassed_loader_gets_a_bypassed_shard_node(sharded):
    _, result = sharded
    nodes = _by_id(result.workflow)
    shard = nodes[next(c.shard_id for c in result.added if c.loader_id == 6)]
    assert shard["mode"] == 4
    assert nodes[next(c.shard_id for c in result.added if c.loader_id == 1)]["mode"] == 0


def test_ui_unused_loader_sharddit_loader_note_and_reroute_left_alone(sharded):
    ui, result = sharded
    before, after = _by_id(ui), _by_id(result.workflow)
    for nid in (8, 9, 10, 2, 5, 3, 4):   # values and wiring unchanged (positions may move)
        assert {k: v for k, v in after[nid].items() if k != "pos"} == \
            {k: v for k, v in before[nid].items() if k != "pos"}, nid
    assert _link(result.workflow, 5)["origin_id"] == 9


def test_ui_layout_nodes_below_move_groups_grow_nothing_newly_overlaps(sharded):
    ui, result = sharded
    before, after = _by_id(ui), _by_id(result.workflow)
    shard = after[next(c.shard_id for c in result.added if c.loader_id == 1)]
    loader_box, shard_box = layout.node_box(after[1]), layout.node_box(shard)
    assert shard_box[0] == loader_box[0] and shard_box[1] >= loader_box[1] + loader_box[3]
    for nid in (2, 3, 5):   # under the loader: moved down by the same amount
        assert after[nid]["pos"][0] == before[nid]["pos"][0] and after[nid]["pos"][1] > before[nid]["pos"][1], nid
    assert len({after[n]["pos"][1] - before[n]["pos"][1] for n in (2, 3, 5)}) == 1
    for nid in (1, 4, 8, 9, 11):   # the loader itself and the nodes beside it stay
        assert after[nid]["pos"] == before[nid]["pos"], nid
    models, below = result.workflow["groups"]
    g = models["bounding"]
    assert g[:3] == [-10, -70, 330] and g[1] + g[3] >= shard_box[1] + shard_box[3]   # grew to hold the Shard node
    assert below["bounding"][1] > ui["groups"][1]["bounding"][1]   # a group below moved with its Note
    for graph, original in zip(_graphs(result.workflow), _graphs(ui)):
        assert not _overlaps(graph) - _overlaps(original), graph.get("name")


def test_ui_idempotent_and_exact_inverse(sharded):
    ui, result = sharded
    again = shard_workflow(result.workflow)
    assert again.added == [] and again.workflow == result.workflow
    assert [c.loader_id for c in again.already] == [1, 6, 20]
    assert again.reason.startswith("already sharded: 3 diffusion models go through a Shard node")
    back = unshard_workflow(result.workflow)
    assert back.workflow == ui
    assert sorted(c.shard_id for c in back.added) == sorted(c.shard_id for c in result.added)
    assert unshard_workflow(ui).reason.startswith("nothing to unshard")

def test_api_shard_after_each_source_with_flattened_ids():
    api = api_workflow()
    result = shard_workflow(api)
    assert api == api_workflow() and result.format == "api"
    new = {c.loader_id: c.shard_id for c in result.added}
    assert new == {"128:74": "128:91", "3": "92"}, new   # ids unique across prefixes
    wf = result.workflow
    assert wf["128:91"]["class_type"] == SHARD_NODE and wf["128:91"]["inputs"]["model"] == ["128:74", 0]
    assert wf["128:80"]["inputs"]["model"] == ["128:91", 0] and wf["128:81"]["inputs"]["model"] == ["128:91", 0]
    assert wf["4"]["inputs"]["model"] == ["92", 0] and wf["128:90"]["inputs"]["model"] == ["128:80", 0]
    assert {k: v for k, v in wf["92"]["inputs"].items() if k != "model"} == {"devices": "auto",
                                                                                "reserve_vram_gb": 1.0, "parallel": "auto"}
    again = shard_workflow(wf)
    assert again.added == [] and again.workflow == wf and again.reason.startswith("already sharded")
    assert unshard_workflow(wf).workflow == api


def test_api_unknown_loader_class_needs_node_io():
    api = {"1": {"class_type": "MyPackVideoLoader", "inputs": {"name": "x.safetensors"}},
           "2": {"class_type": "MyPackPatch", "inputs": {"model": ["1", 1], "v": 1}},
           "3": {"class_type": "KSampler", "inputs": {"model": ["2", 0]}}}
    plain = shard_workflow(api)
    assert plain.added == [] and plain.reason.startswith("nothing to shard")
    io = {"MyPackVideoLoader": ([], ["VAE", "MODEL"]), "MyPackPatch": (["MODEL", "INT"], ["MODEL"]),
          "KSampler": (["MODEL"], ["LATENT"])}
    result = shard_workflow(api, node_io=io.get)
    ((change),) = result.added
    assert (change.loader_id, change.loader_type) == ("1", "MyPackVideoLoader")
    assert result.workflow[change.shard_id]["inputs"]["model"] == ["1", 1]   # the MODEL slot node_io named
    assert result.workflow["2"]["inputs"]["model"] == [change.shard_id, 0]
    assert result.workflow["3"] == api["3"]   # a node with a MODEL input is no source


def test_nothing_to_shard_is_a_reason_not_an_error():
    ui = {"nodes": [node(1, "Note", (0, 0), widgets=["hi"])], "links": [], "groups": []}
    result = shard_workflow(ui)
    assert result.workflow == ui and result.added == [] and result.already == []
    assert result.reason.startswith("nothing to shard: no diffusion-model loader") and result.message == result.reason


def test_a_workflow_on_sharddits_own_loader_is_already_sharded():
    """Load Diffusion Model (ShardDiT) shards what it loads: nothing to add, and the reason says
    so (not "no diffusion-model loader"); UI and API alike."""
    ui = {"nodes": [node(1, "ShardDiTLoadDiffusionModel", (0, 0), outputs=[("MODEL", "MODEL", [1])],
                         widgets=["wan.safetensors"]),
                    node(2, "KSampler", (0, 200), inputs=[("model", "MODEL", 1)])],
          "links": [[1, 1, 0, 2, 0, "MODEL"]], "groups": []}
    api = {"1": {"class_type": "ShardDiTLoadDiffusionModel", "inputs": {"unet_name": "wan.safetensors"}},
           "2": {"class_type": "KSampler", "inputs": {"model": ["1", 0]}}}
    for wf in (ui, api):
        result = shard_workflow(wf)
        assert result.workflow == wf and result.added == [] and [c.loader_id for c in result.already] == [1 if wf is ui else "1"]
        assert result.reason.startswith("already sharded: 1 diffusion model goes through a Shard node or ShardDiT's own loader (wan)")


@pytest.mark.parametrize("data", [[], "text", 3, {}, {"a": 1}, {"nodes": {}, "links": []}, {"1": {"inputs": {}}}],
                         ids=["list", "str", "int", "empty", "dict", "nodes-not-list", "api-no-class"])
def test_not_a_workflow_raises_workflow_error(data):
    with pytest.raises(WorkflowError, match="not a ComfyUI workflow: found .*; expected a UI workflow"):
        shard_workflow(data)
    with pytest.raises(WorkflowError):
        unshard_workflow(data)


def test_make_room_moves_only_what_is_below_in_the_same_columns_and_undo_restores():
    anchor = node(1, "UNETLoader", (0, 0))
    below = node(2, "KSampler", (50, 150))
    under_below = node(3, "VAEDecode", (250, 300))   # pushed by node 2, which shares its columns
    beside = node(4, "KSampler", (700, 150))
    above = node(5, "Note", (0, -300))
    graph = {"nodes": [anchor, below, under_below, beside, above], "links": [],
             "groups": [{"bounding": [-10, -40, 340, 140]}, {"bounding": [600, 100, 400, 200]}]}
    original = copy.deepcopy(graph)
    box = (0, 100, 300, 136)
    record = layout.make_room(graph, anchor, box)
    pos = {n["id"]: n["pos"] for n in graph["nodes"]}
    dy = record["dy"]
    assert dy > 0 and pos[2] == [50, 150 + dy] and pos[3] == [250, 300 + dy]
    assert pos[4] == [700, 150] and pos[5] == [0, -300] and pos[1] == [0, 0]
    assert layout.node_box(graph["nodes"][1])[1] >= box[1] + box[3]
    assert graph["groups"][0]["bounding"][3] >= box[1] + box[3] - (-40) and graph["groups"][1] == original["groups"][1]
    layout.undo_room(graph, record)
    assert graph == original
