"""The real-ComfyUI harness itself: ComfyUI imports the pack, tiny models load through stock nodes."""
import json

import pytest
import torch

from harness.server import comfy_run, parse_comfy_run_events

pytestmark = pytest.mark.comfy


def pack_node_ids(env) -> list:
    """Node ids the pack declares (its own list), as ComfyUI imported it."""
    from harness.comfy_env import pack_module

    return sorted(n.GET_SCHEMA().node_id for n in pack_module(env, "nodes.node_list").all_nodes())


def test_load_comfy_imports_pack(comfy_env):
    assert comfy_env.pack_node_ids == pack_node_ids(comfy_env)
    for node_id in comfy_env.pack_node_ids:
        assert node_id.startswith("ShardDiT")
        assert node_id in comfy_env.nodes.NODE_CLASS_MAPPINGS


def test_tiny_models_load_through_stock_loaders(comfy_env, tiny_models):
    nodes = comfy_env.nodes
    (model,) = nodes.UNETLoader().load_unet(tiny_models.names["wan21_t2v"], "default")
    assert type(model.model.model_config).__name__ == "WAN21_T2V"
    assert model.model.diffusion_model.dim == 256 and len(model.model.diffusion_model.blocks) == 4
    for kind, config_name in [("wan22_high_noise", "WAN21_T2V"), ("ltxv", "LTXV"),
                              ("hunyuan_video", "HunyuanVideo")]:
        (m,) = nodes.UNETLoader().load_unet(tiny_models.names[kind], "default")
        assert type(m.model.model_config).__name__ == config_name, kind
    (clip,) = nodes.CLIPLoader().load_clip(tiny_models.names["umt5"], "wan")
    assert type(clip.cond_stage_model).__name__ == "WanTEModel"
    encoder = clip.cond_stage_model.umt5xxl.transformer.encoder
    assert len(encoder.block) == 2 and encoder.block[0].layer[0].SelfAttention.q.weight.shape == (16, 4096)
    (vae,) = nodes.VAELoader().load_vae(tiny_models.names["wan21_vae"])
    assert type(vae.first_stage_model).__name__ == "WanVAE" and vae.latent_channels == 16
    (patched,) = nodes.LoraLoaderModelOnly().load_lora_model_only(model, tiny_models.names["wan21_lora"], 1.0)
    lora_keys = {k for k in patched.patches if ".blocks." in k}
    assert len(lora_keys) == 20, sorted(patched.patches)[:5]


def test_template_names_resolve(comfy_env, tiny_models):
    fp = comfy_env.folder_paths
    assert "wan2.1_t2v_14B_fp16.safetensors" in fp.get_filename_list("diffusion_models")
    assert "umt5_xxl_fp8_e4m3fn_scaled.safetensors" in fp.get_filename_list("text_encoders")
    assert "wan_2.1_vae.safetensors" in fp.get_filename_list("vae")


def _sample(nodes, model, positive, negative, seed):
    latent = {"samples": torch.zeros(1, 16, 1, 8, 8)}
    (out,) = nodes.KSampler().sample(model, seed, 2, 1.0, "euler", "simple", positive, negative, latent)
    return out["samples"]


def test_stock_ksampler_runs_tiny_wan_deterministically(comfy_env, tiny_models):
    nodes = comfy_env.nodes
    (model,) = nodes.UNETLoader().load_unet(tiny_models.names["wan21_t2v"], "default")
    (clip,) = nodes.CLIPLoader().load_clip(tiny_models.names["umt5"], "wan")
    (positive,) = nodes.CLIPTextEncode().encode(clip, "a red fox in the rain")
    (negative,) = nodes.CLIPTextEncode().encode(clip, "")
    a = _sample(nodes, model, positive, negative, seed=7)
    b = _sample(nodes, model, positive, negative, seed=7)
    c = _sample(nodes, model, positive, negative, seed=8)
    assert a.shape == (1, 16, 1, 8, 8) and torch.isfinite(a).all()
    assert torch.equal(a, b)
    assert not torch.equal(a, c)
    (vae,) = nodes.VAELoader().load_vae(tiny_models.names["wan21_vae"])
    (image,) = nodes.VAEDecode().decode(vae, {"samples": a})
    assert image.shape[-3:] == (64, 64, 3) and torch.isfinite(image).all()


@pytest.mark.parametrize("kind,shape", [("ltxv", (1, 128, 1, 4, 4)), ("hunyuan_video", (1, 16, 1, 8, 8)),
                                         ("wan22_high_noise", (1, 16, 1, 8, 8))])
def test_stock_ksampler_runs_other_tiny_dits(comfy_env, tiny_models, kind, shape):
    from harness.tiny_models import adapt_conditioning

    nodes = comfy_env.nodes
    (model,) = nodes.UNETLoader().load_unet(tiny_models.names[kind], "default")
    (clip,) = nodes.CLIPLoader().load_clip(tiny_models.names["umt5"], "wan")
    (cond,) = nodes.CLIPTextEncode().encode(clip, "a red fox")
    cond = adapt_conditioning(cond, kind)
    (out,) = nodes.KSampler().sample(model, 3, 2, 1.0, "euler", "simple", cond, cond, {"samples": torch.zeros(shape)})
    assert out["samples"].shape == shape and torch.isfinite(out["samples"]).all()


def test_tiny_lora_changes_the_wan_output(comfy_env, tiny_models):
    nodes = comfy_env.nodes
    (model,) = nodes.UNETLoader().load_unet(tiny_models.names["wan21_t2v"], "default")
    (patched,) = nodes.LoraLoaderModelOnly().load_lora_model_only(model, tiny_models.names["wan21_lora"], 1.0)
    (clip,) = nodes.CLIPLoader().load_clip(tiny_models.names["umt5"], "wan")
    (cond,) = nodes.CLIPTextEncode().encode(clip, "a red fox")
    plain = _sample(nodes, model, cond, cond, seed=5)
    lora = _sample(nodes, patched, cond, cond, seed=5)
    assert torch.isfinite(lora).all() and not torch.equal(plain, lora)
    assert torch.equal(plain, _sample(nodes, model, cond, cond, seed=5))  # unpatched model untouched


# ----------------------------------------------------------------------------- server
def tiny_wan_api_graph(tiny_models, seed: int = 7, decode: bool = True, prefix: str = "harness/wan") -> dict:
    """Stock-node API graph: tiny Wan 2.1 t2v, 2 KSampler steps, 64×64×1 frame, saved."""
    names = tiny_models.names
    g = {
        "1": {"class_type": "UNETLoader", "inputs": {"unet_name": names["wan21_t2v"], "weight_dtype": "default"}},
        "2": {"class_type": "CLIPLoader", "inputs": {"clip_name": names["umt5"], "type": "wan", "device": "default"}},
        "3": {"class_type": "CLIPTextEncode", "inputs": {"text": "a red fox in the rain", "clip": ["2", 0]}},
        "4": {"class_type": "CLIPTextEncode", "inputs": {"text": "", "clip": ["2", 0]}},
        "5": {"class_type": "EmptyHunyuanLatentVideo",
              "inputs": {"width": 64, "height": 64, "length": 1, "batch_size": 1}},
        "6": {"class_type": "KSampler", "inputs": {"model": ["1", 0], "seed": seed, "steps": 2, "cfg": 1.0,
                                                   "sampler_name": "euler", "scheduler": "simple", "positive": ["3", 0],
                                                   "negative": ["4", 0], "latent_image": ["5", 0], "denoise": 1.0}},
        "7": {"class_type": "SaveLatent", "inputs": {"samples": ["6", 0], "filename_prefix": prefix}},
    }
    if decode:
        g["8"] = {"class_type": "VAELoader", "inputs": {"vae_name": tiny_models.names["wan21_vae"]}}
        g["9"] = {"class_type": "VAEDecode", "inputs": {"samples": ["6", 0], "vae": ["8", 0]}}
        g["10"] = {"class_type": "SaveImage", "inputs": {"images": ["9", 0], "filename_prefix": prefix}}
    return g


def test_server_imports_pack_and_lists_its_nodes(comfy_env, comfy_server):
    assert comfy_server.import_failures() == [], comfy_server.log_tail()
    info = comfy_server.object_info()
    assert "KSampler" in info and "UNETLoader" in info
    missing = [n for n in pack_node_ids(comfy_env) if n not in info]
    assert missing == [], f"pack nodes missing from /object_info: {missing}\n{comfy_server.log_tail()}"
    server_ids = sorted(n for n in info if n.startswith("ShardDiT"))
    assert server_ids == pack_node_ids(comfy_env)


def test_server_runs_tiny_wan_graph(comfy_server, tiny_models):
    prompt_id = comfy_server.queue_prompt(tiny_wan_api_graph(tiny_models, decode=True))
    comfy_server.wait(prompt_id, timeout=240)
    outputs = comfy_server.outputs(prompt_id)
    assert set(outputs) >= {"7", "10"}, outputs
    files = comfy_server.output_files(prompt_id)
    assert [f.suffix for f in files] == [".latent", ".png"] or sorted(f.suffix for f in files) == [".latent", ".png"]
    for f in files:
        assert f.is_file() and f.stat().st_size > 0, f


def test_server_rejects_invalid_graph(comfy_server, tiny_models):
    g = tiny_wan_api_graph(tiny_models, decode=False)
    g["1"]["inputs"]["unet_name"] = "no_such_model.safetensors"
    answer = comfy_server.validate(g)
    assert answer["status"] == 400 and "1" in answer["body"]["node_errors"], answer


def test_comfy_cli_run_wait_against_test_server(comfy_server, tiny_models, tmp_path):
    """``comfy run --workflow F --wait --host 127.0.0.1 --port N`` (comfy-cli) drives the test server."""
    path = tmp_path / "tiny_wan_api.json"
    path.write_text(json.dumps(tiny_wan_api_graph(tiny_models, seed=11, decode=False, prefix="harness/comfy_run")))
    result = comfy_run(path, comfy_server, timeout=240)
    events = parse_comfy_run_events(result.stdout)
    detail = (f"rc={result.returncode}\nstdout tail:\n{result.stdout[-2000:]}\n"
              f"stderr tail:\n{result.stderr[-2000:]}\n{comfy_server.log_tail()}")
    assert result.returncode == 0 and events and events[-1].get("ok") is True, detail
    prompt_id = events[-1]["data"]["prompt_id"]
    files = comfy_server.output_files(prompt_id)
    assert [f.suffix for f in files] == [".latent"] and files[0].is_file(), (files, detail)


def test_server_wait_reports_execution_errors(comfy_server, tiny_models):
    from harness.server import ComfyServerError

    g = tiny_wan_api_graph(tiny_models, seed=13, decode=False, prefix="harness/error")
    g["1"]["inputs"]["unet_name"] = tiny_models.names["ltxv"]  # 128-channel DiT fed a 16-channel latent
    prompt_id = comfy_server.queue_prompt(g)
    with pytest.raises(ComfyServerError, match="execution_error"):
        comfy_server.wait(prompt_id, timeout=120)


def test_import_failures_reads_comfyui_log(tmp_path):
    from harness.server import ComfyServer

    server = ComfyServer("/nonexistent", tmp_path, tmp_path)
    server.log_path.write_text(
        "Cannot import /w/custom_nodes/other_pack module for custom nodes: boom\n"
        "   0.0 seconds (IMPORT FAILED): /w/custom_nodes/other_pack\n"
        "Cannot import /w/custom_nodes/sharddit module for custom nodes: deliberately broken\n"
        "   0.0 seconds (IMPORT FAILED): /w/custom_nodes/sharddit\n"
        "   0.0 seconds: /w/custom_nodes/sharddit_test_hooks\n"
        "Cannot import /tmp/sharddit-ci.x/ComfyUI/comfy_extras/nodes_audio.py module for custom nodes: no torchaudio\n")
    assert server.import_failures() == [
        "Cannot import /w/custom_nodes/sharddit module for custom nodes: deliberately broken",
        "0.0 seconds (IMPORT FAILED): /w/custom_nodes/sharddit"]


# POST /interrupt and POST /free against a running sharded prompt: test_server_lifecycle_comfy.py
# (the interrupt stops the run within seconds, prompts after it and after /free succeed).
