"""The sharded core templates (workflows/*_sharddit.json) against ComfyUI 0.29, in this process.

- The committed files are what tests/build_template_workflows.py makes from the installed
  templates package (reproducible: regenerate and review the diff when ComfyUI's templates change).
- Each keeps its template: every node, group, note and subgraph of the template is there with its
  values; the only new nodes are the Shard nodes, the ShardDiT note and the Plan node.
- Each API twin passes ComfyUI's own ``validate_prompt`` unchanged (full size; file names point at
  tiny files, which validation never opens).

ComfyUI 0.3.64 has neither the templates package nor the nodes they use: skipped there.
"""
import pytest

import build_template_workflows as btw
import workflow_tools as wt
from harness import templates as tpl
from harness.fixtures import TEMPLATE_FOLDER_KINDS

pytestmark = pytest.mark.comfy

PAIRS = wt.workflow_pairs(kind="template")
IDS = [name for name, _, _ in PAIRS]
SPECS = {t.name: t for t in btw.TEMPLATES}


@pytest.fixture(scope="module")
def comfy029(env):
    """``env``, or a skip on a ComfyUI without the 2026 templates (0.3.64)."""
    import comfyui_version

    if tpl.template_path(btw.TEMPLATES[0].template) is None:
        pytest.skip(f"ComfyUI {comfyui_version.__version__} installs no {tpl.TEMPLATES_PACKAGE} templates "
                    "(added after ComfyUI 0.3.64)")
    return env


def test_committed_files_match_the_generator(comfy029):
    from sharddit.loaders.simulator import presets

    files = btw.render_all(comfy029.nodes.NODE_CLASS_MAPPINGS, presets.preset_names())
    stale = [p.name for p, text in files.items() if not p.exists() or p.read_text() != text]
    assert not stale, f"out of date (run: COMFYUI_PATH=... python tests/build_template_workflows.py): {stale}"


@pytest.mark.parametrize("name", IDS)
def test_workflow_keeps_the_template(comfy029, name):
    ui = wt.load(next(p[1] for p in PAIRS if p[0] == name))
    template = tpl.load_template(SPECS[name].template)
    ours = {"top": ui, **{g["id"]: g for g in tpl.graphs(ui)[1:]}}
    for graph in tpl.graphs(template):
        mine = ours["top" if graph is template else graph["id"]]
        nodes = {n["id"]: n for n in mine["nodes"]}
        for node in graph["nodes"]:
            kept = nodes[node["id"]]
            assert (kept["type"], kept.get("mode", 0), kept.get("widgets_values"), kept.get("title")) == \
                (node["type"], node.get("mode", 0), node.get("widgets_values"), node.get("title")), node["id"]
        added = {n["type"] for n in mine["nodes"] if n["id"] not in {m["id"] for m in graph["nodes"]}}
        assert added <= {tpl.SHARD_NODE, "MarkdownNote", "ShardDiTPlan"}, added
        assert [g["title"] for g in graph.get("groups", [])] == [g["title"] for g in mine.get("groups", [])][
            :len(graph.get("groups", []))]


@pytest.fixture(scope="module")
def template_model_names(comfy029, tiny_models, tmp_path_factory):
    """Every model file the workflows name is in ComfyUI's lists (symlinks to tiny files)."""
    import folder_paths

    extra = tmp_path_factory.mktemp("template_workflow_files")
    for _, ui, _ in PAIRS:
        for folder, file in tpl.model_files(wt.load(ui)):
            if file in tiny_models.aliases:
                continue
            if folder in TEMPLATE_FOLDER_KINDS:
                tiny_models.add_aliases({file: TEMPLATE_FOLDER_KINDS[folder]})
            else:
                (extra / folder).mkdir(exist_ok=True)
                (extra / folder / file).symlink_to(tiny_models.path("umt5"))
                folder_paths.add_model_folder_path(folder, str(extra / folder))
    getattr(folder_paths, "filename_list_cache", {}).clear()


@pytest.mark.parametrize("name", IDS)
def test_api_twin_passes_comfyui_validation(comfy029, template_model_names, name):
    api = wt.load(next(p[2] for p in PAIRS if p[0] == name))
    ok, error, outputs, node_errors = tpl.validate(api)
    assert ok and outputs, f"{name}: {error} {node_errors}"
    assert tpl.api_ids(api, tpl.SHARD_NODE)


@pytest.mark.parametrize("name", IDS)
def test_plan_node_settings_pass_the_plans_checks(comfy029, name):
    """The muted "Will it fit?" Plan node, once a user unmutes it, plans as set: its preset, size,
    frames, dtype and cfg pass the simulator's own checks (the preset exists, the size is on the
    model's token grid: LTX-2.3's 1280x720 template samples a 1280x704 latent). The simulation itself
    runs per preset in test_simulator_comfy / test_presets_2026_comfy; here only the checks, on two
    imagined 24 GiB GPUs instead of the node's ``auto``."""
    from sharddit.loaders.simulator.simulator import check_simulation

    ui = wt.load(next(p[1] for p in PAIRS if p[0] == name))
    (node,) = [n for n in ui["nodes"] if n["type"] == "ShardDiTPlan"]
    schema = comfy029.nodes.NODE_CLASS_MAPPINGS["ShardDiTPlan"].define_schema()
    values = dict(zip([i.id for i in schema.inputs], node["widgets_values"], strict=True))
    spec = SPECS[name]
    assert (values["model"], values["width"], values["height"], values["frames"], values["dtype"], values["cfg"]) == \
        (spec.model, spec.width, spec.height, spec.frames, spec.dtype, spec.cfg)
    setup = check_simulation(values["model"], "cuda:0=24GiB,cuda:1=24GiB", values["width"], values["height"],
                             values["frames"], None if values["batch"] == "auto" else int(values["batch"]),
                             values["dtype"], values["reserve_vram_gb"], parallel=values["parallel"],
                             cfg=values["cfg"])
    assert setup is not None
