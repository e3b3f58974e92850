"""Wrong files and values given to ShardDiT's loaders and decode: refused before any weight is
read, with a message naming the file, what it holds and what the input takes (real ComfyUI,
in-process, tiny files).

Every refusal runs with ``comfy.utils.load_torch_file`` and ``torch.load`` replaced by a tripwire
(``no_weights_read``): a check that lets the file through reaches core's loading and the test
fails there (core would build a random 15 GB Qwen2.5-VL for two CLIP-L files). Each loader then
loads a right file in the same session (``test_*_loads_after_refusals``): ComfyUI stays usable.
The wrong files are symlinks to the harness's tiny files (``tiny_models``, ``tiny_encoders``) in
the folder of another loader, and garbage written as ``.ckpt``.
"""
import os
import time

import pytest
import torch

pytestmark = pytest.mark.comfy

GARBAGE = b"<!DOCTYPE html><html><body>404 Not Found</body></html>\n" * 20
FAST_S = 2.0  # a header read takes milliseconds; loading any of these files takes far longer


def _skip_before_2026():
    import comfyui_version

    if comfyui_version.__version__.startswith("0.3."):
        pytest.skip(f"ComfyUI {comfyui_version.__version__} has no LTX-2 / HunyuanVideo 1.5 / Kandinsky 5 text "
                    "encoders (added after ComfyUI 0.3.64)")


@pytest.fixture(scope="module")
def wrong(comfy_env, tiny_models, tmp_path_factory):
    """The models dir of this module: tiny files under wrong folders, garbage ``.ckpt`` files,
    and (ComfyUI 0.29+) the tiny 2026 encoders; registered with folder_paths."""
    import folder_paths

    root = tmp_path_factory.mktemp("wrong_files")
    links = {"text_encoders/dit_as_te.safetensors": "wan21_t2v", "text_encoders/vae_as_te.safetensors": "wan21_vae",
             "text_encoders/lora_as_te.safetensors": "wan21_lora", "vae/dit_as_vae.safetensors": "wan21_t2v",
             "vae/te_as_vae.safetensors": "umt5"}
    for rel, kind in links.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        os.symlink(tiny_models.path(kind), root / rel)
    for folder in ("diffusion_models", "text_encoders", "checkpoints"):
        (root / folder).mkdir(exist_ok=True)
        (root / folder / "garbage.ckpt").write_bytes(GARBAGE)
    import comfyui_version

    if not comfyui_version.__version__.startswith("0.3."):
        from harness import tiny_encoders as te

        paths = te.write_tiny_encoders(root)
        os.symlink(paths["clip_l"], root / "text_encoders" / "clip_l_copy.safetensors")
    for folder in ("diffusion_models", "text_encoders", "vae", "checkpoints"):
        folder_paths.add_model_folder_path(folder, str(root / folder), is_default=True)
    cache = getattr(folder_paths, "filename_list_cache", None)
    if isinstance(cache, dict):
        cache.clear()
    return root


@pytest.fixture
def no_weights_read(monkeypatch):
    """Core's weight reading is a tripwire for the test's duration."""
    import comfy.utils

    def tripwire(*args, **kwargs):
        raise AssertionError(f"weights were read ({args[:1]}): the file was not refused before loading")

    monkeypatch.setattr(comfy.utils, "load_torch_file", tripwire)
    monkeypatch.setattr(torch, "load", tripwire)


def refused(call, *parts) -> str:
    """The ValueError of ``call()``, raised fast, whose message holds every one of ``parts``."""
    start = time.perf_counter()
    with pytest.raises(ValueError) as err:
        call()
    took = time.perf_counter() - start
    message = str(err.value)
    assert took < FAST_S, f"refused after {took:.1f} s: {message}"
    assert message.startswith("[ShardDiT]"), message
    missing = [p for p in parts if p not in message]
    assert not missing, f"{missing} not in: {message}"
    return message


def _node(env, node_id):
    return env.nodes.NODE_CLASS_MAPPINGS[node_id]


# ----------------------------------------------------------------------------- text encoder loader
TE_CASES = {  # file -> what the message says it is
    "dit_as_te.safetensors": ("a diffusion model (WAN21_T2V)", "models/diffusion_models/"),
    "vae_as_te.safetensors": ("a VAE", "models/vae/"),
    "lora_as_te.safetensors": ("a LoRA", "models/loras/"),
}


@pytest.mark.parametrize("name", sorted(TE_CASES))
def test_text_encoder_loader_refuses_dit_vae_lora(comfy_env, wrong, no_weights_read, name):
    node = _node(comfy_env, "ShardDiTLoadTextEncoder")
    refused(lambda: node.execute(name, "wan", "cpu"), repr(name), *TE_CASES[name],
            "type 'wan' of Load Text Encoder (ShardDiT) takes a T5/UMT5 file")


def test_text_encoder_loader_refuses_clip_l_as_wan(comfy_env, wrong, no_weights_read):
    _skip_before_2026()
    node = _node(comfy_env, "ShardDiTLoadTextEncoder")
    message = refused(lambda: node.execute("tiny_clip_l.safetensors", "wan", "cpu"), "'tiny_clip_l.safetensors'",
                      "a CLIP-L text encoder", "type 'wan'", "a T5/UMT5 file (e.g. umt5_xxl")
    assert "belongs in" not in message, message  # it is in the right folder, for another type


def test_text_encoder_loader_refuses_garbage_ckpt(comfy_env, wrong, no_weights_read):
    node = _node(comfy_env, "ShardDiTLoadTextEncoder")
    refused(lambda: node.execute("garbage.ckpt", "wan", "cpu"), "'garbage.ckpt'", "is not a PyTorch checkpoint",
            "HTML")


def test_text_encoder_loader_loads_after_refusals(comfy_env, tiny_models, wrong):
    node = _node(comfy_env, "ShardDiTLoadTextEncoder")
    with pytest.raises(ValueError):
        node.execute("dit_as_te.safetensors", "wan", "cpu")
    clip = node.execute(tiny_models.names["umt5"], "wan", "cpu").result[0]
    assert "umt5xxl" in clip.tokenize("a fox")


# ----------------------------------------------------------------------------- dual loader
@pytest.mark.parametrize("clip_type,wants", [("hunyuan_video_15", "byT5 (glyph)"), ("kandinsky5", "CLIP-L")])
def test_dual_loader_refuses_two_clip_l(comfy_env, wrong, no_weights_read, clip_type, wants):
    _skip_before_2026()
    node = _node(comfy_env, "ShardDiTLoadDualTextEncoder")
    refused(lambda: node.execute("tiny_clip_l.safetensors", "clip_l_copy.safetensors", clip_type, "cpu"),
            f"type {clip_type!r}", "a Qwen2.5-VL 7B file", f"a {wants} file", "'tiny_clip_l.safetensors' is a CLIP-L",
            "'clip_l_copy.safetensors' is a CLIP-L")


def test_dual_loader_refuses_a_dit(comfy_env, wrong, no_weights_read):
    _skip_before_2026()
    node = _node(comfy_env, "ShardDiTLoadDualTextEncoder")
    refused(lambda: node.execute("tiny_qwen_2.5_vl_7b.safetensors", "dit_as_te.safetensors", "kandinsky5", "cpu"),
            "'dit_as_te.safetensors' is a diffusion model",
            "type 'kandinsky5' of Load Dual Text Encoder (ShardDiT) takes a Qwen2.5-VL 7B file")


def test_dual_loader_loads_after_refusals(comfy_env, wrong):
    _skip_before_2026()
    node = _node(comfy_env, "ShardDiTLoadDualTextEncoder")
    with pytest.raises(ValueError):
        node.execute("tiny_clip_l.safetensors", "clip_l_copy.safetensors", "kandinsky5", "cpu")
    clip = node.execute("tiny_qwen_2.5_vl_7b.safetensors", "tiny_byt5_small_glyphxl.safetensors",
                        "hunyuan_video_15", "cpu").result[0]
    [(cond, _)] = clip.encode_from_tokens_scheduled(clip.tokenize("a fox"))
    assert cond.shape[-1] == 3584


# ----------------------------------------------------------------------------- LTX-2 text encoder loader
PROJECTION = "tiny_ltx-2.3_text_projection.safetensors"


@pytest.mark.parametrize("name,what", [("dit_as_te.safetensors", "a diffusion model (WAN21_T2V)"),
                                       ("tiny_clip_l.safetensors", "a CLIP-L text encoder")])
def test_ltxav_loader_refuses_dit_and_clip_l(comfy_env, wrong, no_weights_read, name, what):
    _skip_before_2026()
    node = _node(comfy_env, "ShardDiTLoadLTXAVTextEncoder")
    message = refused(lambda: node.execute(name, PROJECTION, "cpu"), repr(name), what,
                      "Load LTXV Audio Text Encoder (ShardDiT) takes a Gemma 3 12B file (e.g. gemma_3_12B")
    assert "type 'ltxav'" not in message, message


@pytest.mark.parametrize("which", ["text_encoder", "ckpt_name"])
def test_ltxav_loader_refuses_garbage_ckpt(comfy_env, wrong, no_weights_read, which):
    _skip_before_2026()
    node = _node(comfy_env, "ShardDiTLoadLTXAVTextEncoder")
    args = ("garbage.ckpt", PROJECTION) if which == "text_encoder" else ("tiny_gemma_3_12B_it.safetensors",
                                                                         "garbage.ckpt")
    refused(lambda: node.execute(*args, "cpu"), "'garbage.ckpt'", "is not a PyTorch checkpoint")


def test_ltxav_loader_loads_after_refusals(comfy_env, wrong):
    _skip_before_2026()
    node = _node(comfy_env, "ShardDiTLoadLTXAVTextEncoder")
    with pytest.raises(ValueError):
        node.execute("tiny_clip_l.safetensors", PROJECTION, "cpu")
    clip = node.execute("tiny_gemma_3_12B_it.safetensors", PROJECTION, "cpu").result[0]
    assert "gemma3_12b" in clip.tokenize("a fox")


# ----------------------------------------------------------------------------- diffusion model loader
def test_dit_loader_refuses_garbage_ckpt_and_loads_after(comfy_env, tiny_models, wrong, monkeypatch):
    import comfy.utils

    node = _node(comfy_env, "ShardDiTLoadDiffusionModel")
    read = comfy.utils.load_torch_file
    with monkeypatch.context() as patch:
        patch.setattr(comfy.utils, "load_torch_file", lambda *a, **k: pytest.fail(f"weights were read: {a[:1]}"))
        patch.setattr(torch, "load", lambda *a, **k: pytest.fail(f"torch.load reached: {a[:1]}"))
        refused(lambda: node.execute("garbage.ckpt", "default", "cpu", 0.0), "'garbage.ckpt'",
                "is not a PyTorch checkpoint", "neither a zip archive (torch.save) nor a pickle")
    assert comfy.utils.load_torch_file is read
    model = node.execute(tiny_models.names["wan21_t2v"], "default", "cpu", 0.0).result[0]
    assert type(model.model.diffusion_model).__name__ == "WanModel"


# ----------------------------------------------------------------------------- VAE loader and decode
@pytest.mark.parametrize("name,what", [("dit_as_vae.safetensors", "a diffusion model (WAN21_T2V)"),
                                       ("te_as_vae.safetensors", "a T5/UMT5 text encoder")])
def test_vae_loader_refuses_dit_and_text_encoder(comfy_env, wrong, no_weights_read, name, what):
    node = _node(comfy_env, "ShardDiTLoadVAE")
    refused(lambda: node.execute(name, "cpu"), repr(name), what, "takes a VAE file")


def test_vae_loader_loads_and_decode_refuses_other_channels(comfy_env, tiny_models, wrong, monkeypatch):
    """After a refusal the VAE loader loads the tiny Wan VAE; its tiled decode refuses LTX's
    128-channel latent before any VAE copy or tile, then decodes a 16-channel one."""
    load, decode = _node(comfy_env, "ShardDiTLoadVAE"), _node(comfy_env, "ShardDiTVAEDecodeTiled")
    with pytest.raises(ValueError):
        load.execute("dit_as_vae.safetensors", "cpu")
    vae = load.execute(tiny_models.names["wan21_vae"], "cpu").result[0]
    from harness.comfy_env import pack_module

    vae_decode = pack_module(comfy_env, "loaders.comfy.vae.tiled_decode")
    copies = []
    real_copy = vae_decode.make_replica
    monkeypatch.setattr(vae_decode, "make_replica", lambda *a: copies.append(a) or real_copy(*a))
    with torch.inference_mode():
        refused(lambda: decode.execute({"samples": torch.zeros(1, 128, 2, 4, 4)}, vae, 64, 32, 8, 4,
                                       devices="cpu,cpu"),
                "128 channels", "(1, 128, 2, 4, 4)", "WanVAE", "decodes 16-channel latents", "LTX-Video / LTX-2")
        assert not copies  # refused before any VAE copy
        images = decode.execute({"samples": torch.zeros(1, 16, 1, 4, 4)}, vae, 64, 32, 8, 4).result[0]
    assert images.shape == (1, 32, 32, 3)


# ----------------------------------------------------------------------------- devices values
PLAN_ARGS = {"model": "wan2.1-t2v-1.3b", "width": 128, "height": 128, "frames": 1, "batch": "1", "dtype": "bf16",
             "reserve_vram_gb": 0.0}


def test_plan_node_refuses_empty_devices_then_plans(comfy_env, monkeypatch):
    """``devices=''`` is refused before any simulation (it was planned as 'auto'); 'auto' plans."""
    from harness.comfy_env import pack_module

    node = _node(comfy_env, "ShardDiTPlan")
    simulator = pack_module(comfy_env, "loaders.plan.dry_run")
    with monkeypatch.context() as patch:
        patch.setattr(simulator, "simulate", lambda *a, **k: pytest.fail("simulated an empty devices input"))
        for empty in ("", "  "):
            refused(lambda empty=empty: node.execute(devices=empty, **PLAN_ARGS), "devices is empty", "'auto'", "'cuda:0,cuda:1'")
    assert "wan2.1-t2v-1.3b" in node.execute(devices="auto", **PLAN_ARGS).result[0]


@pytest.mark.parametrize("node_id", ["ShardDiTLoadDiffusionModel", "ShardDiTPlan"])
def test_too_many_device_entries_refused_with_the_limit(comfy_env, tiny_models, wrong, no_weights_read, monkeypatch,
                                                        node_id):
    """20,001 'cpu' entries: refused naming the count and the limit (the planner said "does not fit
    ... for 0.0 GiB of blocks"); 500 pass the DiT loader's validation."""
    from harness.comfy_env import pack_module

    limit = pack_module(comfy_env, "loaders.comfy.models.checks").MAX_DEVICE_ENTRIES
    devices = ",".join(["cpu"] * 20001)
    node = _node(comfy_env, node_id)
    words = ("devices lists 20001 entries", f"more than the {limit} ShardDiT takes", "'cuda:0,cuda:1'")
    if node_id == "ShardDiTPlan":  # the simulation of 20,001 entries took 172 s
        monkeypatch.setattr(pack_module(comfy_env, "loaders.plan.dry_run"), "simulate",
                            lambda *a, **k: pytest.fail("simulated 20,001 entries"))
        refused(lambda: node.execute(devices=devices, **PLAN_ARGS), *words)
        return
    message = node.validate_inputs(devices=devices)
    assert message is not True and all(w in message for w in words), message
    refused(lambda: node.execute(tiny_models.names["wan21_t2v"], "default", devices, 0.0), *words)
    assert node.validate_inputs(devices=",".join(["cpu"] * 500)) is True


# ----------------------------------------------------------------------------- no false refusals
def test_files_of_unknown_layout_are_left_to_core(comfy_env, tmp_path):
    """A layout core's detection does not know is never refused: a BERT-style text encoder
    (``bert.encoder.layer...``, 2-D weights: not a VAE although its keys say 'encoder') and a
    file of odd names pass the text-encoder and VAE checks."""
    from harness.comfy_env import pack_module
    from harness.tiny_models import save_file

    kinds = pack_module(comfy_env, "loaders.comfy.models.file_kinds")
    bert = {f"bert.encoder.layer.{i}.attention.self.{p}.weight": torch.zeros(8, 8) for i in range(2)
            for p in ("query", "key", "value")}
    odd = {"something.else.weight": torch.zeros(4, 4, 3, 3)}
    for name, sd in (("bert.safetensors", bert), ("odd.safetensors", odd)):
        save_file(sd, tmp_path / name)
        path = str(tmp_path / name)
        assert kinds.read_kind(path, name).kind == "unknown", name
        kinds.check_text_encoder_file(path, name, "hunyuan_dit")
        kinds.check_text_encoder_pair([path, path], [name, name], "hunyuan_video_15", "dual")
        kinds.check_vae_file(path, name)


def test_pytorch_files_pass_and_other_formats_are_named(comfy_env, tmp_path):
    """torch.save's zip and legacy pickle files pass the check torch.load is guarded by; a
    safetensors file under .ckpt, a GGUF file and a zip without data.pkl get their own fix."""
    import zipfile

    from harness.comfy_env import pack_module
    from harness.tiny_models import save_file

    checks = pack_module(comfy_env, "loaders.comfy.models.checks")
    sd = {"w": torch.ones(2, 2)}
    torch.save(sd, tmp_path / "zip.ckpt")
    torch.save(sd, tmp_path / "legacy.pt", _use_new_zipfile_serialization=False)
    for name in ("zip.ckpt", "legacy.pt"):
        checks.check_model_file(str(tmp_path / name), name)
    save_file(sd, tmp_path / "renamed.ckpt")
    (tmp_path / "model.gguf.pth").write_bytes(b"GGUF\x03\x00\x00\x00" + bytes(64))
    with zipfile.ZipFile(tmp_path / "other.zip.pt", "w") as archive:
        archive.writestr("readme.txt", "not a model")
    for name, words in (("renamed.ckpt", "rename it to renamed.safetensors"), ("model.gguf.pth", "is a GGUF file"),
                        ("other.zip.pt", "a zip archive without the data.pkl torch.save writes")):
        refused(lambda name=name: checks.check_model_file(str(tmp_path / name), name), repr(name), words)
