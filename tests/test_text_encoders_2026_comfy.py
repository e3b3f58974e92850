"""The 2026 video models' text encoders, tiny, through core's loaders and ShardDiT's (ComfyUI 0.29).

``harness.tiny_encoders`` writes Gemma 3 12B + the LTX-2.3 text projection, Qwen2.5-VL 7B, byT5
and CLIP-L in core's key layout; here core's own loaders (``LTXAVTextEncoderLoader``,
``DualCLIPLoader`` types ``hunyuan_video_15`` and ``kandinsky5``) load and encode them. Gemma's
tokenizer pads every prompt to 1024 tokens (``Gemma3_12BTokenizer`` min_length): the tests set
core's own tokenizer option ``gemma3_12b_min_length`` to 64 on every CLIP they compare (48 layers
x 1024 tokens cost ~5 s per encode on one CPU thread). ComfyUI 0.3.64 has none of these encoders:
skipped there.
"""
import pytest
import torch

pytestmark = pytest.mark.comfy

PROMPT = 'a red fox jumps over the lazy dog, a sign reads "hello"'
OTHER = "a cat runs in the rain at night"
GEMMA_MIN_LENGTH = 64
# core loader type -> (conditioning width, extra keys the conditioning must carry, pooled width)
EXPECTED = {"ltxv": (64 + 32, {"unprocessed_ltxav_embeds"}, None),
            "hunyuan_video_15": (3584, {"conditioning_byt5small"}, None),
            "kandinsky5": (3584, set(), 768)}


def _skip_before_2026(env):
    import comfyui_version

    version = comfyui_version.__version__
    if "LTXAVTextEncoderLoader" not in env.nodes.NODE_CLASS_MAPPINGS or version.startswith("0.3."):
        pytest.skip(f"ComfyUI {version} has no LTX-2 / HunyuanVideo 1.5 / Kandinsky 5 text encoders "
                    "(added after ComfyUI 0.3.64)")


@pytest.fixture(scope="module")
def encoders(env, tmp_path_factory):
    """kind -> path of the tiny encoder files, registered with folder_paths."""
    _skip_before_2026(env)
    from harness import tiny_encoders as te

    paths = te.write_tiny_encoders(tmp_path_factory.mktemp("tiny_encoders"))
    te.register_tiny_encoders(paths)
    return paths


def core_clip(env, encoders, clip_type):
    """The CLIP core's own loader node gives for the template's pair of files."""
    from harness.tiny_encoders import ENCODER_PAIRS

    first, second = (encoders[k].name for k in ENCODER_PAIRS[clip_type])
    nodes = env.nodes.NODE_CLASS_MAPPINGS
    if clip_type == "ltxv":
        return nodes["LTXAVTextEncoderLoader"].execute(first, second).result[0]
    return nodes["DualCLIPLoader"]().load_clip(first, second, clip_type)[0]


def encode(clip, text=PROMPT):
    clip.set_tokenizer_option("gemma3_12b_min_length", GEMMA_MIN_LENGTH)
    [(cond, extra)] = clip.encode_from_tokens_scheduled(clip.tokenize(text))
    return cond, extra


@pytest.fixture(scope="module")
def core_clips(env, encoders):
    """clip type -> core's loader's CLIP (tokenizers take ~2 s to load: once per module)."""
    return {t: core_clip(env, encoders, t) for t in EXPECTED}


@pytest.fixture(scope="module")
def core_conds(core_clips):
    """clip type -> (conditioning, extra) of core's loader for PROMPT."""
    return {t: encode(clip) for t, clip in core_clips.items()}


def test_tiny_files_are_detected_as_the_real_encoders(env, encoders):
    """core's detect_te_model names each tiny file as the full-size model it stands for."""
    import comfy.sd
    import comfy.utils

    expected = {"gemma3_12b": "GEMMA_3_12B", "qwen25_7b": "QWEN25_7B", "byt5_small_glyph": "BYT5_SMALL_GLYPH",
                "clip_l": "CLIP_L"}
    for kind, name in expected.items():
        assert comfy.sd.detect_te_model(comfy.utils.load_torch_file(str(encoders[kind]))) == comfy.sd.TEModel[name], kind


@pytest.mark.parametrize("clip_type", sorted(EXPECTED))
def test_core_loaders_encode_the_tiny_encoders(core_clips, core_conds, clip_type):
    """Core's loader encodes a prompt: finite, the widths the 2026 DiTs take, prompt-dependent."""
    width, keys, pooled = EXPECTED[clip_type]
    cond, extra = core_conds[clip_type]
    assert cond.shape[0] == 1 and cond.shape[-1] == width and torch.isfinite(cond).all(), (clip_type, cond.shape)
    assert keys <= set(extra), (clip_type, set(extra))
    if pooled:
        assert extra["pooled_output"].shape == (1, pooled)
    if "conditioning_byt5small" in keys:
        assert extra["conditioning_byt5small"].shape[-1] == 1472
    other, _ = encode(core_clips[clip_type], OTHER)
    assert other.shape != cond.shape or not torch.equal(other, cond)
