"""The 2026 `plan` presets (issue 24 item 4): real configurations, ComfyUI's own classes, the text encoder.

Every preset's `plan` exit code is tested with the others in test_simulator_comfy.py
(``test_cli_plan_every_preset_exits_0_or_3``); ``ltx-2.3-fp8`` is planned here once, in JSON.

Published totals are rounded, so a config passes when ComfyUI's class (built on ``meta``) rounds to
them: within half a unit of their last digit ("19B": 18.5-19.5; "8.3B": 8.25-8.35). Counted here:
Kandinsky 5 Pro 19.31B, Lite 2.008B, HunyuanVideo 1.5 8.327B, Wan 2.2 A14B 14.29B per expert.
LTX-2.3's published 22B (``ltx-2.3-22b-dev``) counts the text projection (3840 x 49 -> 4096 + 2048,
1.16B) that ComfyUI loads with the text encoder: DiT 21.01B + 1.16B = 22.16B.
"""
import json

import pytest
import torch

TWO_24 = "cuda:0=24GiB,cuda:1=24GiB"
PUBLISHED = {  # preset -> (ComfyUI class, billions of parameters as published, half a unit of its last digit)
    "ltx-2.3": ("LTXAVModel", 22, 0.5),  # Lightricks/LTX-2.3: ltx-2.3-22b-dev
    "hunyuanvideo-1.5": ("HunyuanVideo", 8.3, 0.05),  # tencent/HunyuanVideo-1.5: "8.3B parameters"
    "kandinsky5-lite": ("Kandinsky5", 2, 0.5),  # kandinskylab Kandinsky 5.0 Video Lite: "2B"
    "kandinsky5-pro": ("Kandinsky5", 19, 0.5),  # kandinskylab Kandinsky 5.0 Video Pro: "19B"
    "wan2.2-i2v-a14b": ("WanModel", 14, 0.5),  # Wan-AI/Wan2.2-I2V-A14B: two 14B experts
    "minimax-h3": ("MiniMaxH3Model", 33, 0.5),  # MiniMax H3: "about 33B" in the DiT (0.33's class: 33.12B)
}


def _build_meta_model(spec, weight_dtype, manual_cast_dtype):
    """ComfyUI's class of ``spec`` on meta, as the dry run builds it (after the fixture's ComfyUI import)."""
    from sharddit.loaders.plan.context import build_meta_model

    return build_meta_model(spec, weight_dtype, manual_cast_dtype)


@pytest.fixture(scope="module")
def comfy():
    from sharddit.loaders.comfyui_import import import_comfyui

    import_comfyui()
    from sharddit.loaders.plan import presets, text_encoders

    return presets, text_encoders


def _skip_unless_has(presets, name):
    requires = presets.PRESETS[name].requires
    if not presets.comfyui_has(requires):
        pytest.skip(f"{requires} is absent from this ComfyUI (added after ComfyUI 0.3.64)")


@pytest.mark.comfy
@pytest.mark.parametrize("name", PUBLISHED)
def test_config_matches_published_parameter_count(comfy, name):
    presets, text_encoders = comfy
    _skip_unless_has(presets, name)
    cls, published, half_unit = PUBLISHED[name]
    dit = _build_meta_model(presets.PRESETS[name], torch.bfloat16, None).diffusion_model
    assert type(dit).__name__ == cls
    params = sum(p.numel() for p in dit.parameters())
    if name == "ltx-2.3":
        assert abs(params / 1e9 - 21.01) < 0.01  # ComfyUI's LTXAVModel alone
        params += text_encoders.ENCODERS["ltx2.3-projection"][1]
    assert abs(params / 1e9 - published) <= half_unit, (name, params)


# The text projection tensors of the LTX-2 / LTX-2.3 text encoder files (name -> shape; 3840 x 49 Gemma 3
# hidden states in). ComfyUI picks the projection's class from these names, and from 0.33 on its sizes
# too (0.29 fixed them, 0.33 defaults the video part to 3840 wide): each tree's own ``lt.sd_detect``
# reads them, so the class built below is the one that tree builds for the real file.
LTX2_PROJECTION = {"text_embedding_projection.aggregate_embed.weight": (3840, 3840 * 49)}
LTX23_PROJECTION = {"text_embedding_projection.video_aggregate_embed.weight": (4096, 3840 * 49),
                    "text_embedding_projection.video_aggregate_embed.bias": (4096,),
                    "text_embedding_projection.audio_aggregate_embed.weight": (2048, 3840 * 49),
                    "text_embedding_projection.audio_aggregate_embed.bias": (2048,)}


def _projection_keys(shapes):
    return {k: torch.empty(shape, device="meta") for k, shape in shapes.items()}


@pytest.mark.comfy
def test_text_encoder_sizes_are_comfyui_classes(comfy):
    """``ENCODERS`` holds the parameter counts of ComfyUI's own text encoder classes on meta, built
    as ComfyUI builds them for the files (the projection's kind and sizes from its tensor names)."""
    _, text_encoders = comfy
    try:
        from comfy.text_encoders import hunyuan_image, hunyuan_video, kandinsky5, lt, wan
        lt.ltxav_te, hunyuan_image.te, kandinsky5.te  # noqa: B018 (0.29's)
    except (ImportError, AttributeError):
        pytest.skip("ComfyUI's LTX-2 / HunyuanVideo 1.5 / Kandinsky 5 text encoders are absent (added after "
                    "ComfyUI 0.3.64)")
    builds = {  # ComfyUI's factory -> (its attribute, our key) per part
        lt.ltxav_te(**lt.sd_detect([_projection_keys(LTX23_PROJECTION)])): (
            ("gemma3_12b", "gemma3-12b"), ("text_embedding_projection", "ltx2.3-projection")),
        lt.ltxav_te(**lt.sd_detect([_projection_keys(LTX2_PROJECTION)])): (
            ("text_embedding_projection", "ltx2-projection"),),
        hunyuan_image.te(byt5=True): (("qwen25_7b", "qwen2.5-vl-7b"), ("byt5_small", "byt5-small")),
        kandinsky5.te(): (("clip_l", "clip-l"),),
        wan.te(): (("umt5xxl", "umt5-xxl"),),
        lt.ltxv_te(): (("t5xxl", "t5-xxl"),),
        hunyuan_video.hunyuan_video_clip(): (("llama", "llava-llama3-8b"),),
    }
    expected = set(text_encoders.ENCODERS)
    try:
        from comfy.text_encoders import minimax
        builds[minimax.te()] = (("qwen3vl_32b", "qwen3-vl-32b-h3"),)
    except ImportError:  # 0.29: no MiniMax H3
        expected.discard("qwen3-vl-32b-h3")
    seen = set()
    for factory, parts in builds.items():
        model = factory(device="meta", dtype=torch.bfloat16)
        for attr, key in parts:
            assert sum(p.numel() for p in getattr(model, attr).parameters()) == text_encoders.ENCODERS[key][1], key
            seen.add(key)
    assert seen == expected


@pytest.mark.comfy
def test_plan_ltx23_fp8_json_has_text_encoder_beside_the_dit(comfy, capsys):
    """`plan --json` for LTX-2.3 fp8 on 2x24 GiB: the DiT in 1-byte weights, and its 24.9 GiB Gemma 3
    12B encoder, which no GPU holds beside the DiT (23.0 GiB usable each): ShardDiT's loader would put
    it on the CPU."""
    from sharddit.loaders.cli.main import main

    presets, text_encoders = comfy
    _skip_unless_has(presets, "ltx-2.3-fp8")
    rc = main(["plan", "--model", "ltx-2.3-fp8", "--devices", TWO_24, "--size", "256x256", "--frames", "9",
               "--json"])
    out = capsys.readouterr()
    assert rc in (0, 3), out.out + out.err
    data = json.loads(out.out)
    assert data["fits"] == (rc == 0) and data["dtype"] == "fp8"
    te = data["text_encoder"]
    gemma, projection = (text_encoders.ENCODERS[k][1] for k in ("gemma3-12b", "ltx2.3-projection"))
    assert te["name"] == "Gemma 3 12B + LTX-2.3 text projection"
    assert te["bytes_bf16"] == 2 * (gemma + projection)  # 26.7e9 bytes = 24.9 GiB; Gemma alone 24.4 GB
    assert te["device"] == "cpu"
    dit_bytes = sum(d["weights"] for d in data["devices"].values())
    assert abs(dit_bytes / 21.01e9 - 1) < 0.01  # ~1 byte per parameter


def test_every_preset_names_its_text_encoder():
    from sharddit.loaders.plan.presets import PRESETS
    from sharddit.loaders.plan.text_encoders import ENCODERS, TextEncoderReport, encoders_of
    from sharddit.parallel.families import get_family

    expect = {"ltx-2.3": ("gemma3-12b", "ltx2.3-projection"), "hunyuanvideo-1.5": ("qwen2.5-vl-7b", "byt5-small"),
              "hunyuanvideo-13b": ("llava-llama3-8b", "clip-l"), "kandinsky5-pro": ("qwen2.5-vl-7b", "clip-l"),
              "wan2.2-i2v-a14b": ("umt5-xxl",), "ltxv-13b": ("t5-xxl",), "minimax-h3-fp8": ("qwen3-vl-32b-h3",)}
    for name, keys in expect.items():
        assert encoders_of(get_family(PRESETS[name].family), PRESETS[name].unet_config) == keys, name
    assert all(encoders_of(get_family(spec.family), spec.unet_config) for spec in PRESETS.values())
    report = TextEncoderReport(tuple(ENCODERS[k] for k in expect["ltx-2.3"]), "cpu")
    assert report.to_text().startswith("text encoder: Gemma 3 12B + LTX-2.3 text projection 24.9 GiB bf16 "
                                       "(12.4 fp8, 13.3B parameters), run before the DiT; ShardDiTLoadTextEncoder "
                                       "auto -> cpu")
