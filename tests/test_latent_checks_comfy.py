"""Latents that do not fit the model are refused before sampling, naming the latent node that
fits (real ComfyUI in-process, tiny Wan 2.1 and LTX-Video). Core's own fix of empty image latents
(``fix_empty_latent_channels``: a zero 4-D latent gets the model's channels) keeps working."""
import pytest
import torch

pytestmark = pytest.mark.comfy


@pytest.fixture(scope="module")
def wan(comfy_env):
    import comfy.sd
    from harness import tiny_models

    return comfy.sd.load_diffusion_model_state_dict(dict(tiny_models.wan21_t2v_state_dict()))


def _cond(seed):
    g = torch.Generator().manual_seed(seed)
    return [[torch.randn(1, 8, 4096, generator=g), {}]]


def _sample(env, model, samples):
    node = env.nodes.NODE_CLASS_MAPPINGS["ShardDiTKSampler"]
    out = node.execute(model, 0, 1, 1.0, "euler", "simple", _cond(1), _cond(2), {"samples": samples}, 1.0, "cpu,cpu")
    return out.result[0]["samples"]


@pytest.mark.parametrize("samples,words", [
    (torch.zeros(1, 128, 2, 2, 2), "has 128 channels"),        # EmptyLTXVLatentVideo's latent
    (torch.randn(1, 17, 2, 8, 8), "has 17 channels"),
    (torch.randn(1, 16, 8), "(3-D)"),
    (torch.zeros(1, 16, 0, 8, 8), "to denoise (a size is 0)"),
], ids=["ltxv-128ch", "17ch", "3d", "0-frames"])
def test_wrong_latent_names_the_node_that_fits(comfy_env, wan, samples, words):
    with pytest.raises(ValueError) as err:
        _sample(comfy_env, wan, samples)
    text = str(err.value)
    assert words in text and "EmptyHunyuanLatentVideo" in text and "WAN21" in text, text


def test_core_fix_of_empty_image_latent_still_runs(comfy_env, wan):
    out = _sample(comfy_env, wan, torch.zeros(1, 4, 8, 8))  # EmptyLatentImage: core makes it 1x16x1x8x8
    assert out.shape == (1, 16, 1, 8, 8)
