"""Core ComfyUI's own video templates with ShardDiT's Shard node inserted, run in this process.

Issue 24 item 3: people open core's templates (package ``comfyui_workflow_templates_json``,
installed with ComfyUI 0.29), not our workflows. Each test reads a template from the installed
package, converts it to API form unmodified and sharded by the product's transform
(``loaders/workflow/shard_transform.py`` ``shard_workflow``: a ``ShardDiTShardModel`` after every DiT loader;
its ``devices`` then set to ``cpu,cpu`` and ``parallel`` to the case's mode in the API prompt), shrinks it (CPU, 2 steps, a few latent pixels) and runs both
through ComfyUI's own ``validate_prompt`` + ``PromptExecutor`` with tiny random-weight models of
the same classes saved under the template's file names. The final sampler's latents must be
bit-identical in ``blocks`` mode (every GEMM sees the shapes of the unsharded run) and within
``COMFY_SPLIT_BOUND`` in ``sequence`` mode (tokens split: smaller GEMMs, see
tests/harness/numerics.py). Measured (torch 2.14.1, AMD EPYC AVX2 host, MKL_CBWR default,
COMPATIBLE and AVX2): ``sequence`` max diff 0 for Wan 2.2 and HunyuanVideo 1.5 (the families
that split tokens; for HunyuanVideo 1.5 the engine's stats show every block call split); the
bound stays the one measured for tiny real models across hosts (numerics.py), as other hosts'
kernels may differ. Time after the session's ComfyUI import, on a 2-core host at load 5-7
(other suites running): the file ~60-70 s, of it LTX-2.3 ~23 s (its positive prompt is encoded
again in each sharded run: the prompt enhancer's lazy branch hangs off the sharded model's LoRA
and ComfyUI's cache keys on it); a single LTX-2.3 sharded run alone takes 4.4 s. First build of
the tiny files ~8 s more (then cached).

All four run (``RUNS``): Wan 2.2 14B t2v (two experts, KSamplerAdvanced); HunyuanVideo 1.5 720p
t2v (SamplerCustomAdvanced + CFGGuider at cfg 6; its super-resolution stage is bypassed in the
template and stays so); Kandinsky 5 t2v (KSampler, cfg 5); LTX-2.3 t2v (CheckpointLoaderSimple:
DiT, video VAE and audio VAE in one file; the distilled LoRA; two SamplerCustomAdvanced stages at
cfg 1 with the x2 latent upscaler between them). The tiny files are ``harness.tiny_templates``'s,
under the templates' own names. LTX-2.3's prompt enhancer (Gemma 3 generating a new prompt, behind
the template's "Enable Prompt Enhance" switch) is switched off: the switch is lazy, so the
generation, its abliterated-Gemma LoRA and its preview never run; the typed prompt is encoded as
with the switch off in the UI. All four split tokens in `sequence` (LTX-2.3: the video tokens, the
audio whole on every rank; parallel/families.py); a family that did not would have to say it fell
back and equal the template bit for bit (``Run.splits``).
ComfyUI 0.3.64 has neither the package nor the nodes the templates use (``ComfySwitchNode``,
``ComfyMathExpression``): skipped there.
"""
import dataclasses

import pytest
import torch
from harness import templates as tpl
from harness.comfy_env import pack_module
from harness.numerics import (
    COMFY_SPLIT_BOUND,
    assert_same_shapes_equal,
    assert_split_close,
)

pytestmark = pytest.mark.comfy

WAN22 = "video_wan2_2_14B_t2v.json"
# Files the Wan 2.2 template names beyond harness.fixtures.TEMPLATE_NAMES. The Lightning LoRAs
# sit behind the template's turbo switch (off): validated by name, never loaded.
WAN22_NAMES = {"wan2.2_t2v_lightx2v_4steps_lora_v1.1_high_noise.safetensors": "wan21_lora",
               "wan2.2_t2v_lightx2v_4steps_lora_v1.1_low_noise.safetensors": "wan21_lora"}
# API id -> (class_type, inputs): 64x64 pixels, duration 0.25 s at 16 fps -> floor(0.25*16)+1 = 5
# frames (latent 1x16x2x8x8), 2 steps with the expert switch after step 1; cfg stays the
# template's 3.5 (cond and uncond both run).
WAN22_SMALL = {"128:74": ("EmptyHunyuanLatentVideo", {"width": 64, "height": 64}),
               "128:126": ("PrimitiveFloat", {"value": 0.25}),
               "128:114": ("PrimitiveInt", {"value": 2}),
               "128:115": ("PrimitiveInt", {"value": 1})}
WAN22_LATENT = "128:78"   # the low-noise expert's KSamplerAdvanced: the template's final latent


def _template(env, name):
    """The installed template, or a skip on a ComfyUI older than the 2026 templates and nodes."""
    import comfyui_version

    version = comfyui_version.__version__
    if tpl.template_path(name) is None:
        pytest.skip(f"ComfyUI {version} installs no {tpl.TEMPLATES_PACKAGE} templates (added after ComfyUI 0.3.64)")
    ui = tpl.load_template(name)
    missing = sorted(tpl.node_types(ui) - set(env.nodes.NODE_CLASS_MAPPINGS))
    if missing and version.startswith("0.3."):
        pytest.skip(f"ComfyUI {version} lacks the nodes {missing} of {name} (added after ComfyUI 0.3.64)")
    return ui


def _small(api, overrides):
    for node_id, (class_type, inputs) in overrides.items():
        assert api[node_id]["class_type"] == class_type, f"template changed: {node_id} is {api[node_id]['class_type']}"
        api[node_id]["inputs"].update(inputs)
    return api


def _shard(env, ui):
    """The template through the product's transform (at least one Shard node added)."""
    result = pack_module(env, "loaders.workflow.shard_transform").shard_workflow(ui)
    assert result.added, result.reason
    return result.workflow


def _api(env, ui, parallel=None):
    """The API prompt of ``ui``; with ``parallel``, of ``ui`` sharded, its Shard nodes on
    ``cpu,cpu`` in that mode (the transform inserts them with ``devices`` and ``parallel`` auto)."""
    api = tpl.ui_to_api(_shard(env, ui) if parallel else ui, tpl.comfy_widget_inputs(env.nodes.NODE_CLASS_MAPPINGS))
    for node_id in tpl.api_ids(api, tpl.SHARD_NODE) if parallel else ():
        assert api[node_id]["inputs"]["devices"] == "auto" and api[node_id]["inputs"]["parallel"] == "auto"
        api[node_id]["inputs"].update(devices="cpu,cpu", parallel=parallel)
    return api


def _latents(env, ui, overrides, output, parallel=None):
    api = _small(_api(env, ui, parallel), overrides)
    return tpl.run_prompt(api, [output])[output][0][0]["samples"]  # slot 0, first of its list


@pytest.fixture(scope="module")
def wan22(env, tiny_models):
    """(template UI, unsharded final latents)."""
    ui = _template(env, WAN22)
    tiny_models.add_aliases(WAN22_NAMES)
    return ui, _latents(env, ui, WAN22_SMALL, WAN22_LATENT)


def test_wan22_shard_node_sits_after_each_expert_loader(env):
    """Two UNETLoaders inside the template's subgraph -> two Shard nodes in that subgraph, each
    feeding everything the loader fed; the API form routes the samplers' models through them."""
    ui = _template(env, WAN22)
    sharded = _shard(env, ui)
    assert tpl.nodes_of(ui, tpl.SHARD_NODE) == []
    shards = tpl.nodes_of(sharded, tpl.SHARD_NODE)
    assert len(shards) == 2 and all(s in sharded["definitions"]["subgraphs"][0]["nodes"] for s in shards)
    api = _api(env, ui, "blocks")
    shard_ids = tpl.api_ids(api, tpl.SHARD_NODE)
    loaders = {api[i]["inputs"]["model"][0] for i in shard_ids}
    assert loaders == set(tpl.api_ids(api, "UNETLoader")), loaders
    fed = {tuple(v["inputs"][k]) for v in api.values() for k in ("on_false", "on_true", "model")
           if v["class_type"] in ("ComfySwitchNode", "LoraLoaderModelOnly") and k in v["inputs"]}
    assert {(i, 0) for i in shard_ids} <= fed and not {(i, 0) for i in loaders} & fed
    assert api[shard_ids[0]]["inputs"] | {"model": None} == {"model": None, "devices": "cpu,cpu",
                                                             "reserve_vram_gb": 1.0, "parallel": "blocks"}


@pytest.mark.parametrize("parallel", ["blocks", "sequence"])
def test_wan22_template_sharded_matches_the_template(env, wan22, parallel, caplog):
    """KSamplerAdvanced's two experts (high noise steps 0-1, low noise 1-2), cfg 3.5, on cpu,cpu;
    both experts' sampling calls really went through the requested mode (the log says so)."""
    ui, reference = wan22
    with caplog.at_level("INFO", logger="sharddit"):
        out = _latents(env, ui, WAN22_SMALL, WAN22_LATENT, parallel)
    modes = [r.getMessage() for r in caplog.records if f"parallel {parallel} -> " in r.getMessage()]
    assert len(modes) == 2 and all(f"-> {parallel}:" in m for m in modes), modes
    assert reference.shape == (1, 16, 2, 8, 8)
    if parallel == "blocks":
        assert_same_shapes_equal(out, reference, f"Wan 2.2 template, {parallel}")
    else:
        assert_split_close(out, reference, COMFY_SPLIT_BOUND, f"Wan 2.2 template, {parallel}")


LTX23, HV15, K5 = "video_ltx2_3_t2v.json", "video_hunyuan_video_1.5_720p_t2v.json", "video_kandinsky5_t2v.json"
TEMPLATES = [WAN22, LTX23, HV15, K5]


@dataclasses.dataclass(frozen=True)
class Run:
    """How a template is shrunk and what is compared: ``small`` as WAN22_SMALL; ``latents`` the
    ``(API id, output slot)`` pairs of the final latents; ``splits`` whether `sequence` splits
    tokens for this family (else it falls back to `blocks`, and says so)."""

    small: dict
    latents: tuple
    splits: bool


RUNS = {
    # 128x128 pixels, 5 frames -> latent 1x32x2x8x8 (HunyuanVideo 1.5's x16 VAE); 2 steps; cfg 6
    HV15: Run({"124": ("EmptyHunyuanVideo15Latent", {"width": 128, "height": 128, "length": 5}),
               "128": ("BasicScheduler", {"steps": 2})}, (("127", 0),), True),
    # 64x64 pixels, 5 frames -> latent 1x16x2x8x8; 2 steps of euler_ancestral (seeded); cfg 5
    K5: Run({"12:5": ("Kandinsky5ImageToVideo", {"width": 64, "height": 64, "length": 5}),
             "12:8": ("KSampler", {"steps": 2})}, (("12:8", 0),), True),
    # 128x128 at 8 fps for 1 s -> 9 frames: stage 1 at 64x64 (latent 128x2x2x2 + audio 8x29x16),
    # the x2 upscaler, stage 2 at 128x128; 2 sigmas steps per stage; the prompt enhancer off (lazy
    # switch); the unused start image small. Compared: stage 2's video and audio latents.
    LTX23: Run({"267:257": ("PrimitiveInt", {"value": 128}), "267:258": ("PrimitiveInt", {"value": 128}),
                "267:225": ("PrimitiveInt", {"value": 1}), "267:260": ("PrimitiveInt", {"value": 8}),
                "267:252": ("ManualSigmas", {"sigmas": "1.0, 0.725, 0.0"}),
                "267:211": ("ManualSigmas", {"sigmas": "0.85, 0.4219, 0.0"}),
                "267:330": ("PrimitiveBoolean", {"value": False}),
                "267:325": ("EmptyImage", {"width": 64, "height": 64}),
                "267:235": ("ResizeImagesByLongerEdge", {"longer_edge": 128})},
               (("267:218", 0), ("267:218", 1)), True),
}


def _run(env, ui, run, executor, parallel=None):
    api = _small(_api(env, ui, parallel), run.small)
    ids = sorted({i for i, _ in run.latents})
    out = tpl.run_prompt(api, ids, executor)
    return [out[i][slot][0]["samples"] for i, slot in run.latents], api


@pytest.fixture(scope="module")
def template_models(env, tmp_path_factory):
    """The tiny files of HV15, K5 and LTX23 under their names, found first by ComfyUI's loaders."""
    if tpl.template_path(HV15) is None:
        return {}
    from harness import tiny_templates

    written = tiny_templates.write_template_models(tmp_path_factory.mktemp("template_models"))
    getattr(env.folder_paths, "filename_list_cache", {}).clear()
    return written


@pytest.fixture(scope="module")
def references():
    """Per template: (its executor, the unsharded final latents), run once by the first test that
    needs them. The sharded runs go through the same executor, as a server runs a changed prompt:
    ComfyUI's cache hands them the outputs of the template's run for every node whose inputs did
    not change (the loaders, the text encodes not downstream of the model), and everything from
    the Shard node on runs again."""
    return {}


@pytest.mark.parametrize("parallel", ["blocks", "sequence"])
@pytest.mark.parametrize("name", list(RUNS))
def test_template_sharded_matches_the_template(env, template_files, references, name, parallel, caplog):
    """The template with a Shard node after its DiT loader on ``cpu,cpu`` against the template
    itself: `blocks` bit-identical; `sequence` within COMFY_SPLIT_BOUND where the family splits
    tokens, else the log says it fell back to `blocks` and the latents are bit-identical."""
    ui, run = _template(env, name), RUNS[name]
    if name not in references:
        executor = tpl.new_executor()
        references[name] = executor, _run(env, ui, run, executor)[0]
    executor, reference = references[name]
    with caplog.at_level("INFO", logger="sharddit"):
        got, api = _run(env, ui, run, executor, parallel)
    modes = [r.getMessage() for r in caplog.records if f"parallel {parallel} -> " in r.getMessage()]
    assert modes, f"{name}: the Shard node's model never sampled in {parallel}"
    split = parallel == "sequence" and run.splits
    if parallel == "sequence" and not run.splits:
        assert all("-> blocks:" in m and "runs in blocks mode only" in m for m in modes), modes
    else:
        assert all(f"-> {parallel}:" in m for m in modes), modes
    if split:  # the tokens really were split: no block call ran whole
        (shard,) = tpl.api_ids(api, tpl.SHARD_NODE)
        model = tpl.cached_outputs(executor, [shard])[shard][0][0]
        stats = pack_module(env, "loaders.comfy.shard.hooks").get_shard_state(model).router.engine.stats
        assert stats.fallbacks == 0 and min(stats.blocks_run) > 0, stats
    for (node, slot), out, ref in zip(run.latents, got, reference):
        what = f"{name} {node}[{slot}] {parallel}"
        assert torch.isfinite(ref).all() and ref.abs().max() > 0, what
        if split:
            assert_split_close(out, ref, COMFY_SPLIT_BOUND, what)
        else:
            assert_same_shapes_equal(out, ref, what)


# A tiny model kind per folder, for file names that are only validated (the kind is irrelevant).
ANY_KIND = {"diffusion_models": "wan21_t2v", "text_encoders": "umt5", "vae": "wan21_vae", "loras": "wan21_lora"}


@pytest.fixture(scope="module")
def template_files(env, tiny_models, template_models, tmp_path_factory):
    """Every model file the four templates name is in ComfyUI's lists (symlinks to a tiny file):
    enough for ``validate_prompt``, which checks names, never contents."""
    import folder_paths

    extra = tmp_path_factory.mktemp("template_files")
    for name in TEMPLATES:
        if tpl.template_path(name) is None:
            return
        for folder, file in tpl.model_files(tpl.load_template(name)):
            if file in tiny_models.aliases or (folder, file) in template_models:
                continue
            if folder in ANY_KIND:
                tiny_models.add_aliases({file: ANY_KIND[folder]})
            else:
                (extra / folder).mkdir(exist_ok=True)
                (extra / folder / file).symlink_to(tiny_models.path("umt5"))
                folder_paths.add_model_folder_path(folder, str(extra / folder))
    getattr(folder_paths, "filename_list_cache", {}).clear()


def test_converter_agrees_with_the_shipped_workflows_api_twins(env):
    """harness.templates.ui_to_api (widget names from the real classes) gives, for each shipped UI
    workflow, the API twin workflow_tools wrote from its checked-in table (the twins are what the
    frontend queues: tests/test_browser_ui.py). A workflow needing a newer ComfyUI (its
    ``min_comfyui``: 0.29's nodes on 0.3.64) is left out."""
    import workflow_tools as wt
    from harness.comfy_env import comfy_version

    mappings = env.nodes.NODE_CLASS_MAPPINGS
    widgets = tpl.comfy_widget_inputs(mappings)
    running = wt.version_tuple(comfy_version())
    pairs = [p for p in wt.workflow_pairs() if wt.version_tuple(wt.min_comfyui(wt.load(p[1]))) <= running]
    assert pairs, "no shipped workflow runs on this ComfyUI"
    for name, ui_path, api_path in pairs:
        converted, twin = wt.comparable(wt.strip_meta(tpl.ui_to_api(wt.load(ui_path), widgets)),
                                        wt.strip_meta(wt.load(api_path)), lambda c: mappings[c].INPUT_TYPES())
        assert converted == twin, name
