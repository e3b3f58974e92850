"""Shipped workflows against real ComfyUI (>= 0.3.64): node tables, server-side validation, runs.

Needs COMFYUI_PATH. Uses the session test server (``comfy_server``, tests/harness/server.py) with
tiny random-weight models exposed under the REAL file names the workflows use
(``tiny_models.add_aliases``: symlinks, no extra disk; fixture ``workflow_models``).

- Validation: every API workflow the running ComfyUI is new enough for (``min_comfyui``; the
  others are skipped with the reason), unchanged (full resolution and frame count), is POSTed to
  ``/prompt``; ComfyUI validates it synchronously (node types, inputs, links, file names, each
  node's ``validate_inputs``) and answers ``node_errors``. So that nothing full-size ever runs,
  the worker is first kept busy by a tiny interruptible "blocker" prompt; the validated prompts
  wait in the queue and are deleted from it unrun, then the blocker is interrupted.
- End to end: the Wan 2.1 workflow with 64×64 pixels, 5 frames and 2 steps (overrides below) runs
  on CPU. Its text encoder is substituted by the harness's tiny UMT5 saved under the real name
  ``umt5_xxl_fp8_e4m3fn_scaled.safetensors``; the server's test-only ``sharddit_test_hooks``
  custom node makes ComfyUI build the tiny encoder from the config the file carries
  (``harness.tiny_models.install_tiny_te_hook``). DiT and VAE are tiny files of the real
  classes under the real names. The same run is repeated through comfy-cli's
  ``comfy run --workflow <api json> --wait``.
"""
import json
import time

import pytest

import workflow_tools as wt

pytestmark = pytest.mark.comfy

# Wan 2.1 end-to-end on CPU: latent 1×16×2×8×8, two steps.
WAN21_SMALL = {"EmptyHunyuanLatentVideo": {"width": 64, "height": 64, "length": 5},
               "ShardDiTKSampler": {"steps": 2}}

PAIRS = wt.workflow_pairs()
IDS = [name for name, _, _ in PAIRS]


def _running() -> str:
    from harness.comfy_env import comfy_version

    return comfy_version()


def _too_new(name: str) -> str | None:
    """Why this ComfyUI cannot take workflow ``name`` (its ``min_comfyui`` mark), else None."""
    mark = wt.min_comfyui(wt.load(wt.WORKFLOWS_DIR / f"{name}.json"))
    if wt.version_tuple(_running()) >= wt.version_tuple(mark):
        return None
    return (f"{name} needs ComfyUI >= {mark}, this is {_running()}: not validated here "
            f"(added after ComfyUI 0.3.64)")


def _skip_if_too_new(name: str) -> None:
    reason = _too_new(name)
    if reason:
        pytest.skip(reason)


# ----------------------------------------------------------------------------- fixtures
@pytest.fixture(scope="module")
def real_names(workflow_models):
    """Every model file any workflow names exists on the server (harness.fixtures.workflow_models)."""
    return workflow_models


def _small(api: dict, overrides: dict) -> dict:
    api = json.loads(json.dumps(api))
    for node in api.values():
        node["inputs"].update(overrides.get(node["class_type"], {}))
    return api


def _blocker(tiny_models) -> dict:
    """Core nodes only: a tiny Wan KSampler with 10000 steps, run until interrupted."""
    return {
        "1": {"class_type": "UNETLoader", "inputs": {"unet_name": tiny_models.names["wan21_t2v"], "weight_dtype": "default"}},
        "2": {"class_type": "CLIPLoader", "inputs": {"clip_name": tiny_models.names["umt5"], "type": "wan"}},
        "3": {"class_type": "CLIPTextEncode", "inputs": {"text": "blocker", "clip": ["2", 0]}},
        "4": {"class_type": "EmptyHunyuanLatentVideo", "inputs": {"width": 16, "height": 16, "length": 1, "batch_size": 1}},
        "5": {"class_type": "KSampler", "inputs": {"model": ["1", 0], "seed": 0, "steps": 10000, "cfg": 1.0,
                                                   "sampler_name": "euler", "scheduler": "simple", "positive": ["3", 0],
                                                   "negative": ["3", 0], "latent_image": ["4", 0], "denoise": 1.0}},
        "6": {"class_type": "SaveLatent", "inputs": {"samples": ["5", 0], "filename_prefix": "blocker/x"}},
    }


def _queue(server) -> dict:
    return server._get("/queue")


def _wait_running(server, prompt_id, timeout=120.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        running = [item[1] for item in _queue(server)["queue_running"]]
        if prompt_id in running:
            return
        if prompt_id in server.history(prompt_id):
            raise AssertionError(f"blocker {prompt_id} finished before it could block:\n{server.log_tail()}")
        time.sleep(0.2)
    raise AssertionError(f"blocker {prompt_id} never started\n{server.log_tail()}")


@pytest.fixture(scope="module")
def validation_answers(comfy_server, real_names):
    """``{workflow name: (status, body)}`` of POST /prompt for each unchanged API workflow, never run."""
    server = comfy_server
    blocker = server.queue_prompt(_blocker(real_names))
    answers, queued = {}, []
    try:
        _wait_running(server, blocker)
        for name, _, api_path in PAIRS:
            if _too_new(name):
                continue
            answer = server.validate(wt.load(api_path))
            answers[name] = (answer["status"], answer["body"])
            if answer["status"] == 200:
                queued.append(answer["body"]["prompt_id"])
        still_waiting = {item[1] for item in _queue(server)["queue_pending"]}
        assert set(queued) <= still_waiting, "a validated full-size workflow started running"
    finally:
        server._post("/queue", {"delete": queued}).raise_for_status()
        server.interrupt()
        deadline = time.monotonic() + 120
        while blocker not in server.history(blocker) and time.monotonic() < deadline:
            time.sleep(0.2)
    ran = [pid for pid in queued if pid in server.history(pid)]
    assert not ran, f"validated prompts ran: {ran}"
    return answers


# ----------------------------------------------------------------------------- node tables
def _comfy_inputs(cls) -> list:
    """``[(name, type, options dict, optional)]`` from a core node's INPUT_TYPES, in order."""
    it = cls.INPUT_TYPES()
    out = []
    for section in ("required", "optional"):
        for name, spec in it.get(section, {}).items():
            typ = spec[0]
            typ = "COMBO" if isinstance(typ, (list, tuple)) else str(getattr(typ, "value", typ))
            typ = typ.split(",")[0]  # a MultiType widget ("FLOAT,INT"): the widget's own type first
            opts = spec[1] if len(spec) > 1 and isinstance(spec[1], dict) else {}
            out.append((name, typ, opts, section == "optional"))
    return out


def test_core_node_table_matches_comfyui(comfy_env):
    """workflow_tools.CORE_NODES (the checked-in list) agrees with real NODE_CLASS_MAPPINGS: the same
    inputs in the same order, except optional inputs a newer ComfyUI appended; the same outputs,
    except ones a newer ComfyUI appended (workflows built from the table stay valid on it)."""
    mappings = comfy_env.nodes.NODE_CLASS_MAPPINGS
    running = wt.version_tuple(_running())
    for node_id, spec in wt.CORE_NODES.items():
        if running < wt.version_tuple(spec.since):  # the table says it came later: it must be absent
            assert node_id not in mappings, f"{node_id} exists in ComfyUI {_running()}: its since {spec.since} is wrong"
            continue
        assert node_id in mappings, f"{node_id} is not a core node of this ComfyUI"
        assert node_id not in comfy_env.pack_node_ids
        real = _comfy_inputs(mappings[node_id])
        n = len(spec.inputs)
        # 0.33's SaveVideo: `format` a dynamic combo (a combo whose options carry widgets), `codec` now
        # hidden and optional, its widget under format ("format.codec", the table's api_also)
        moved = {old for new, old in spec.extra.get("api_also", {}).items()
                 if new in wt.input_specs(mappings[node_id].INPUT_TYPES())}
        assert [(n, "COMBO" if t == "COMFY_DYNAMICCOMBO_V3" else t, o and n not in moved) for n, t, _, o in real[:n]] \
            == [(i.name, i.type, i.optional) for i in spec.inputs], node_id
        assert all(optional for *_, optional in real[n:]), f"{node_id}: new required inputs {real[n:]}"
        for (name, _, opts, _), inp in zip(real, spec.inputs):
            assert bool(opts.get("control_after_generate")) == inp.control, f"{node_id}.{name} control_after_generate"
            assert bool(opts.get("multiline")) == inp.multiline, f"{node_id}.{name} multiline (sets its height)"
        cls = mappings[node_id]
        outputs = [str(getattr(t, "value", t)) for t in cls.RETURN_TYPES]
        assert outputs[:len(spec.outputs)] == [t for _, t in spec.outputs], node_id
        assert bool(getattr(cls, "OUTPUT_NODE", False)) == spec.output_node, node_id
        real_name = comfy_env.nodes.NODE_DISPLAY_NAME_MAPPINGS.get(node_id) or node_id
        assert real_name in (wt.display_name(spec), wt.NEWER_DISPLAY_NAMES.get(node_id)), \
            f"{node_id}: display name {real_name!r}"


def test_sharddit_schemas_read_by_ast_match_define_schema(comfy_env):
    """The pure tests' ast reading of nodes/*.py equals the real V3 schemas (inputs, order, defaults)."""
    mappings = comfy_env.nodes.NODE_CLASS_MAPPINGS
    ours = wt.sharddit_schemas()
    assert sorted(ours) == sorted(comfy_env.pack_node_ids)
    for node_id, spec in ours.items():
        schema = mappings[node_id].define_schema()
        assert spec.extra["display_name"] == schema.display_name, node_id
        real = [(i.id, "COMBO" if isinstance(i.get_io_type(), list) else str(i.get_io_type()),  # CheckedCombo
                 bool(getattr(i, "optional", False)),
                 bool(getattr(i, "control_after_generate", False)), bool(getattr(i, "multiline", False)))
                for i in schema.inputs]
        assert real == [(i.name, i.type, i.optional, i.control, i.multiline) for i in spec.inputs], node_id
        for i, inp in zip(schema.inputs, spec.inputs):
            if inp.default is not None:
                assert getattr(i, "default", None) == inp.default, f"{node_id}.{inp.name} default"
            if inp.options is not None:
                assert tuple(i.options) == inp.options, f"{node_id}.{inp.name} options"


@pytest.mark.parametrize("pair", PAIRS, ids=IDS)
def test_workflow_inputs_valid_for_real_schemas(pair, comfy_env, real_names):
    """Every widget value of every node is accepted by the real schema (combos incl. sampler lists)."""
    import folder_paths

    _skip_if_too_new(pair[0])
    mappings = comfy_env.nodes.NODE_CLASS_MAPPINGS
    api = {**wt.ui_to_api(wt.load(pair[1]), wt.node_table(), include_muted=True), **wt.load(pair[2])}
    for node_id, node in api.items():
        assert node["class_type"] in mappings, f"{pair[0]} node {node_id}: {node['class_type']} is not registered"
        cls = mappings[node["class_type"]]
        real = wt.input_specs(cls.INPUT_TYPES())   # a dynamic combo's widgets as "combo.sub"
        newer = wt.CORE_NODES[node["class_type"]].extra.get("api_also", {}) if node["class_type"] in wt.CORE_NODES else {}
        for name, value in node["inputs"].items():
            if name in newer and name not in real:  # a newer ComfyUI's name for a widget this one has
                continue
            assert name in real, f"{pair[0]} node {node_id} {node['class_type']}: no input {name!r}"
            spec = real[name][0]
            opts = spec[1] if len(spec) > 1 and isinstance(spec[1], dict) else {}
            if isinstance(value, list):
                continue
            where = f"{pair[0]} node {node_id} {node['class_type']}.{name}"
            choices = spec[0] if isinstance(spec[0], (list, tuple)) else opts.get("options")
            if choices and all(isinstance(c, dict) and "key" in c for c in choices):  # a dynamic combo
                choices = [c["key"] for c in choices]
            if choices is not None and name not in ("unet_name", "clip_name", "clip_name1", "clip_name2",
                                                    "vae_name", "ckpt_name"):
                assert value in choices, f"{where}: {value!r} not in {list(choices)[:12]}"
            if "min" in opts:
                assert value >= opts["min"], where
            if "max" in opts:
                assert value <= opts["max"], where
    for folder, name in wt.model_files(wt.load(pair[1])):
        assert name in folder_paths.get_filename_list(folder) or folder == "checkpoints", (folder, name)


# ----------------------------------------------------------------------------- server
@pytest.fixture(scope="module")
def object_info(comfy_server):
    return comfy_server.object_info()


@pytest.mark.parametrize("pair", PAIRS, ids=IDS)
def test_comfy_cli_converts_ui_workflow_to_its_api_twin(pair, object_info):
    """An independent UI -> API converter (comfy-cli's port of the frontend's, fed the server's
    /object_info) turns each UI workflow into exactly its committed API twin."""
    from comfy_cli.workflow_to_api import convert_ui_to_api

    _skip_if_too_new(pair[0])
    converted = convert_ui_to_api(wt.load(pair[1]), object_info)
    twin = wt.strip_meta(wt.load(pair[2]))
    converted, twin = wt.comparable(wt.strip_meta(converted), twin, wt.object_info_types(object_info))
    assert converted == twin


@pytest.mark.parametrize("name", IDS)
def test_api_workflow_passes_comfyui_validation(name, validation_answers):
    _skip_if_too_new(name)
    status, body = validation_answers[name]
    assert status == 200 and body.get("node_errors") == {}, f"{name}: POST /prompt answered {status}: {body}"


def test_wan21_workflow_runs_end_to_end_on_cpu(comfy_server, real_names):
    api = _small(wt.load(wt.API_DIR / "wan2.1_t2v_14B_2gpu_api.json"), WAN21_SMALL)
    prompt_id = comfy_server.queue_prompt(api)
    comfy_server.wait(prompt_id, timeout=600)
    files = comfy_server.output_files(prompt_id)
    assert [f.suffix for f in files] == [".mp4"], files
    assert files[0].is_file() and files[0].stat().st_size > 0


def test_wan22_workflow_runs_both_experts_end_to_end_on_cpu(comfy_server, real_names):
    """The two-expert graph runs: tiny Wan 2.2 high- and low-noise DiTs under the real file names
    (``harness.fixtures.TEMPLATE_NAMES``), each loaded and sharded by its own ShardDiT loader, 64×64,
    5 frames, 4 steps split 2 + 2 between the two KSampler (Advanced) nodes; both experts are sharded
(two loader log lines) and the .mp4 exists."""
    api = _small(wt.load(wt.API_DIR / "wan2.2_t2v_A14B_2gpu_api.json"), WAN21_SMALL)
    experts = sorted((n["inputs"]["start_at_step"], i) for i, n in api.items() if n["class_type"] == "KSamplerAdvanced")
    (_, high), (_, low) = experts
    api[high]["inputs"].update(steps=4, end_at_step=2)
    api[low]["inputs"].update(steps=4, start_at_step=2)
    before = len(comfy_server.messages())
    prompt_id = comfy_server.queue_prompt(api)
    comfy_server.wait(prompt_id, timeout=600)
    files = comfy_server.output_files(prompt_id)
    assert [f.suffix for f in files] == [".mp4"], files
    assert files[0].is_file() and files[0].stat().st_size > 0
    sharded = [m for m in comfy_server.messages()[before:] if "[ShardDiT] WanModel:" in m and "blocks sharded" in m]
    assert len(sharded) == 2, f"expected both experts loaded and sharded, got {sharded}\n{comfy_server.log_tail()}"


def test_comfy_cli_run_wait(comfy_server, real_names, tmp_path):
    """comfy-cli: ``comfy run --workflow <api json> --wait`` against the test server; output exists."""
    from harness.server import comfy_run, parse_comfy_run_events

    api = _small(wt.load(wt.API_DIR / "wan2.1_t2v_14B_2gpu_api.json"), WAN21_SMALL)
    api["11"]["inputs"]["filename_prefix"] = "video/comfy_cli_run"
    path = tmp_path / "wan2.1_t2v_14B_2gpu_small_api.json"
    path.write_text(json.dumps(api, indent=2, ensure_ascii=False))
    proc = comfy_run(path, comfy_server, timeout=600)
    events = parse_comfy_run_events(proc.stdout)
    detail = (f"rc={proc.returncode}\nstdout tail:\n{proc.stdout[-2000:]}\nstderr tail:\n{proc.stderr[-2000:]}\n"
              f"{comfy_server.log_tail()}")
    assert proc.returncode == 0 and events and events[-1].get("ok") is True, detail
    files = comfy_server.output_files(events[-1]["data"]["prompt_id"])
    assert [f.suffix for f in files] == [".mp4"], (files, detail)
    assert files[0].name.startswith("comfy_cli_run") and files[0].is_file() and files[0].stat().st_size > 0
