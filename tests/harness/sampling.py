"""Helpers of the in-process sampling tests (stock KSampler vs ShardDiT's nodes on tiny models)."""
import torch

STEPS, CFG, SEED = 2, 3.0, 42


def cond(tokens=8, dim=4096, seed=1, **extra):
    g = torch.Generator().manual_seed(seed)
    return [[torch.randn(1, tokens, dim, generator=g), dict(extra)]]


def family(tiny, name):
    """(state dict builder, latent shape, conditioning extras) per tiny architecture."""
    g = torch.Generator().manual_seed(7)
    pooled = {"pooled_output": torch.randn(1, 768, generator=g)}
    return {
        "wan21": (tiny.wan21_t2v_state_dict, (1, 16, 2, 8, 8), {}),
        "ltxv": (tiny.ltxv_state_dict, (1, 128, 2, 4, 4), {"attention_mask": torch.ones(1, 8, dtype=torch.long)}),
        "hunyuan_video": (tiny.hunyuan_video_state_dict, (1, 16, 2, 8, 8), pooled),
    }[name]


def load(env, sd):
    import comfy.sd

    return comfy.sd.load_diffusion_model_state_dict(dict(sd))


def stock(env, model, latent, extras, sampler="euler", scheduler="simple", cfg=CFG):
    out = env.nodes.common_ksampler(model, SEED, STEPS, cfg, sampler, scheduler, cond(**extras),
                                    cond(seed=2, **extras), {"samples": latent.clone()})
    return out[0]["samples"]


def ours(env, model, latent, extras, devices, sampler="euler", scheduler="simple", cfg=CFG, parallel=None):
    """ShardDiTKSampler; ``parallel`` None leaves the input out (its default, as old workflows do)."""
    node = env.nodes.NODE_CLASS_MAPPINGS["ShardDiTKSampler"]
    more = () if parallel is None else (parallel,)
    out = node.execute(model, SEED, STEPS, cfg, sampler, scheduler, cond(**extras), cond(seed=2, **extras),
                       {"samples": latent.clone()}, 1.0, devices, *more)
    return out.result[0]["samples"]


def lora_loader(env, tiny, tmp_path, sd, name="tiny_wan_lora.safetensors"):
    """Core's LoraLoaderModelOnly on a tiny random LoRA file registered in ComfyUI's `loras` folder."""
    import comfy.utils

    path = tmp_path / name
    comfy.utils.save_torch_file(tiny.wan_lora_state_dict(sd), str(path))
    env.folder_paths.add_model_folder_path("loras", str(tmp_path))
    loader = env.nodes.LoraLoaderModelOnly()
    return lambda model: loader.load_lora_model_only(model, path.name, 1.0)[0]


def sharded(env, tiny, devices="cpu,cpu"):
    model = load(env, tiny.wan21_t2v_state_dict())
    shard = env.nodes.NODE_CLASS_MAPPINGS["ShardDiTShardModel"]
    return model, shard.execute(model, devices, 0.0).result[0]


def default(node, input_id):
    return next(i for i in node.define_schema().inputs if i.id == input_id).default
