"""The shard transform (loaders/workflow/shard_transform.py) on every core ``video_*`` template the installed
``comfyui_workflow_templates*`` package has, in-process ComfyUI (issue 29, "Done when" 2).

Per template: one Shard node right after each diffusion-model loader, inside the loader's own
(sub)graph, taking every consumer of the loader's MODEL; no node newly overlapping another
(``layout.node_box``); a second pass changes nothing (``added == []``); ``unshard`` gives the
template back exactly; the API form of the sharded template passes ComfyUI's own
``validate_prompt`` with the templates' model files present (empty placeholder files under their
names in a temp models folder: validation checks ComfyUI's file lists, never contents; likewise
the input images, videos and audio); and it equals the transform applied to the template's API
form, up to the new nodes' ids. The templates are read from the installed package at run time.
ComfyUI 0.3.64 has no templates package and lacks their nodes: skipped there. One ComfyUI import
and one placeholder folder for the whole module (well under a second per template).
"""
from __future__ import annotations

import json
import re

import pytest
from harness import templates as tpl
from harness.comfy_env import comfy_path, comfy_version, pack_module

pytestmark = pytest.mark.comfy


def _names() -> list:
    import os

    if not os.environ.get("COMFYUI_PATH") or comfy_version().startswith("0.3."):
        return ["<none>"]   # skipped by the test (no ComfyUI, or one older than the templates)
    from sharddit.loaders.workflow.templates import video_templates

    return sorted(video_templates()) or ["<none>"]


NAMES = _names()
OLD = "(added after ComfyUI 0.3.64)"


def _skip_old():
    if comfy_version().startswith("0.3."):
        pytest.skip(f"ComfyUI {comfy_version()} has no workflow templates package and lacks the templates' nodes {OLD}")


def _requires_templates() -> bool:
    """Whether this ComfyUI's requirements.txt pins a templates package."""
    req = comfy_path() / "requirements.txt"
    return req.is_file() and "comfyui-workflow-templates" in req.read_text(encoding="utf-8")


@pytest.fixture(scope="module")
def wf(env):
    """The pack's workflow modules as ComfyUI imported them."""
    return type("WF", (), {m: pack_module(env, f"loaders.workflow.{m}") for m in
                           ("shard_transform", "layout", "templates", "comfy_nodes")})


def test_every_installed_video_template_is_listed(env, wf, capsys):
    _skip_old()
    found = wf.templates.video_templates()
    with capsys.disabled():
        print(f"\n[ShardDiT] ComfyUI {comfy_version()}: {len(found)} video_* templates installed")
    if not _requires_templates():
        pytest.skip(f"ComfyUI {comfy_version()} does not require a comfyui-workflow-templates package")
    assert len(found) > 0, "this ComfyUI requires comfyui-workflow-templates but no video_* template is installed"
    assert sorted(found) == [n for n in NAMES if n != "<none>"]


def _upload_files(api: dict, mappings) -> set:
    """The input file names the prompt's upload combos (LoadImage, LoadVideo, LoadAudio) name."""
    out = set()
    for node in api.values():
        spec = mappings[node["class_type"]].INPUT_TYPES()
        for section in ("required", "optional"):
            for name, s in (spec.get(section) or {}).items():
                opts = s[1] if len(s) > 1 and isinstance(s[1], dict) else {}
                value = node["inputs"].get(name)
                if isinstance(value, str) and any(k.endswith("_upload") and v for k, v in opts.items()):
                    out.add(value)
    return out


@pytest.fixture(scope="module")
def placeholders(env, tmp_path_factory):
    """Every model file the templates name (``properties.models``) and every input file they load,
    as empty files in temp folders registered with ComfyUI; taken away again after the module
    (so that no later test loads an empty file under a tiny model's name)."""
    _skip_old()
    fp = env.folder_paths
    root = tmp_path_factory.mktemp("template_placeholders")
    ui = {n: json.loads(p.read_text(encoding="utf-8")) for n, p in
          pack_module(env, "loaders.workflow.templates").video_templates().items()}
    added, created = [], []
    for folder, name in sorted({f for w in ui.values() for f in tpl.model_files(w)}):
        (root / folder / name).parent.mkdir(parents=True, exist_ok=True)
        (root / folder / name).write_bytes(b"")
        key = fp.map_legacy(folder)
        if key not in fp.folder_names_and_paths:
            created.append(key)
        if str(root / folder) not in fp.folder_names_and_paths.get(key, ([], None))[0]:
            fp.add_model_folder_path(folder, str(root / folder))
            added.append((key, str(root / folder)))
    inputs = root / "input"
    inputs.mkdir()
    widgets = tpl.comfy_widget_inputs(env.nodes.NODE_CLASS_MAPPINGS)
    for w in ui.values():
        for name in _upload_files(tpl.ui_to_api(w, widgets), env.nodes.NODE_CLASS_MAPPINGS) - {""}:
            path = inputs / re.sub(r" \[input\]$", "", name)
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(b"")
    old_input = fp.get_input_directory()
    fp.set_input_directory(str(inputs))
    getattr(fp, "filename_list_cache", {}).clear()
    yield ui
    fp.set_input_directory(old_input)
    for key, path in added:
        fp.folder_names_and_paths[key][0].remove(path)
    for key in created:
        fp.folder_names_and_paths.pop(key, None)
    getattr(fp, "filename_list_cache", {}).clear()


def _graph_index(sharded: dict, change) -> int:
    """Which graph (0 the top one, then the subgraphs in order) holds the change's Shard node (ids
    of inserted nodes are unique workflow-wide; subgraph names need not be)."""
    (i,) = [i for i, g in enumerate(tpl.graphs(sharded)) if any(n["id"] == change.shard_id for n in g["nodes"])]
    return i


def _overlaps(graph: dict, layout) -> set:
    boxes = [(n["id"], layout.node_box(n)) for n in graph["nodes"]]
    return {(a, b) for i, (a, x) in enumerate(boxes) for b, y in boxes[i + 1:]
            if x[0] < y[0] + y[2] and y[0] < x[0] + x[2] and x[1] < y[1] + y[3] and y[1] < x[1] + x[3]}


def _assert_placement(ui: dict, sharded: dict, change, shard_mod) -> None:
    """The Shard node sits in the loader's graph, is the only reader of the loader's MODEL, and
    feeds exactly what the loader fed."""
    i = _graph_index(sharded, change)
    before, after = tpl.graphs(ui)[i], tpl.graphs(sharded)[i]
    assert change.graph == ("" if i == 0 else str(after.get("name") or after.get("id")))
    nodes = {n["id"]: n for n in after["nodes"]}
    links = {tpl._link(k)["id"]: tpl._link(k) for k in after["links"]}
    shard, loader = nodes[change.shard_id], nodes[change.loader_id]
    assert shard["type"] == shard_mod.SHARD_NODE and shard["mode"] == loader.get("mode", 0)
    old = next(n for n in before["nodes"] if n["id"] == change.loader_id)
    for slot, out in enumerate(loader["outputs"]):
        if out["type"] != "MODEL" or not old["outputs"][slot].get("links"):
            continue
        (link_in,) = out["links"]
        assert (links[link_in]["target_id"], links[link_in]["origin_slot"]) == (shard["id"], slot)
        consumers = old["outputs"][slot]["links"]
        assert shard["outputs"][0]["links"] == consumers
        assert all(links[k]["origin_id"] == shard["id"] for k in consumers)


def _canonical(api: dict, shard_node: str) -> dict:
    """``api`` with each Shard node's id replaced by ``shard(<its model input>)`` (ids of new
    nodes differ between the two paths) and without ``_meta`` (the UI node carries no title)."""
    names = {k: f"shard({v['inputs']['model'][0]}:{v['inputs']['model'][1]})" for k, v in api.items()
             if v["class_type"] == shard_node}
    out = {}
    for k, v in api.items():
        inputs = {n: [names.get(str(x[0]), x[0]), x[1]] if isinstance(x, list) and len(x) == 2 else x
                  for n, x in v["inputs"].items()}
        out[names.get(k, k)] = {"class_type": v["class_type"], "inputs": inputs}
    return out


@pytest.fixture(scope="module")
def results(wf):
    """name -> shard_workflow(template), computed once per template."""
    return {}


@pytest.mark.parametrize("name", NAMES)
def test_template_sharded_placed_idempotent_invertible_without_overlap(env, wf, placeholders, results, name):
    if name == "<none>":
        pytest.skip(f"no comfyui_workflow_templates package installed with ComfyUI {comfy_version()} {OLD}")
    ui = placeholders[name]
    result = results.setdefault(name, wf.shard_transform.shard_workflow(ui))
    assert result.format == "ui" and result.added, f"{name}: {result.reason}"
    assert re.fullmatch(r"\d+ Shard nodes? added: .+", result.message), result.message
    for change in result.added:
        _assert_placement(ui, result.workflow, change, wf.shard_transform)
    for graph, original in zip(tpl.graphs(result.workflow), tpl.graphs(ui), strict=True):
        new = _overlaps(graph, wf.layout) - _overlaps(original, wf.layout)
        assert not new, f"{name}: nodes newly overlapping in {graph.get('name') or 'the top graph'}: {sorted(new)}"
    again = wf.shard_transform.shard_workflow(result.workflow)
    assert again.added == [] and again.workflow == result.workflow, f"{name}: a second pass changed the workflow"
    assert len(again.already) == len(result.added) and again.reason.startswith("already sharded")
    assert wf.shard_transform.unshard_workflow(result.workflow).workflow == ui, f"{name}: unshard(shard(w)) != w"


@pytest.mark.parametrize("name", NAMES)
def test_template_sharded_validates_and_matches_the_api_transform(env, wf, placeholders, results, name):
    if name == "<none>":
        pytest.skip(f"no comfyui_workflow_templates package installed with ComfyUI {comfy_version()} {OLD}")
    ui = placeholders[name]
    result = results.setdefault(name, wf.shard_transform.shard_workflow(ui))
    mappings = env.nodes.NODE_CLASS_MAPPINGS
    widgets = tpl.comfy_widget_inputs(mappings)
    api = tpl.ui_to_api(result.workflow, widgets)
    ok, error, _, node_errors = tpl.validate(api)
    assert ok, f"{name}: {error} {json.dumps(node_errors, default=str)[:2000]}"
    assert tpl.api_ids(api, wf.shard_transform.SHARD_NODE), f"{name}: no Shard node reaches the API prompt"
    plain = tpl.ui_to_api(ui, widgets)
    from_api = wf.shard_transform.shard_workflow(plain, wf.comfy_nodes.node_io_from_mappings(mappings))
    assert _canonical(from_api.workflow, wf.shard_transform.SHARD_NODE) == _canonical(api, wf.shard_transform.SHARD_NODE), \
        f"{name}: the API transform of the template's API form differs from the sharded UI template's API form"

