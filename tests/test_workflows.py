"""Shipped workflows (workflows/*.json): parse, use known nodes with valid inputs, UI/API twins agree.

Pure (CI): no ComfyUI. Core nodes are checked against the checked-in table
``workflow_tools.CORE_NODES`` (itself checked against real ComfyUI in test_workflows_comfy.py);
ShardDiT nodes against ``nodes/*.py`` read with ast.
"""
import json

import pytest

import build_workflows
import workflow_tools as wt
from sharddit.parallel.placement.devices import parse_component_device, parse_device_plan

pytestmark = pytest.mark.no_blas  # no BLAS arithmetic: left out of the other-MKL_CBWR rerun in .ci/run

EXPECTED = {"wan2.1_t2v_14B_2gpu", "ltxv_13b_t2v_2gpu", "hunyuan_video_t2v_2gpu", "wan2.2_t2v_A14B_2gpu",
            "ltx2.3_t2v_2gpu", "hunyuan_video_1.5_720p_t2v_2gpu", "kandinsky5_lite_t2v_2gpu"}
PAIRS = wt.workflow_pairs()
IDS = [name for name, _, _ in PAIRS]
MODEL_FOLDERS = {"diffusion_models", "text_encoders", "vae", "checkpoints", "loras"}


@pytest.fixture(scope="module")
def ours():
    return wt.sharddit_schemas()


@pytest.fixture(scope="module")
def table(ours):
    """Core table + our schemas; DESIGN.md's contract only for a ShardDiT node not written yet
    (that node fails test_node_types_are_core_or_sharddit, the other checks still run)."""
    return {**build_workflows.CONTRACT, **wt.node_table(ours)}


def _load(pair):
    _, ui_path, api_path = pair
    return wt.load(ui_path), wt.load(api_path)


def test_expected_workflows_present():
    assert EXPECTED <= set(IDS), f"missing workflows: {sorted(EXPECTED - set(IDS))}"
    for name, ui_path, api_path in PAIRS:
        assert api_path.exists(), f"{ui_path.name} has no API twin {api_path.name}"
    for api in wt.API_DIR.glob("*.json"):
        assert (wt.WORKFLOWS_DIR / api.name.replace("_api.json", ".json")).exists(), f"{api.name} has no UI twin"
    # workflows/ is the template folder ComfyUI lists (Templates -> Custom Nodes): UI files only
    assert not list(wt.WORKFLOWS_DIR.glob("*_api.json")), "API files in workflows/ would be offered as templates"


@pytest.mark.parametrize("pair", PAIRS, ids=IDS)
def test_template_thumbnail(pair):
    """The frontend (1.27) shows /api/workflow_templates/<pack>/<name>.jpg on a custom node
    template's card: a JPEG beside each UI workflow."""
    thumb = pair[1].with_suffix(".jpg")
    assert thumb.is_file(), f"no thumbnail {thumb.name} (python tests/make_thumbnails.py)"
    data = thumb.read_bytes()
    assert data[:3] == b"\xff\xd8\xff" and 5_000 < len(data) < 400_000, f"{thumb.name}: not a JPEG of sensible size"


@pytest.mark.parametrize("pair", PAIRS, ids=IDS)
def test_parses_and_is_readable(pair):
    for path in pair[1:]:
        text = path.read_text(encoding="utf-8")
        data = json.loads(text)
        assert text == json.dumps(data, indent=2, ensure_ascii=False) + "\n", f"{path.name}: keep indent 2"
    ui, api = _load(pair)
    assert ui["version"] == 0.4 and isinstance(ui["nodes"], list) and isinstance(ui["links"], list)
    for node_id, node in api.items():
        assert node_id.isdigit() and set(node) >= {"class_type", "inputs"}, node_id


@pytest.mark.parametrize("pair", PAIRS, ids=IDS)
def test_node_types_are_core_or_sharddit(pair, ours):
    ui, api = _load(pair)
    for node in ui["nodes"]:
        t = node["type"]
        if t.startswith("ShardDiT"):
            assert t in ours, f"{t} is not defined in nodes/*.py (defined: {sorted(ours)})"
        else:
            assert t in wt.CORE_NODES or t in wt.FRONTEND_ONLY, \
                f"{t} is neither a ShardDiT node nor in the checked-in core list (workflow_tools.CORE_NODES)"
    for node in api.values():
        assert node["class_type"] in ours or node["class_type"] in wt.CORE_NODES, node["class_type"]


def _check_value(inp: wt.Input, value, files: dict, where: str):
    if inp.type == "INT":
        assert isinstance(value, int) and not isinstance(value, bool), f"{where}: {value!r} is not an int"
    elif inp.type == "FLOAT":
        assert isinstance(value, (int, float)) and not isinstance(value, bool), f"{where}: {value!r} is not a number"
    elif inp.type == "BOOLEAN":
        assert isinstance(value, bool), where
    elif inp.type in ("STRING", "COMBO"):
        assert isinstance(value, str), f"{where}: {value!r} is not a string"
    if inp.min is not None:
        assert value >= inp.min, f"{where}: {value} < min {inp.min}"
    if inp.max is not None:
        assert value <= inp.max, f"{where}: {value} > max {inp.max}"
    if inp.options is not None:
        assert value in inp.options, f"{where}: {value!r} not in {inp.options}"
    if inp.folder is not None:
        assert value in files.get(inp.folder, ()), \
            f"{where}: {value!r} is not a {inp.folder} file named in the workflow's model list {files}"
    if inp.name == "devices":
        parse_device_plan(value)
    elif inp.name == "device":
        parse_component_device(value)


@pytest.mark.parametrize("pair", PAIRS, ids=IDS)
def test_sharddit_inputs_exist_with_valid_values(pair, ours, table):
    ui, api = _load(pair)
    files = {}
    for folder, name in wt.model_files(ui):
        files.setdefault(folder, set()).add(name)
    used = 0
    everything = {**wt.ui_to_api(ui, table, include_muted=True), **api}  # muted nodes (Plan) too
    for node_id, node in everything.items():
        spec = ours.get(node["class_type"])
        if spec is None:
            continue
        used += 1
        names = {i.name for i in spec.inputs}
        unknown = set(node["inputs"]) - names
        assert not unknown, f"node {node_id} {spec.node_id}: inputs {sorted(unknown)} not in its schema"
        missing = [i.name for i in spec.inputs if not i.optional and i.name not in node["inputs"]]
        assert not missing, f"node {node_id} {spec.node_id}: required inputs {missing} missing"
        for inp in spec.inputs:
            value = node["inputs"].get(inp.name)
            if value is None:
                continue
            where = f"{pair[0]} node {node_id} {spec.node_id}.{inp.name}"
            if inp.is_widget:
                _check_value(inp, value, files, where)
            else:
                assert isinstance(value, list) and len(value) == 2 and value[0] in everything, f"{where}: bad link {value!r}"
    assert used, f"{pair[0]} uses no ShardDiT node"


@pytest.mark.parametrize("pair", PAIRS, ids=IDS)
def test_plan_node_matches_the_workflow(pair, table):
    """The muted Placement Plan simulates this workflow's model at its video size."""
    ui, api = _load(pair)
    plans = [n for n in wt.ui_to_api(ui, table, include_muted=True).values() if n["class_type"] == "ShardDiTPlan"]
    assert len(plans) == 1 and all(n["class_type"] != "ShardDiTPlan" for n in api.values()), "one muted Plan node"
    plan = plans[0]["inputs"]
    (latent,) = [n["inputs"] for n in api.values() if {"width", "height", "length"} <= set(n["inputs"])]
    assert (plan["width"], plan["height"], plan["frames"]) == (latent["width"], latent["height"], latent["length"])
    family = {"wan2.1": "wan2.1-", "wan2.2": "wan2.2-", "ltxv": "ltxv-", "hunyuan_video_t2v": "hunyuanvideo-13b",
              "hunyuan_video_1.5": "hunyuanvideo-1.5", "ltx2.3": "ltx-2.3", "kandinsky5_lite": "kandinsky5-lite",
              "minimax_h3": "minimax-h3"}
    assert any(pair[0].startswith(k) and plan["model"].startswith(v) for k, v in family.items()), plan["model"]


@pytest.mark.parametrize("pair", PAIRS, ids=IDS)
def test_marked_with_the_oldest_comfyui_it_needs(pair, table):
    """``extra.sharddit.min_comfyui`` is a tested ComfyUI version, no older than the newest node
    the graph uses (``since`` in CORE_NODES); workflows/README.md's table says the same."""
    ui, _ = _load(pair)
    mark = wt.min_comfyui(ui)
    assert mark in wt.COMFY_VERSIONS, f"{pair[0]}: min_comfyui {mark!r} is not one of {wt.COMFY_VERSIONS}"
    needed = wt.needed_comfyui(ui, table)
    assert wt.version_tuple(mark) >= wt.version_tuple(needed), \
        f"{pair[0]} says ComfyUI {mark} but uses nodes of {needed}: " + \
        str(sorted({n["type"] for n in ui["nodes"] if n["type"] in table and table[n["type"]].since == needed}))
    rows = [line for line in (wt.WORKFLOWS_DIR / "README.md").read_text().splitlines()
            if line.startswith(f"| `{pair[0]}` |")]
    assert rows and f"| {mark} |" in rows[0], f"workflows/README.md: no row `{pair[0]}` with ComfyUI {mark}: {rows}"


def test_version_marks_compare_as_versions():
    assert wt.version_tuple("0.29.0") > wt.version_tuple("0.3.64")  # not as strings
    assert wt.version_tuple("0.29.0+cu128") == (0, 29, 0)
    with pytest.raises(ValueError, match="not a ComfyUI version"):
        wt.version_tuple("latest")
    with pytest.raises(ValueError, match="min_comfyui"):
        wt.min_comfyui({"extra": {}})


@pytest.mark.parametrize("pair", PAIRS, ids=IDS)
def test_the_shard_transform_finds_nothing_to_add(pair):
    """Every DiT of a shipped workflow is sharded already (ShardDiT's loader, or a Shard node after
    core's): the pack's own shard transform leaves both twins unchanged."""
    from sharddit.loaders.workflow.shard_transform import shard_workflow

    for path in pair[1:]:
        workflow = wt.load(path)
        result = shard_workflow(workflow)
        assert result.added == [] and result.workflow == workflow, f"{path.name}: {result.message}"


@pytest.mark.parametrize("pair", PAIRS, ids=IDS)
def test_all_placement_inputs_are_auto(pair, ours, table):
    ui, api = _load(pair)
    for node_id, node in {**wt.ui_to_api(ui, table, include_muted=True), **api}.items():
        if node["class_type"] in ours:
            for key in ("devices", "device", "tile_batch_size"):
                if key in node["inputs"]:
                    assert node["inputs"][key] == "auto", f"node {node_id} {node['class_type']}.{key}"


@pytest.mark.parametrize("pair", PAIRS, ids=IDS)
def test_ui_and_api_twins_describe_the_same_graph(pair, table):
    ui, api = _load(pair)
    assert wt.strip_meta(wt.ui_to_api(ui, table)) == wt.strip_meta(api)


@pytest.mark.parametrize("pair", PAIRS, ids=IDS)
def test_ui_links_are_consistent(pair, table):
    ui, _ = _load(pair)
    nodes = {n["id"]: n for n in ui["nodes"]}
    assert ui["last_node_id"] >= max(nodes) and ui["last_link_id"] >= max((link[0] for link in ui["links"]), default=0)
    for lid, (src, src_slot, dst, dst_slot, typ) in wt.ui_links(ui).items():
        assert src in nodes and dst in nodes, f"link {lid} points at a missing node"
        out = nodes[src]["outputs"][src_slot]
        assert lid in out["links"] and out["type"] == typ, f"link {lid}: output side disagrees"
        inp = nodes[dst]["inputs"][dst_slot]
        assert inp["link"] == lid and inp["type"] == typ, f"link {lid}: input side disagrees"
        assert table[nodes[dst]["type"]].input(inp["name"]).type == typ
    for node in ui["nodes"]:
        spec = table.get(node["type"])
        if spec is None:
            continue
        for inp in spec.sockets:
            linked = [i for i in node["inputs"] if i["name"] == inp.name and i["link"] is not None]
            assert linked or inp.optional, f"node {node['id']} {node['type']}: {inp.name} not connected"


@pytest.mark.parametrize("pair", PAIRS, ids=IDS)
def test_ui_layout_groups_and_files_note(pair, table):
    ui, _ = _load(pair)
    for node in ui["nodes"]:
        assert len(node["pos"]) == 2 and len(node["size"]) == 2, node["id"]
    assert ui["groups"], "no groups"
    for g in ui["groups"]:
        x, y, w, h = g["bounding"]
        assert w > 0 and h > 0 and g["title"]
    grouped = [n for n in ui["nodes"] if n["type"] not in wt.FRONTEND_ONLY and any(
        g["bounding"][0] <= n["pos"][0] and n["pos"][0] + n["size"][0] <= g["bounding"][0] + g["bounding"][2]
        and g["bounding"][1] <= n["pos"][1] and n["pos"][1] + n["size"][1] <= g["bounding"][1] + g["bounding"][3]
        for g in ui["groups"])]
    assert len(grouped) == len([n for n in ui["nodes"] if n["type"] not in wt.FRONTEND_ONLY]), "a node outside every group"
    # nodes never overlap: each with its 30 px title bar and at least the height the frontend
    # computes from its inputs and widgets (a node saved smaller is grown on load)
    boxes = [(n["id"], *wt.node_box(n, table)) for n in ui["nodes"]]
    for n in ui["nodes"]:
        if n["type"] in table:
            assert n["size"][1] >= wt.min_node_height(table[n["type"]]), \
                f"node {n['id']} {n['type']} saved {n['size'][1]} px tall, needs {wt.min_node_height(table[n['type']])}"
    for i, (a, ax, ay, aw, ah) in enumerate(boxes):
        for b, bx, by, bw, bh in boxes[i + 1:]:
            assert ax + aw <= bx or bx + bw <= ax or ay + ah <= by or by + bh <= ay, f"nodes {a} and {b} overlap"
    for i, a in enumerate(ui["groups"]):  # overlapping groups drag each other's nodes in the UI
        for b in ui["groups"][i + 1:]:
            (ax, ay, aw, ah), (bx, by, bw, bh) = a["bounding"], b["bounding"]
            assert ax + aw <= bx or bx + bw <= ax or ay + ah <= by or by + bh <= ay, \
                f"groups {a['title']!r} and {b['title']!r} overlap"
    notes = [n["widgets_values"][0] for n in ui["nodes"] if n["type"] in wt.FRONTEND_ONLY]
    assert notes, "no Note/MarkdownNote naming the model files"
    files = wt.model_files(ui)
    assert files
    text = "\n".join(notes)
    for folder, name in files:
        assert folder in MODEL_FOLDERS
        assert name in text and f"models/{folder}/" in text, f"the note does not say {name} goes in models/{folder}/"


def test_builder_gives_nodes_their_real_height_and_moves_the_next_one_down(table):
    """The layout bug of the ``parallel`` widget: a loader saved 130 px tall (the frontend draws it
    taller) sat 50 px above the next node. The builder now sizes it by the rule and stacks below."""
    bw = build_workflows
    g = bw.Graph("t", "uid", table)
    loader = dict(unet_name="x.safetensors", weight_dtype="default", devices="auto", reserve_vram_gb=1.0,
                  parallel="auto")
    real = wt.min_node_height(table["ShardDiTLoadDiffusionModel"])
    with pytest.raises(ValueError, match=f"height >= {real}"):
        g.node(1, "ShardDiTLoadDiffusionModel", (0, 0), (400, real - 24), **loader)
    g.node(1, "ShardDiTLoadDiffusionModel", (0, 0), (400, None), **loader)
    g.node(2, "ShardDiTLoadVAE", (0, 180), (400, None), vae_name="v.safetensors", device="auto")
    g.node(3, "ShardDiTLoadVAE", (440, 10), (400, None), vae_name="v.safetensors", device="auto")
    g.group("a", [1, 2])
    g.group("b", [3])
    g._stack()
    g._check_overlaps()
    assert g.nodes[1]["size"][1] == real
    assert g.nodes[2]["pos"][1] == real + wt.TITLE_H + bw.NODE_GAP  # below the loader, not at 180
    assert g.nodes[3]["pos"][1] == 10  # another column: not moved
    g.nodes[3]["pos"] = [300, 100]
    with pytest.raises(ValueError, match="overlap"):
        g._check_overlaps()


def test_committed_files_match_the_builder():
    """workflows/*.json are what tests/build_workflows.py writes (regenerate and review the diff)."""
    stale = [p.name for p, text in build_workflows.render_all().items() if not p.exists() or p.read_text() != text]
    assert not stale, f"out of date (run: python tests/build_workflows.py): {stale}"


def test_widget_map_handles_control_after_generate():
    spec = wt.CORE_NODES["KSamplerAdvanced"]
    vals = ["enable", 5, "randomize", 20, 3.5, "euler", "simple", 0, 10, "enable"]
    assert wt.widget_map(spec, vals)["noise_seed"] == 5
    with pytest.raises(ValueError):
        wt.widget_map(spec, ["enable", 5, 20, 3.5, "euler", "simple", 0, 10, "enable"])


def test_readme_shows_every_workflow_with_its_thumbnail_and_comfyui():
    """README's Workflows section: a row per UI workflow with its JPEG, its name and its mark."""
    text = (wt.REPO / "README.md").read_text()
    section = text[text.index("## Workflows\n"):text.index("\n## ", text.index("## Workflows\n") + 1)]
    for name, ui, _ in PAIRS:
        row = next((line for line in section.splitlines() if f"`{name}`" in line), "")
        assert f'<img src="workflows/{name}.jpg"' in row, f"README: no row with {name}'s thumbnail"
        assert f"| {wt.min_comfyui(wt.load(ui))} |" in row, f"README: {name}'s row lacks its ComfyUI version"


def test_readme_commands_name_files_that_exist_from_the_comfyui_folder():
    """README and workflows/README tell users to run ``comfy run --workflow PATH`` (and ``cat PATH``)
    from the ComfyUI folder, with the pack in custom_nodes/sharddit: every such PATH exists."""
    import re

    prefix = "custom_nodes/sharddit/"
    for doc in (wt.REPO / "README.md", wt.WORKFLOWS_DIR / "README.md"):
        paths = re.findall(r"(?:--workflow|cat|open\()\s*\"?(\S+?\.json)", doc.read_text())
        assert paths, doc.name
        for path in paths:
            assert path.startswith(prefix), f"{doc.name}: {path} does not work from the ComfyUI folder"
            assert (wt.REPO / path[len(prefix):]).is_file(), f"{doc.name}: {path} does not exist"
