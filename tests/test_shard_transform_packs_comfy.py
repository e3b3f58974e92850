"""The shard transform on a community-style graph (issue 29, "Done when" 2): a GGUF diffusion model
(ComfyUI-GGUF's ``UnetLoaderGGUF``, vendored) -> a LoRA (core's ``LoraLoaderModelOnly``) -> a
KJNodes model patch (``ModelPatchTorchSettings``, vendored) -> ``KSampler``, written here in UI
and API format. The Shard node must land between the GGUF loader and the LoRA; the transform is
idempotent and exactly undone; the sharded prompt passes ComfyUI's own ``validate_prompt`` with
both packs registered (empty placeholder model files: validation checks file lists only); the
API transform of the graph's API form equals the API form of the sharded UI graph. Runs on every
ComfyUI tree the packs are tested on (0.3.64 and 0.29).
"""
from __future__ import annotations

import json

import pytest
from harness import templates as tpl
from harness.comfy_env import pack_module

pytestmark = pytest.mark.comfy

FILES = {"diffusion_models": "community-wan-Q4_K_M.gguf", "loras": "community_lightning_lora.safetensors",
         "text_encoders": "community_umt5.safetensors", "vae": "community_wan_vae.safetensors"}
PATCH = "ModelPatchTorchSettings"


@pytest.fixture(scope="module")
def packs(comfy_env, tmp_path_factory):
    """ComfyUI-GGUF and KJNodes registered in ComfyUI's node mappings, and the graph's model files
    as empty placeholders; both taken away again after the module."""
    from harness.vendor_packs import extract_pack, import_pack

    pytest.importorskip("accelerate", reason="KJNodes needs accelerate: pip install --no-deps -r tests/requirements-nodeps.txt")
    folder = tmp_path_factory.mktemp("custom_nodes")
    mappings = {**import_pack(extract_pack("ComfyUI-GGUF", folder)).NODE_CLASS_MAPPINGS,
                **import_pack(extract_pack("ComfyUI-KJNodes", folder)).NODE_CLASS_MAPPINGS}
    nodes, fp = comfy_env.nodes, comfy_env.folder_paths
    new = {k: v for k, v in mappings.items() if k not in nodes.NODE_CLASS_MAPPINGS}
    nodes.NODE_CLASS_MAPPINGS.update(new)
    root = tmp_path_factory.mktemp("community_models")
    for kind, name in FILES.items():
        (root / kind).mkdir()
        (root / kind / name).write_bytes(b"")
        fp.add_model_folder_path(kind, str(root / kind))
    getattr(fp, "filename_list_cache", {}).clear()
    assert FILES["diffusion_models"] in fp.get_filename_list("unet_gguf")
    yield comfy_env
    for name in new:
        del nodes.NODE_CLASS_MAPPINGS[name]
    for kind in FILES:
        fp.folder_names_and_paths[fp.map_legacy(kind)][0].remove(str(root / kind))
    getattr(fp, "filename_list_cache", {}).clear()


def _n(nid, typ, x, y, inputs=(), outputs=(), widgets=(), h=100):
    return {"id": nid, "type": typ, "pos": [x, y], "size": [300, h], "flags": {}, "order": nid, "mode": 0,
            "inputs": [{"name": a, "type": t, "link": k} for a, t, k in inputs],
            "outputs": [{"name": a, "type": t, "links": list(k)} for a, t, k in outputs],
            "properties": {"Node name for S&R": typ}, "widgets_values": list(widgets)}


def community_ui() -> dict:
    """Loader column on the left (GGUF -> LoRA -> patch, top to bottom), text and latent in the
    middle, sampler and decode on the right, as people lay such graphs out."""
    nodes = [
        _n(1, "UnetLoaderGGUF", 0, 0, outputs=[("MODEL", "MODEL", [1])], widgets=[FILES["diffusion_models"]], h=60),
        _n(2, "LoraLoaderModelOnly", 0, 130, [("model", "MODEL", 1)], [("MODEL", "MODEL", [2])],
           [FILES["loras"], 1.0], h=82),
        _n(3, PATCH, 0, 270, [("model", "MODEL", 2)], [("MODEL", "MODEL", [3])], [False], h=60),
        _n(5, "CLIPLoader", 0, 400, outputs=[("CLIP", "CLIP", [4, 5])], widgets=[FILES["text_encoders"], "wan"], h=82),
        _n(6, "CLIPTextEncode", 380, 0, [("clip", "CLIP", 4)], [("CONDITIONING", "CONDITIONING", [6])],
           ["a red fox running through snow"], h=120),
        _n(7, "CLIPTextEncode", 380, 180, [("clip", "CLIP", 5)], [("CONDITIONING", "CONDITIONING", [7])], ["blurry"], h=120),
        _n(8, "EmptyHunyuanLatentVideo", 380, 360, outputs=[("LATENT", "LATENT", [8])], widgets=[64, 64, 5, 1], h=130),
        _n(4, "KSampler", 760, 0, [("model", "MODEL", 3), ("positive", "CONDITIONING", 6),
                                   ("negative", "CONDITIONING", 7), ("latent_image", "LATENT", 8)],
           [("LATENT", "LATENT", [9])], [7, "fixed", 4, 1.0, "euler", "simple", 1.0], h=262),
        _n(9, "VAELoader", 760, 330, outputs=[("VAE", "VAE", [10])], widgets=[FILES["vae"]], h=60),
        _n(10, "VAEDecode", 1140, 0, [("samples", "LATENT", 9), ("vae", "VAE", 10)], [("IMAGE", "IMAGE", [11])], h=46),
        _n(11, "PreviewImage", 1140, 120, [("images", "IMAGE", 11)], h=250),
    ]
    links = [[1, 1, 0, 2, 0, "MODEL"], [2, 2, 0, 3, 0, "MODEL"], [3, 3, 0, 4, 0, "MODEL"], [4, 5, 0, 6, 0, "CLIP"],
             [5, 5, 0, 7, 0, "CLIP"], [6, 6, 0, 4, 1, "CONDITIONING"], [7, 7, 0, 4, 2, "CONDITIONING"],
             [8, 8, 0, 4, 3, "LATENT"], [9, 4, 0, 10, 0, "LATENT"], [10, 9, 0, 10, 1, "VAE"], [11, 10, 0, 11, 0, "IMAGE"]]
    groups = [{"id": 1, "title": "Model", "bounding": [-10, -40, 320, 380]}]
    return {"last_node_id": 11, "last_link_id": 11, "nodes": nodes, "links": links, "groups": groups,
            "extra": {}, "version": 0.4}


def test_community_ui_graph_sharded_between_gguf_loader_and_lora(packs):
    env = packs
    shard = pack_module(env, "loaders.workflow.shard_transform")
    ui = community_ui()
    result = shard.shard_workflow(ui)
    ((change),) = result.added
    assert (change.loader_id, change.loader_type, change.label) == (1, "UnetLoaderGGUF", "community-wan-Q4_K_M")
    nodes = {n["id"]: n for n in result.workflow["nodes"]}
    links = {k[0]: k for k in result.workflow["links"]}
    new = nodes[change.shard_id]
    (into,) = nodes[1]["outputs"][0]["links"]
    assert links[into][1:5] == [1, 0, new["id"], 0] and new["outputs"][0]["links"] == [1]
    assert links[1][1:5] == [new["id"], 0, 2, 0]   # the LoRA reads the Shard node; the patch and KSampler as before
    assert links[2][1:5] == [2, 0, 3, 0] and links[3][1:5] == [3, 0, 4, 0]
    again = shard.shard_workflow(result.workflow)
    assert again.added == [] and again.workflow == result.workflow and again.reason.startswith("already sharded")
    assert shard.unshard_workflow(result.workflow).workflow == ui
    widgets = tpl.comfy_widget_inputs(env.nodes.NODE_CLASS_MAPPINGS)
    api = tpl.ui_to_api(result.workflow, widgets)
    ok, error, _, node_errors = tpl.validate(api)
    assert ok, f"{error} {json.dumps(node_errors, default=str)[:2000]}"
    assert api[str(new["id"])]["inputs"]["model"] == ["1", 0] and api["2"]["inputs"]["model"] == [str(new["id"]), 0]
    assert tpl.validate(tpl.ui_to_api(ui, widgets))[0]


@pytest.mark.parametrize("with_node_io", [False, True], ids=["known-classes", "node_io"])
def test_community_api_graph_sharded_between_gguf_loader_and_lora(packs, with_node_io):
    """The API form (what Export (API) writes): the GGUF loader is a known source without
    ``node_io``; with it, the same from the real classes' types."""
    env = packs
    shard = pack_module(env, "loaders.workflow.shard_transform")
    widgets = tpl.comfy_widget_inputs(env.nodes.NODE_CLASS_MAPPINGS)
    api = tpl.ui_to_api(community_ui(), widgets)
    node_io = pack_module(env, "loaders.workflow.comfy_nodes").node_io_from_mappings(env.nodes.NODE_CLASS_MAPPINGS)
    result = shard.shard_workflow(api, node_io if with_node_io else None)
    ((change),) = result.added
    new = change.shard_id
    assert change.loader_id == "1" and result.workflow[new]["inputs"]["model"] == ["1", 0]
    assert result.workflow["2"]["inputs"]["model"] == [new, 0] and result.workflow["3"]["inputs"]["model"] == ["2", 0]
    assert {k: v for k, v in result.workflow.items() if k != new and k != "2"} == {k: v for k, v in api.items() if k != "2"}
    ok, error, _, node_errors = tpl.validate(result.workflow)
    assert ok, f"{error} {json.dumps(node_errors, default=str)[:2000]}"
    again = shard.shard_workflow(result.workflow, node_io if with_node_io else None)
    assert again.added == [] and again.workflow == result.workflow
    assert shard.unshard_workflow(result.workflow).workflow == api
    from_ui = tpl.ui_to_api(shard.shard_workflow(community_ui()).workflow, widgets)
    strip = {k: {"class_type": v["class_type"], "inputs": v["inputs"]} for k, v in result.workflow.items()}
    (ui_new,) = tpl.api_ids(from_ui, shard.SHARD_NODE)
    strip[ui_new] = strip.pop(new)
    strip["2"]["inputs"]["model"] = [ui_new, 0]
    assert strip == {k: {"class_type": v["class_type"], "inputs": v["inputs"]} for k, v in from_ui.items()}
