"""ComfyUI-GGUF (vendored) + a LoRA, sharded: equal to the unsharded GGUF + LoRA result.

ComfyUI-GGUF keeps quantized weights as ``GGMLTensor``s and applies LoRA patches at forward
time through its ``GGUFModelPatcher``; a plain ModelPatcher on the shards tried to add the
LoRA to the raw Q8_0 bytes ("size of tensor a (272) must match ... (256)") and dropped every
block LoRA weight, silently. In-process real ComfyUI, tiny Wan 2.1 written as GGUF by the test.
"""
import pytest
import torch
from harness import sampling

pytestmark = pytest.mark.comfy


@pytest.fixture(scope="module")
def gguf_nodes(comfy_env, tmp_path_factory):
    from harness.vendor_packs import extract_pack, import_pack

    folder = extract_pack("ComfyUI-GGUF", tmp_path_factory.mktemp("custom_nodes"))
    return import_pack(folder).nodes


def _stock(env, model):
    return sampling.stock(env, model, torch.zeros(1, 16, 2, 8, 8), {})


def _ours(env, model):
    return sampling.ours(env, model, torch.zeros(1, 16, 2, 8, 8), {}, "cpu,cpu")


@pytest.mark.parametrize("qtype", ["Q8_0", "F16"])
def test_gguf_lora_sharded_equals_unsharded(comfy_env, tiny_models, gguf_nodes, tmp_path, qtype):
    from harness import tiny_models as tm
    from harness.gguf_file import write_gguf

    env = comfy_env
    sd = tm.wan21_t2v_state_dict()
    write_gguf(tmp_path / f"tiny_wan_{qtype}.gguf", sd, qtype)
    lora_path = tmp_path / "tiny_wan_lora.safetensors"
    import comfy.utils

    comfy.utils.save_torch_file(tm.wan_lora_state_dict(sd), str(lora_path))
    env.folder_paths.add_model_folder_path("diffusion_models", str(tmp_path))
    env.folder_paths.add_model_folder_path("loras", str(tmp_path))
    base = gguf_nodes.UnetLoaderGGUF().load_unet(f"tiny_wan_{qtype}.gguf")[0]
    assert type(base).__name__ == "GGUFModelPatcher"
    lora = env.nodes.LoraLoaderModelOnly()

    def apply_lora(model):
        return lora.load_lora_model_only(model, lora_path.name, 1.0)[0]

    plain = _stock(env, base)
    ref = _stock(env, apply_lora(base))
    assert not torch.equal(ref, plain), "the LoRA must change the output, or this test proves nothing"
    assert torch.equal(_ours(env, apply_lora(base)), ref), "LoRA before sharding (ShardDiTKSampler)"
    shard = env.nodes.NODE_CLASS_MAPPINGS["ShardDiTShardModel"]
    sharded = shard.execute(base, "cpu,cpu", 0.0).result[0]
    assert torch.equal(_ours(env, apply_lora(sharded)), ref), "LoRA after sharding"
    assert torch.equal(_ours(env, sharded), plain), "the sharded model without the LoRA"


def _scaled_fp8(sd):
    """ComfyUI's scaled fp8 layout: fp8 linear weights with a per-weight ``scale_weight``."""
    out = {"scaled_fp8": torch.empty(0, dtype=torch.float8_e4m3fn)}
    for key, w in sd.items():
        if key.startswith("blocks.") and key.endswith(".weight") and w.ndim == 2:
            scale = w.abs().max().float() / 448.0
            out[key] = (w / scale).to(torch.float8_e4m3fn)
            out[key[: -len("weight")] + "scale_weight"] = scale.reshape(1)
        else:
            out[key] = w
    return out


@pytest.mark.parametrize("variant", ["fp8_e4m3fn", "scaled_fp8"])
def test_fp8_lora_sharded_stays_bit_exact(comfy_env, tiny_models, tmp_path, variant):
    import comfy.sd
    import comfy.utils
    from harness import tiny_models as tm

    env = comfy_env
    sd = tm.wan21_t2v_state_dict()
    lora_path = tmp_path / "tiny_wan_lora_fp8.safetensors"
    comfy.utils.save_torch_file(tm.wan_lora_state_dict(sd), str(lora_path))
    env.folder_paths.add_model_folder_path("loras", str(tmp_path))
    with torch.inference_mode():  # a server loads inside the executor (0.29's scaled fp8 QuantizedTensor needs it)
        if variant == "scaled_fp8":
            base = comfy.sd.load_diffusion_model_state_dict(_scaled_fp8(sd))
        else:
            base = comfy.sd.load_diffusion_model_state_dict(dict(sd), model_options={"dtype": torch.float8_e4m3fn})
    lora = env.nodes.LoraLoaderModelOnly()

    def apply_lora(model):
        return lora.load_lora_model_only(model, lora_path.name, 1.0)[0]

    with torch.inference_mode():  # as ComfyUI executes prompts (fp8 patching needs it)
        plain = _stock(env, base)
        ref = _stock(env, apply_lora(base))
        assert not torch.equal(ref, plain)
        assert torch.equal(_ours(env, apply_lora(base)), ref)
        sharded = env.nodes.NODE_CLASS_MAPPINGS["ShardDiTShardModel"].execute(base, "cpu,cpu", 0.0).result[0]
        assert torch.equal(_ours(env, apply_lora(sharded)), ref)
