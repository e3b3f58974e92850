"""``ShardDiTPlan`` inside real ComfyUI (CPU): registered, schema, picture and text in the UI, STRING out."""
import re
from pathlib import Path

import pytest

from harness.comfy_env import load_comfy, pack_module

pytestmark = pytest.mark.comfy


@pytest.fixture(scope="module")
def env():
    return load_comfy()


def test_schema(env):
    node = env.nodes.NODE_CLASS_MAPPINGS["ShardDiTPlan"]
    schema = node.define_schema()
    assert schema.display_name == "Placement Plan (ShardDiT)" and schema.category == "sharddit/debug"
    assert schema.is_output_node
    ids = [i.id for i in schema.inputs]
    assert ids == ["devices", "model", "width", "height", "frames", "batch", "dtype", "reserve_vram_gb",
                   "parallel", "cfg", "gpu", "link_gbps"]
    assert all(i.optional for i in schema.inputs[8:])  # saved workflows without them keep validating
    assert all(i.tooltip for i in schema.inputs) and all(o.tooltip for o in schema.outputs)
    model = next(i for i in schema.inputs if i.id == "model")
    assert "wan2.1-t2v-14b" in model.options and "hunyuanvideo-13b" in model.options


def test_execute_shows_plan_text(env):
    node = env.nodes.NODE_CLASS_MAPPINGS["ShardDiTPlan"]
    out = node.execute(devices="cuda:0=8GiB,cuda:1=8GiB", model="wan2.1-t2v-1.3b", width=256, height=256,
                       frames=5, batch="auto", dtype="bf16", reserve_vram_gb=1.0)
    text = out.result[0]
    # the whole 1.3B model fits beside each GPU's share: every block resident, sequence pays (issue 34)
    assert isinstance(text, str) and "FITS: sequence over 2 GPUs (cond+uncond split first, then tokens)." in text
    assert "cuda:0 | home + blocks 0-29" in text
    assert out.ui["text"] == (text,)
    # the picture: one PNG in ComfyUI's temp folder, shown by the frontend's image preview
    from PIL import Image

    (image,) = out.ui["images"]
    assert image["type"] == "temp" and out.ui["animated"] == (False,)
    path = Path(env.folder_paths.get_temp_directory()) / image["subfolder"] / image["filename"]
    with Image.open(path) as png:
        assert png.format == "PNG" and png.width == 600 and 200 < png.height < 400
        # the title is drawn green: it fits
        assert (90, 200, 110) in {png.convert("RGB").getpixel((x, 24)) for x in range(16, 120)}


def test_execute_on_this_machine_lists_holdings(env):
    """devices 'auto' reads this machine (CPU only here): the inventory table has the holdings
    columns and the DiT is simulated on cpu."""
    node = env.nodes.NODE_CLASS_MAPPINGS["ShardDiTPlan"]
    out = node.execute(devices="auto", model="wan2.1-t2v-1.3b", width=128, height=128, frames=1,
                       batch="1", dtype="fp8", reserve_vram_gb=0.0)
    text = out.result[0]
    assert "ComfyUI holds" in text and "ShardDiT holds" in text
    assert re.search(r"^cpu +\| home \+ blocks 0-29 ", text, re.M), text


def test_holdings_and_current_placements_from_loaded_models(env, tiny_models):
    """A real sharded model, loaded by ComfyUI's sampler: its main patcher and shards count as
    'ShardDiT holds', other loaded models as 'ComfyUI holds', and its plan is listed."""
    import torch

    plan_node = pack_module(env, "loaders.plan.node_logic")
    N = env.nodes.NODE_CLASS_MAPPINGS
    env.mm.unload_all_models()
    model = N["ShardDiTLoadDiffusionModel"].execute(tiny_models.names["wan21_t2v"], "default", "cpu,cpu", 0.0).result[0]
    cond = [[torch.zeros(1, 4, 4096), {}]]
    N["ShardDiTKSampler"].execute(model, 1, 1, 2.0, "euler", "simple", cond, cond,
                                  {"samples": torch.zeros(1, 16, 1, 4, 4)}, 1.0, "auto")
    vae = env.nodes.VAELoader().load_vae(tiny_models.names["wan21_vae"])[0]
    env.mm.load_models_gpu([vae.patcher])

    ours = sum(lm.model.loaded_size() for lm in env.mm.current_loaded_models if lm.model is not vae.patcher)
    assert plan_node.read_holdings() == {"cpu": (vae.patcher.loaded_size(), ours)}
    assert ours == model.model_size() + sum(s.model_size() for s in
                                            pack_module(env, "loaders.comfy.shard.hooks").get_shard_patchers(model))
    text = plan_node.describe_current_placements(None)
    assert text.startswith("Loaded now, sharded by ShardDiT: WanModel") and "'blocks': [['cpu', 0, 2], ['cpu', 2, 4]]" in text
    env.mm.unload_all_models()


def test_batch_outside_the_list_refused(env):
    """V3 combos are not checked by ComfyUI 0.3.64: batch "3" used to print a nonsense plan. There the
    combos are typed by their lists, which ComfyUI checks; 0.29 checks V3 combos itself
    (tests/test_node_validation_server_comfy.py on both), and execute checks again."""
    node = env.nodes.NODE_CLASS_MAPPINGS["ShardDiTPlan"]
    inputs = {i.id: i for i in node.define_schema().inputs}
    assert inputs["batch"].options == ["auto", "1", "2"] and inputs["parallel"].options == ["auto", "blocks", "sequence"]
    assert "wan2.1-t2v-14b" in inputs["model"].options and inputs["dtype"].options == ["bf16", "fp16", "fp8"]
    checks_v3 = pack_module(env, "loaders.comfy.core.features").core_checks_v3_combos()
    # the form this core checks: "COMBO" where it checks V3 combos (0.29), the options list elsewhere (0.3.64)
    for name in ("batch", "parallel", "model", "dtype"):
        assert inputs[name].get_io_type() == ("COMBO" if checks_v3 else inputs[name].options), name
    with pytest.raises(ValueError, match="batch '3'"):
        node.execute(devices="cuda:0=8GiB", model="wan2.1-t2v-1.3b", width=256, height=256, frames=5, batch="3",
                     dtype="bf16", reserve_vram_gb=1.0)


@pytest.mark.parametrize("bad,words", [
    ({"cfg": 0.5}, "cfg 0.5 must be a number >= 1"),
    ({"cfg": float("nan")}, "cfg nan must be a number >= 1"),
    ({"gpu": "GTX 480"}, "'GTX 480' is not in the throughput table"),
    ({"link_gbps": -1.0}, "link bandwidth -1.0 must be a number of GB/s > 0"),
    ({"parallel": "fast"}, "parallel 'fast' is not one of auto, blocks, sequence"),
])
def test_bad_strategy_inputs_are_refused_with_the_fix(env, bad, words):
    """validate_inputs takes gpu alone (ComfyUI repeats its message under every input it takes;
    cfg and link_gbps get core's min/max there); execute refuses each before simulating (NaN too)."""
    node = env.nodes.NODE_CLASS_MAPPINGS["ShardDiTPlan"]
    if "gpu" in bad:
        assert words in node.validate_inputs(**bad)
    with pytest.raises(ValueError, match=re.escape(words)):
        node.execute(devices="cuda:0=8GiB", model="wan2.1-t2v-1.3b", width=256, height=256, frames=5, batch="auto",
                     dtype="bf16", reserve_vram_gb=1.0, **bad)


def test_good_strategy_inputs_pass_validation(env):
    node = env.nodes.NODE_CLASS_MAPPINGS["ShardDiTPlan"]
    assert node.validate_inputs(gpu="H100") is True
    assert node.validate_inputs(gpu="") is True  # the default: the devices' NVML names


def test_execute_lists_core_options_where_this_comfyui_has_them(env):
    """The node's text carries core's own options (0.29: dynamic VRAM and the MultiGPU CFG Split,
    feature-detected) or says this core has neither (0.3.64). Wan 1.3B bf16 on two 8 GiB GPUs: a full
    copy fits each (832×480×33), so core's CFG split is as fast as sequence and the decision line says so."""
    import os

    root = Path(os.environ["COMFYUI_PATH"])
    has_split = (root / "comfy" / "multigpu.py").exists() and (root / "comfy_extras" / "nodes_multigpu.py").exists()
    has_dynamic = "class ModelPatcherDynamic" in (root / "comfy" / "model_patcher.py").read_text()
    node = env.nodes.NODE_CLASS_MAPPINGS["ShardDiTPlan"]
    text = node.execute(devices="cuda:0=8GiB,cuda:1=8GiB", model="wan2.1-t2v-1.3b", width=832, height=480, frames=33,
                        batch="auto", dtype="bf16", reserve_vram_gb=1.0, parallel="auto", cfg=6.0, gpu="RTX 4090").result[0]
    decision = next(line for line in text.splitlines() if line.startswith("auto → "))
    assert decision.startswith("auto → sequence: predicted")
    assert bool(re.search(r"^core_cfg_split +\| .* \| yes$", text, re.MULTILINE)) == has_split, text
    assert ("core's CFG split predicted" in decision and "— as fast as sequence; use it if you prefer core"
            in decision) == has_split, decision
    assert ("core_cfg_split on cuda:0,cuda:1 (core's MultiGPU CFG Split node: a full copy of the DiT on each)"
            in text) == has_split
    assert bool(re.search(r"^dynamic_vram +\| .* \| yes$", text, re.MULTILINE)) == has_dynamic, text
    assert ("dynamic_vram: on ComfyUI with dynamic VRAM (NVIDIA)" in text) == has_dynamic
    assert ("core's own options: neither in this ComfyUI" in text) == (not has_split and not has_dynamic)
