"""The shard transform (loaders/workflow/shard.py, layout.py) on small workflows built here, no
ComfyUI: where the Shard node goes (UI with a subgraph, groups, a Note, a Reroute, a bypassed
loader, an unused loader, a ShardDiT loader, two consumers, native reroutes; API with flattened
subgraph ids), what is left alone, idempotence, the exact inverse, the reasons when nothing
changes, the errors for data that is not a workflow, the layout (nodes below move, groups grow,
nothing newly overlaps) and the ``shard-workflow`` command line as a subprocess.
"""
from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path

import pytest
from sharddit.loaders.workflow import layout
from sharddit.loaders.workflow.shard import SHARD_NODE, WorkflowError, shard_workflow, unshard_workflow

pytestmark = pytest.mark.no_blas

REPO = Path(__file__).resolve().parents[1]
SUB = "5b1c0e6e-0000-4000-8000-00000000a001"


def _node(nid, typ, pos, size=(300, 80), inputs=(), outputs=(), mode=0, widgets=None, title=None):
    n = {"id": nid, "type": typ, "pos": list(pos), "size": list(size), "flags": {}, "order": nid, "mode": mode,
         "inputs": [{"name": a, "type": t, "link": k} for a, t, k in inputs],
         "outputs": [{"name": a, "type": t, "links": list(k)} for a, t, k in outputs],
         "properties": {}, "widgets_values": list(widgets or [])}
    if title:
        n["title"] = title
    return n


def ui_workflow() -> dict:
    """Top level: a titled UNETLoader in a group -> a legacy Reroute -> LoRA -> KSampler, a Note
    under the loader, a bypassed UNETLoader, an unused one, a ShardDiT loader, and an instance of
    a subgraph whose CheckpointLoaderSimple feeds two KSamplers, one of them through a native
    reroute (a link with ``parentId``)."""
    top = [
        _node(1, "UNETLoader", (0, 0), outputs=[("MODEL", "MODEL", [1])], widgets=["wan_high.safetensors", "default"],
              title="Wan high noise"),
        _node(2, "Reroute", (0, 170), (75, 26), inputs=[("", "*", 1)], outputs=[("", "MODEL", [2])]),
        _node(3, "LoraLoaderModelOnly", (0, 250), inputs=[("model", "MODEL", 2)], outputs=[("MODEL", "MODEL", [3])],
              widgets=["lightning.safetensors", 1.0]),
        _node(4, "KSampler", (400, 0), (300, 260), inputs=[("model", "MODEL", 3)], outputs=[("LATENT", "LATENT", [])],
              widgets=[1, "fixed", 20, 5.0, "euler", "simple", 1.0]),
        _node(5, "Note", (0, 400), (300, 60), widgets=["a note under the loader"]),
        _node(6, "UNETLoader", (800, 0), outputs=[("MODEL", "MODEL", [4])], mode=4, widgets=["wan_low.safetensors", "default"]),
        _node(7, "KSampler", (800, 200), (300, 260), inputs=[("model", "MODEL", 4)], outputs=[("LATENT", "LATENT", [])],
              widgets=[1, "fixed", 20, 5.0, "euler", "simple", 1.0]),
        _node(8, "UNETLoader", (1200, 0), outputs=[("MODEL", "MODEL", [])], widgets=["unused.safetensors", "default"]),
        _node(9, "ShardDiTUNETLoader", (1600, 0), outputs=[("MODEL", "MODEL", [5])], widgets=["wan.safetensors"]),
        _node(10, "KSampler", (1600, 200), (300, 260), inputs=[("model", "MODEL", 5)], outputs=[("LATENT", "LATENT", [])]),
        _node(11, SUB, (2000, 0), (200, 100), outputs=[("LATENT", "LATENT", [])]),
    ]
    links = [[1, 1, 0, 2, 0, "MODEL"], [2, 2, 0, 3, 0, "MODEL"], [3, 3, 0, 4, 0, "MODEL"], [4, 6, 0, 7, 0, "MODEL"],
             [5, 9, 0, 10, 0, "MODEL"]]
    inner = [
        _node(20, "CheckpointLoaderSimple", (0, 0), (300, 100), outputs=[("MODEL", "MODEL", [21, 22]),
              ("CLIP", "CLIP", []), ("VAE", "VAE", [])], widgets=["ltx.safetensors"]),
        _node(21, "KSampler", (0, 200), (300, 260), inputs=[("model", "MODEL", 21)], outputs=[("LATENT", "LATENT", [23])]),
        _node(22, "KSampler", (400, 200), (300, 260), inputs=[("model", "MODEL", 22)], outputs=[("LATENT", "LATENT", [])]),
    ]
    sub_links = [{"id": 21, "origin_id": 20, "origin_slot": 0, "target_id": 21, "target_slot": 0, "type": "MODEL"},
                 {"id": 22, "origin_id": 20, "origin_slot": 0, "target_id": 22, "target_slot": 0, "type": "MODEL",
                  "parentId": 1},
                 {"id": 23, "origin_id": 21, "origin_slot": 0, "target_id": -20, "target_slot": 0, "type": "LATENT"}]
    sub = {"id": SUB, "name": "Stage", "nodes": inner, "links": sub_links, "groups": [],
           "reroutes": [{"id": 1, "pos": [350, 150], "linkIds": [22]}], "inputs": [],
           "outputs": [{"name": "LATENT", "type": "LATENT", "linkIds": [23]}]}
    groups = [{"id": 1, "title": "Models", "bounding": [-10, -70, 330, 170]},
              {"id": 2, "title": "Below", "bounding": [-10, 360, 330, 120]}]
    return {"last_node_id": 22, "last_link_id": 23, "nodes": top, "links": links, "groups": groups,
            "definitions": {"subgraphs": [sub]}, "extra": {}, "version": 0.4}


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
    ui, result = sharded
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
        strip = lambda n: {k: v for k, v in n.items() if k != "pos"}   # noqa: E731
        assert strip(after[nid]) == strip(before[nid]), nid
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
    assert again.reason.startswith("already sharded: 3 Shard nodes in place")
    back = unshard_workflow(result.workflow)
    assert back.workflow == ui
    assert sorted(c.shard_id for c in back.added) == sorted(c.shard_id for c in result.added)
    assert unshard_workflow(ui).reason.startswith("nothing to unshard")


def api_workflow() -> dict:
    """A flattened subgraph (ids ``"128:<n>"``) as Export (API) writes it, plus a top-level
    GGUF loader."""
    return {
        "128:74": {"class_type": "UNETLoader", "inputs": {"unet_name": "wan.safetensors", "weight_dtype": "default"}},
        "128:80": {"class_type": "LoraLoaderModelOnly", "inputs": {"model": ["128:74", 0], "lora_name": "l.safetensors",
                                                                   "strength_model": 1.0}},
        "128:81": {"class_type": "ModelSamplingSD3", "inputs": {"model": ["128:74", 0], "shift": 8.0}},
        "128:90": {"class_type": "KSampler", "inputs": {"model": ["128:80", 0], "seed": 1}},
        "3": {"class_type": "UnetLoaderGGUF", "inputs": {"unet_name": "wan-Q8_0.gguf"}},
        "4": {"class_type": "KSampler", "inputs": {"model": ["3", 0], "seed": 1}},
    }


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
    ui = {"nodes": [_node(1, "Note", (0, 0), widgets=["hi"])], "links": [], "groups": []}
    result = shard_workflow(ui)
    assert result.workflow == ui and result.added == [] and result.already == []
    assert result.reason.startswith("nothing to shard: no diffusion-model loader") and result.message == result.reason


@pytest.mark.parametrize("data", [[], "text", 3, {}, {"a": 1}, {"nodes": {}, "links": []}, {"1": {"inputs": {}}}],
                         ids=["list", "str", "int", "empty", "dict", "nodes-not-list", "api-no-class"])
def test_not_a_workflow_raises_workflow_error(data):
    with pytest.raises(WorkflowError, match="not a ComfyUI workflow: found .*; expected a UI workflow"):
        shard_workflow(data)
    with pytest.raises(WorkflowError):
        unshard_workflow(data)


def test_make_room_moves_only_what_is_below_in_the_same_columns_and_undo_restores():
    anchor = _node(1, "UNETLoader", (0, 0))
    below = _node(2, "KSampler", (50, 150))
    under_below = _node(3, "VAEDecode", (250, 300))   # pushed by node 2, which shares its columns
    beside = _node(4, "KSampler", (700, 150))
    above = _node(5, "Note", (0, -300))
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


# ----------------------------------------------------------------------------- command line
# Every invocation is its own ``python <pack-dir> shard-workflow`` process; they start together
# (the command imports the whole CLI, torch included: ~2 s of CPU each).
BAD = {"missing.json": "cannot read", "bad.json": "is not JSON", "latin1.json": "cannot read",
       "list.json": "not a ComfyUI workflow: found a JSON list", "note.json": "nothing to shard: no diffusion-model loader"}


@pytest.fixture(scope="module")
def cli(tmp_path_factory):
    """``(folder, {case: CompletedProcess-like})`` of every command-line case."""
    d = tmp_path_factory.mktemp("cli")
    sharded = shard_workflow(ui_workflow()).workflow
    (d / "in.json").write_text(json.dumps(ui_workflow()))
    (d / "sharded.json").write_text(json.dumps(sharded))
    (d / "api.json").write_text(json.dumps(api_workflow()))
    (d / "api_sharded.json").write_text(json.dumps(shard_workflow(api_workflow()).workflow))
    (d / "bad.json").write_text("{not json")
    (d / "list.json").write_text("[1, 2]")
    (d / "note.json").write_text(json.dumps({"nodes": [_node(1, "Note", (0, 0))], "links": []}))
    (d / "latin1.json").write_bytes(b"\xff\xfe\x00bad")
    cases = {"file": [d / "in.json", "-o", d / "out.json"], "unshard": [d / "sharded.json", "--unshard", "-o", d / "back.json"],
             "stdout": [d / "api.json"], "already": [d / "api_sharded.json"],
             "template": ["--template", "video_no_such_template"], "list": ["--list-templates"],
             **{name: [d / name] for name in BAD}}
    procs = {k: subprocess.Popen([sys.executable, str(REPO), "shard-workflow", *map(str, a)], stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True) for k, a in cases.items()}
    done = {}
    for k, p in procs.items():
        out, err = p.communicate(timeout=180)
        done[k] = subprocess.CompletedProcess(p.args, p.returncode, out, err)
    return d, done


def test_cli_file_to_file_then_unshard(cli):
    d, runs = cli
    done = runs["file"]
    assert done.returncode == 0, done.stderr
    assert done.stdout == "" and "[ShardDiT] 3 Shard nodes added: Wan high noise, wan_low, ltx" in done.stderr
    assert json.loads((d / "out.json").read_text()) == shard_workflow(ui_workflow()).workflow
    back = runs["unshard"]
    assert back.returncode == 0 and "[ShardDiT] 3 Shard nodes removed" in back.stderr, back.stderr
    assert json.loads((d / "back.json").read_text()) == ui_workflow()


def test_cli_api_to_stdout_and_already_sharded(cli):
    _, runs = cli
    done = runs["stdout"]
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == shard_workflow(api_workflow()).workflow
    again = runs["already"]
    assert again.returncode == 0 and json.loads(again.stdout) == json.loads(done.stdout), again.stderr
    assert "already sharded" in again.stderr


@pytest.mark.parametrize("name", list(BAD))
def test_cli_bad_input_exits_2_with_a_message(cli, name):
    done = cli[1][name]
    assert done.returncode == 2 and done.stdout == "", (done.returncode, done.stdout[:200])
    assert BAD[name] in done.stderr and name in done.stderr and "Traceback" not in done.stderr, done.stderr


def test_cli_unknown_or_absent_template_exits_2(cli):
    from sharddit.loaders.workflow.templates import video_templates

    done = cli[1]["template"]
    assert done.returncode == 2 and done.stdout == "" and "Traceback" not in done.stderr, done.stderr
    assert "no installed video template 'video_no_such_template'" in done.stderr, done.stderr
    listed = cli[1]["list"]
    if not video_templates():   # the pure environment: no templates package at all
        assert "none: no comfyui_workflow_templates package installed" in done.stderr
        assert "pip install comfyui-workflow-templates" in done.stderr
        assert listed.returncode == 2 and "no comfyui_workflow_templates package installed" in listed.stdout
    else:
        assert listed.returncode == 0 and set(listed.stdout.split()) == set(video_templates())
