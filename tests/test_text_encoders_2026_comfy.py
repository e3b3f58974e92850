"""The 2026 video models' text encoders, tiny, through core's loaders and ShardDiT's (ComfyUI 0.29).

``harness.tiny_encoders`` writes Gemma 3 12B + the LTX-2.3 text projection, Qwen2.5-VL 7B, byT5
and CLIP-L in core's key layout; here core's own loaders (``LTXAVTextEncoderLoader``,
``DualCLIPLoader`` types ``hunyuan_video_15`` and ``kandinsky5``) load and encode them, and
ShardDiT's ``ShardDiTLoadLTXAVTextEncoder`` / ``ShardDiTLoadDualTextEncoder`` place the same files
by free VRAM, sized by the files together, and give core's conditioning exactly (``torch.equal``:
the same CLIP class on the same device, the same kernels). ComfyUI 0.3.64 has none of these encoders:
skipped there.
"""
import pytest
import torch

pytestmark = pytest.mark.comfy

PROMPT = 'a red fox jumps over the lazy dog, a sign reads "hello"'
OTHER = "a cat runs in the rain at night"
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
    if clip_type == "ltxv":  # the tiny file's padding (harness.tiny_te_hook TINY_MIN_LENGTH), not 1024
        assert [len(t) for t in core_clips[clip_type].tokenize(PROMPT)["gemma3_12b"]] == [64]
    other, _ = encode(core_clips[clip_type], OTHER)
    assert other.shape != cond.shape or not torch.equal(other, cond)


def _pack(env, name):
    from harness.comfy_env import pack_module

    return pack_module(env, name)


def our_clip(env, encoders, clip_type, device="auto"):
    """ShardDiT's loader node for the same files as ``core_clip``."""
    from harness.tiny_encoders import ENCODER_PAIRS

    first, second = (encoders[k].name for k in ENCODER_PAIRS[clip_type])
    nodes = env.nodes.NODE_CLASS_MAPPINGS
    if clip_type == "ltxv":
        return nodes["ShardDiTLoadLTXAVTextEncoder"].execute(first, second, device).result[0]
    return nodes["ShardDiTLoadDualTextEncoder"].execute(first, second, clip_type, device).result[0]


def _encoder_bytes(env, encoders, clip_type):
    """What the placement must size: both files; of the LTX-2 checkpoint only its text projection."""
    from harness.tiny_encoders import ENCODER_PAIRS

    from harness.tiny_encoders import ltxav_text_projection_state_dict

    first, second = (encoders[k] for k in ENCODER_PAIRS[clip_type])
    if clip_type == "ltxv":
        projection = ltxav_text_projection_state_dict()
        return first.stat().st_size + sum(t.numel() * t.element_size() for t in projection.values())
    return first.stat().st_size + second.stat().st_size


@pytest.fixture
def fake_gpu(env, monkeypatch):
    """``set(free_bytes)``: one fake cuda:0 with that much free for the loaders' plan; the
    placement registry is restored afterwards (a fake device must not pin later tests)."""
    from sharddit.parallel.placement.inventory import inventory_from_spec

    placement = _pack(env, "loaders.comfy.core.component_placement")
    monkeypatch.setattr(placement, "_PLACED", {})
    loading = _pack(env, "loaders.comfy.loading.component_loading")

    def set_free(free_bytes):
        monkeypatch.setattr(loading, "current_inventory", lambda: inventory_from_spec(f"cuda:0={free_bytes}bytes"))
    return set_free


@pytest.mark.parametrize("clip_type", sorted(EXPECTED))
def test_our_loader_sizes_the_pair_and_matches_core(env, encoders, core_conds, fake_gpu, caplog, clip_type):
    """A GPU whose free VRAM misses the pair (both files, LTX-2: Gemma + the checkpoint's projection)
    plus the 1 GiB reserve by one byte (the DiT's 1-byte stand-in, none placed yet) is passed over
    for the CPU: the plan sized the two files together, not either alone. The CLIP then encodes
    exactly as core's loader's."""
    nbytes = _encoder_bytes(env, encoders, clip_type)
    fake_gpu(2**30 + nbytes)
    with caplog.at_level("INFO", logger="sharddit"):
        clip = our_clip(env, encoders, clip_type)
    assert str(clip.patcher.load_device) == "cpu"
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("[ShardDiT] text encoder ")]
    assert any(f"(type {clip_type}, {nbytes / 2**30:.2f} GiB in the files) on cpu" in m for m in lines), lines
    cond, extra = encode(clip)
    ref, ref_extra = core_conds[clip_type]
    assert torch.equal(cond, ref), (clip_type, (cond - ref).abs().max())
    assert set(extra) == set(ref_extra)
    for key, value in ref_extra.items():
        assert torch.equal(extra[key], value) if torch.is_tensor(value) else extra[key] == value, key


def test_our_loader_puts_the_pair_on_the_gpu_with_room(env, encoders, fake_gpu):
    """One MiB more free than the pair + reserve: the pair goes to cuda:0 (loaded there lazily:
    ComfyUI moves it when it first encodes, which this CPU machine never asks)."""
    fake_gpu(2**30 + _encoder_bytes(env, encoders, "ltxv") + 2**20)
    clip = our_clip(env, encoders, "ltxv")
    assert str(clip.patcher.load_device) == "cuda:0"
    assert str(clip.patcher.offload_device) == "cpu"


@pytest.mark.parametrize("node,args,match", [
    ("ShardDiTLoadDualTextEncoder", ("qwen25_7b", "clip_l", "kandinsky5", "cuda:7"),
     r"^\[ShardDiT\] device 'cuda:7' does not exist; this machine has cpu"),
    ("ShardDiTLoadLTXAVTextEncoder", ("gemma3_12b", "ltx2_text_projection", "gpu1"),
     r"^\[ShardDiT\] device 'gpu1' is not valid; accepted: 'auto', 'cpu' or 'cuda:N'"),
    ("ShardDiTLoadDualTextEncoder", ("qwen25_7b", "clip_l", "flux3", "cpu"),
     r"text encoder type 'flux3' is not one of core DualCLIPLoader's types: .*kandinsky5"),
])
def test_bad_input_fails_before_loading(env, encoders, node, args, match):
    """A bad device or type: a clear error naming the value and what is accepted; nothing loaded."""
    args = tuple(encoders[a].name if a in encoders else a for a in args)
    before = [id(m) for m in env.mm.loaded_models()]
    with pytest.raises(ValueError, match=match) as err:
        env.nodes.NODE_CLASS_MAPPINGS[node].execute(*args)
    assert str(err.value).count("[ShardDiT]") == 1, str(err.value)
    assert [id(m) for m in env.mm.loaded_models()] == before


def test_ltxav_size_counts_only_the_checkpoints_text_projection(env, tmp_path):
    """A 22B LTX-2 checkpoint holds the DiT and VAEs too: only text_embedding_projection.* is the
    text encoder's (here 2 x 64 fp32 of a 3 x 4096 file)."""
    from harness.tiny_models import save_file

    path = tmp_path / "ltx.safetensors"
    save_file({"text_embedding_projection.aggregate_embed.weight": torch.zeros(2, 64),
               "model.diffusion_model.big.weight": torch.zeros(3, 4096)}, path)
    assert _pack(env, "loaders.comfy.loading.component_loading").ltxav_text_bytes(str(path), path.name) == 2 * 64 * 4


def test_ltxav_loader_refuses_a_checkpoint_without_text_projection(env, encoders, tmp_path):
    """A checkpoint with no text_embedding_projection.* (not LTX-2) is named before anything loads."""
    import folder_paths
    from harness.tiny_models import save_file

    save_file({"model.diffusion_model.x.weight": torch.zeros(2)}, tmp_path / "checkpoints" / "not_ltx2.safetensors")
    folder_paths.add_model_folder_path("checkpoints", str(tmp_path / "checkpoints"))
    getattr(folder_paths, "filename_list_cache", {}).clear()
    with pytest.raises(ValueError, match=r"checkpoint 'not_ltx2.safetensors' holds no text_embedding_projection"):
        env.nodes.NODE_CLASS_MAPPINGS["ShardDiTLoadLTXAVTextEncoder"].execute(encoders["gemma3_12b"].name,
                                                                             "not_ltx2.safetensors", "cpu")


def test_single_loader_offers_core_types(env):
    """ShardDiTLoadTextEncoder's type list is core CLIPLoader's; the dual loader's is DualCLIPLoader's
    (0.29: hunyuan_video_15 and kandinsky5 exist only there), on any ComfyUI."""
    loading = _pack(env, "loaders.comfy.loading.component_loading")
    assert loading.clip_types() == list(env.nodes.CLIPLoader.INPUT_TYPES()["required"]["type"][0])
    assert loading.dual_clip_types() == list(env.nodes.DualCLIPLoader.INPUT_TYPES()["required"]["type"][0])
    # the dual loader's default is one of this ComfyUI's types (0.3.64 has no hunyuan_video_15)
    assert loading.default_dual_clip_type() in loading.dual_clip_types()
    _skip_before_2026(env)
    assert {"hunyuan_video_15", "kandinsky5", "ltxv"} <= set(loading.dual_clip_types())
    assert loading.default_dual_clip_type() == "hunyuan_video_15"
