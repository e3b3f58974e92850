"""The real-ComfyUI harness itself: ComfyUI imports the pack, tiny models load through stock nodes."""
import pytest
import torch

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
    assert clip.cond_stage_model.umt5xxl.transformer.encoder.block[0].layer[0].SelfAttention.q.weight.shape == (16, 4096)
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
