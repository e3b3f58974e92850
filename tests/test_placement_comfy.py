"""ShardDiT's three loaders in real ComfyUI (CPU): devices as requested, and encode → sample →
decode bit-identical to core's CLIPLoader/UNETLoader/VAELoader + KSampler + VAEDecode."""
import pytest
import torch

pytestmark = pytest.mark.comfy


def _pipeline(env, clip, model, vae, sampler):
    enc = env.nodes.CLIPTextEncode()
    pos = enc.encode(clip, "a red fox running through snow")[0]
    neg = enc.encode(clip, "blurry")[0]
    latent = {"samples": torch.zeros(1, 16, 1, 4, 4)}
    samples = sampler(model, pos, neg, latent)
    return env.nodes.VAEDecode().decode(vae, samples)[0]


def test_three_loaders_match_core_pipeline(comfy_env, tiny_models):
    env, names = comfy_env, tiny_models.names
    te, dit, vae = names["umt5"], names["wan21_t2v"], names["wan21_vae"]
    ksampler = env.nodes.KSampler()

    def core_sampler(model, pos, neg, latent):
        return ksampler.sample(model, 5, 2, 3.0, "euler", "simple", pos, neg, latent)[0]

    ref = _pipeline(env, env.nodes.CLIPLoader().load_clip(te, "wan")[0],
                    env.nodes.UNETLoader().load_unet(dit, "default")[0],
                    env.nodes.VAELoader().load_vae(vae)[0], core_sampler)

    N = env.nodes.NODE_CLASS_MAPPINGS
    clip = N["ShardDiTLoadTextEncoder"].execute(te, "wan", "cpu").result[0]
    model = N["ShardDiTLoadDiffusionModel"].execute(dit, "default", "cpu,cpu", 0.0).result[0]
    vae_obj = N["ShardDiTLoadVAE"].execute(vae, "cpu").result[0]

    from harness.comfy_env import pack_module

    shards = pack_module(env, "loaders.comfy.shard.hooks").get_shard_patchers(model)
    assert str(clip.patcher.load_device) == "cpu"
    assert str(vae_obj.device) == "cpu"
    assert [str(s.load_device) for s in shards] == ["cpu", "cpu"]

    def our_sampler(m, pos, neg, latent):
        return N["ShardDiTKSampler"].execute(m, 5, 2, 3.0, "euler", "simple", pos, neg, latent, 1.0, "auto").result[0]

    got = _pipeline(env, clip, model, vae_obj, our_sampler)
    assert got.shape == ref.shape
    assert torch.equal(got, ref)


@pytest.mark.parametrize("node,args,match", [
    ("ShardDiTLoadTextEncoder", ("{te}", "wan", "cuda:3"),
     r"^\[ShardDiT\] device 'cuda:3' does not exist; this machine has cpu; no GPU is visible to torch here"),
    ("ShardDiTLoadVAE", ("{vae}", "gpu0"),
     r"^\[ShardDiT\] device 'gpu0' is not valid; accepted: 'auto', 'cpu' or 'cuda:N' \(N = 0, 1, \.\.\.\)"),
    ("ShardDiTLoadDiffusionModel", ("{dit}", "default", "cuda:0,cuda:1", 0.0),
     r"^\[ShardDiT\] device 'cuda:0' does not exist; this machine has cpu"),
])
def test_bad_devices_fail_before_loading(comfy_env, tiny_models, node, args, match):
    names = tiny_models.names
    args = tuple(a.format(te=names["umt5"], vae=names["wan21_vae"], dit=names["wan21_t2v"])
                 if isinstance(a, str) else a for a in args)
    before = [id(m) for m in comfy_env.mm.loaded_models()]
    with pytest.raises(ValueError, match=match) as err:
        comfy_env.nodes.NODE_CLASS_MAPPINGS[node].execute(*args)
    assert str(err.value).count("[ShardDiT]") == 1, str(err.value)
    assert [id(m) for m in comfy_env.mm.loaded_models()] == before, "nothing may be loaded or unloaded"
