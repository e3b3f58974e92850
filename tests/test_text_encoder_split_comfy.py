"""Text encoders split over several devices through ShardDiT's loaders (ComfyUI 0.33, in-process).

Tiny random-weight encoders of 0.33's classes: Gemma 3 12B + the LTX-2.3 text projection
(``harness.tiny_encoders``, LTX-2's loader, which reads all 49 hidden states) and Qwen3-VL 32B as
MiniMax H3 loads it (``CLIPLoader`` type ``minimax``: 50 layers, the last one's output; built
here). Split over ``cpu,cpu`` they give core's loader's conditioning exactly (``torch.equal``: the
same layers, the same kernels, in the same order); over fake GPUs (a fake inventory) the loader's
plan puts the layers by free memory, GPU before CPU. 0.3.64 and 0.29 have no H3 encoder: skipped.
"""
import re

import pytest
import torch

pytestmark = pytest.mark.comfy

PROMPT = 'a red fox jumps over the lazy dog, a sign reads "hello"'
GiB = 2**30
QWEN3VL_32B_CONFIG = {"hidden_size": 32, "intermediate_size": 32, "num_hidden_layers": 50, "num_attention_heads": 1,
                      "num_key_value_heads": 1}
QWEN_FILE = "tiny_qwen3vl_32b_h3.safetensors"
CLIP_FILE = "tiny_clip_l_8_layers.safetensors"


def _skip_before_033():
    import comfyui_version

    try:
        import comfy.text_encoders.minimax  # noqa: F401
    except ImportError:
        pytest.skip(f"ComfyUI {comfyui_version.__version__} has no MiniMax H3 text encoder "
                    "(added after ComfyUI 0.3.64)")


def qwen3vl_32b_state_dict(seed=0, dtype=torch.float32) -> dict:
    """Qwen3-VL 32B's text model as H3's file holds it (50 layers, no norm, no head), tiny widths,
    plus the one vision key core's detection reads (the tower is built by core, unused for text)."""
    from comfy.text_encoders import minimax
    from harness.tiny_encoders import _text_weights, _with_te_config
    from harness.tiny_models import _meta_ops

    model = minimax.MiniMaxQwen3VL(QWEN3VL_32B_CONFIG, dtype, "meta", _meta_ops())
    sd = _text_weights(model, seed, dtype, skip=("visual.",))
    key = "visual.deepstack_merger_list.0.norm.weight"
    sd[key] = torch.ones(model.state_dict()[key].shape, dtype=dtype)
    return _with_te_config(sd, {"qwen3vl_32b_model_config": QWEN3VL_32B_CONFIG})


def clip_l_state_dict(seed=0, dtype=torch.float32) -> dict:
    """CLIP-L's text model with 8 layers (no vision tower: its file size and its size in memory
    agree, so ``auto``'s whole-encoder rule and its split see the same encoder)."""
    import json
    from pathlib import Path

    import comfy.clip_model
    import comfy.sd1_clip
    from harness.tiny_encoders import VOCAB_ROWS, _text_weights, _with_te_config
    from harness.tiny_models import _meta_ops
    from harness.tiny_te_hook import TINY_VOCAB_ROWS

    small = {"intermediate_size": 32, "num_hidden_layers": 8}
    config = json.loads((Path(comfy.sd1_clip.__file__).parent / "sd1_clip_config.json").read_text())
    model = comfy.clip_model.CLIPTextModel({**config, **small}, dtype, "meta", _meta_ops())
    sd = _text_weights(model, seed, dtype, folded_vocab="text_model.embeddings.token_embedding.weight")
    return _with_te_config(sd, {"model_config": small, TINY_VOCAB_ROWS: VOCAB_ROWS})


@pytest.fixture(scope="module")
def files(env, tmp_path_factory):
    """The tiny Gemma, LTX-2.3 projection and Qwen3-VL 32B files, registered with folder_paths."""
    _skip_before_033()
    import folder_paths
    from harness import tiny_encoders as te
    from harness.tiny_models import save_file

    root = tmp_path_factory.mktemp("split_encoders")
    paths = te.write_tiny_encoders(root, kinds=("gemma3_12b", "ltx2_text_projection"))
    te.register_tiny_encoders(paths)
    save_file(qwen3vl_32b_state_dict(), root / "text_encoders" / QWEN_FILE)
    save_file(clip_l_state_dict(), root / "text_encoders" / CLIP_FILE)
    folder_paths.filename_list_cache.clear()
    return {"gemma": paths["gemma3_12b"].name, "projection": paths["ltx2_text_projection"].name, "qwen": QWEN_FILE,
            "clip": CLIP_FILE, "clip_path": root / "text_encoders" / CLIP_FILE}


def _nodes(env):
    return env.nodes.NODE_CLASS_MAPPINGS


def load(env, files, family, device, core=False):
    """core's loader (``core=True``) or ShardDiT's, for H3 (``minimax``) or LTX-2.3 (``ltxv``)."""
    nodes = _nodes(env)
    if family == "stable_diffusion":
        if core:
            return nodes["CLIPLoader"]().load_clip(files["clip"], family)[0]
        return nodes["ShardDiTLoadTextEncoder"].execute(files["clip"], family, device).result[0]
    if family == "minimax":
        if core:
            return nodes["CLIPLoader"]().load_clip(files["qwen"], "minimax")[0]
        return nodes["ShardDiTLoadTextEncoder"].execute(files["qwen"], "minimax", device).result[0]
    if core:
        return nodes["LTXAVTextEncoderLoader"].execute(files["gemma"], files["projection"]).result[0]
    return nodes["ShardDiTLoadLTXAVTextEncoder"].execute(files["gemma"], files["projection"], device).result[0]


def encode(clip):
    [(cond, extra)] = clip.encode_from_tokens_scheduled(clip.tokenize(PROMPT))
    return cond, extra


def _pack(env, name):
    from harness.comfy_env import pack_module

    return pack_module(env, name)


@pytest.fixture
def placement_reset(env, monkeypatch):
    """ShardDiT's placement registry emptied for the test and restored afterwards."""
    monkeypatch.setattr(_pack(env, "loaders.comfy.core.component_placement"), "_PLACED", {})


@pytest.mark.parametrize("family,device,layers", [("minimax", "cpu,cpu", 50), ("ltxv", "cpu,cpu,cpu", 48)])
def test_split_over_cpus_encodes_as_core(env, files, placement_reset, caplog, family, device, layers):
    """Every layer carries its device and the conditioning (and its extras: H3's token tags,
    LTX-2's unprocessed embeds) is core's loader's, bit for bit."""
    split = _pack(env, "loaders.comfy.loading.text_encoder_split")
    from sharddit.parallel.blocks.layer_devices import layer_device

    with caplog.at_level("INFO", logger="sharddit"):
        clip = load(env, files, family, device)
    found = split.encoder_layers(clip.patcher.model)
    n = device.count(",") + 1
    assert len(found) == layers and all(layer_device(layer) == torch.device("cpu") for layer in found)
    per = layers // n
    expected = ", ".join(f"cpu layers {i * per}-{(i + 1) * per - 1 if i < n - 1 else layers - 1}" for i in range(n))
    assert any(m.endswith(f"split over cpu: {expected}") for m in caplog.messages), caplog.messages
    cond, extra = encode(clip)
    ref, ref_extra = encode(load(env, files, family, None, core=True))
    assert torch.equal(cond, ref), (family, (cond - ref).abs().max())
    assert set(extra) == set(ref_extra)
    for key, value in ref_extra.items():
        assert torch.equal(extra[key], value) if torch.is_tensor(value) else extra[key] == value, key


def _fake_gpus(env, monkeypatch, spec):
    """The loader sees ``spec`` (fake GPUs) as its inventory; ``apply_split`` records the plan
    instead of moving tensors to GPUs this machine does not have."""
    from sharddit.parallel.placement.inventory import inventory_from_spec

    loading = _pack(env, "loaders.comfy.loading.component_loading")
    monkeypatch.setattr(loading, "current_inventory", lambda: inventory_from_spec(spec))
    plans = []
    monkeypatch.setattr(loading.te_split, "apply_split", lambda clip, plan: plans.append(plan))
    return plans


def _layer_bytes(env, files, family):
    split = _pack(env, "loaders.comfy.loading.text_encoder_split")
    return split.sizes(load(env, files, family, None, core=True))


def _per_device(layer_bytes, plan) -> dict:
    out = dict.fromkeys(plan.devices, 0)
    for size, device in zip(layer_bytes, plan.layer_devices()):
        out[device] += size
    return out


@pytest.mark.parametrize("share0,share1,expected", [
    (0.6, 0.5, ["cuda:0", "cuda:1"]),  # neither GPU holds it, both together do
    (0.3, 0.1, ["cuda:0", "cpu"]),     # cuda:1 has no room for one layer; the CPU takes what cuda:0 cannot
])
def test_auto_splits_by_free_memory_gpu_before_cpu(env, files, placement_reset, monkeypatch, caplog,
                                                   share0, share1, expected):
    """``auto``, no GPU holding the whole encoder (by its file, as before): its layers go to the
    GPUs by free memory (home and the first layers on the one with most room), the CPU only for
    what they cannot take; no GPU is given more than its free memory less the 1 GiB reserve."""
    layer_bytes, home = _layer_bytes(env, files, "stable_diffusion")
    total = sum(layer_bytes)
    free0, free1 = int(GiB + home + share0 * total), int(GiB + share1 * total)
    assert max(free0, free1) - GiB < files["clip_path"].stat().st_size  # the whole-encoder rule says no
    plans = _fake_gpus(env, monkeypatch, f"cuda:0={free0}bytes,cuda:1={free1}bytes")
    with caplog.at_level("INFO", logger="sharddit"):
        load(env, files, "stable_diffusion", "auto")
    [plan] = plans
    assert [r.device for r in plan.ranges] == expected and plan.home == "cuda:0"
    held = _per_device(layer_bytes, plan)
    assert held["cuda:0"] + home <= free0 - GiB and held.get("cuda:1", 0) <= free1 - GiB
    assert held["cuda:0"] > total * share0 - max(layer_bytes)  # cuda:0 filled up to a layer of its room
    assert any(f"split over {', '.join(expected)}: cuda:0 layers 0-" in m for m in caplog.messages), caplog.messages


def test_a_list_of_gpus_splits_gemma_by_their_free_memory(env, files, placement_reset, monkeypatch):
    """``cuda:1,cuda:0`` for LTX-2.3's Gemma: home on cuda:1 (listed first), its 48 layers in
    proportion to each GPU's room (3 : 1 here), none over it."""
    layer_bytes, home = _layer_bytes(env, files, "ltxv")
    total = sum(layer_bytes)
    slack = min(layer_bytes) // 2  # and the DiT's 1-byte stand-in: no layer more
    free0, free1 = int(GiB + 0.25 * total + slack), int(GiB + home + 0.75 * total + slack)
    plans = _fake_gpus(env, monkeypatch, f"cuda:0={free0}bytes,cuda:1={free1}bytes")
    load(env, files, "ltxv", "cuda:1,cuda:0")
    [plan] = plans
    assert plan.home == "cuda:1" and [(r.device, r.start, r.stop) for r in plan.ranges] == [("cuda:1", 0, 36),
                                                                                          ("cuda:0", 36, 48)]
    held = _per_device(layer_bytes, plan)
    assert held["cuda:1"] + home <= free1 - GiB and held["cuda:0"] <= free0 - GiB


def test_auto_keeps_a_whole_encoder_on_the_gpu_that_holds_it(env, files, placement_reset, monkeypatch):
    """Room for the whole encoder on one GPU: no split (the single-device path, as before)."""
    plans = _fake_gpus(env, monkeypatch, f"cuda:0={4 * GiB}bytes")
    clip = load(env, files, "minimax", "auto")
    assert plans == [] and str(clip.patcher.load_device) == "cuda:0"


@pytest.mark.parametrize("device,match", [
    ("cpu;cpu", r"device 'cpu;cpu' is not valid; accepted: 'auto', 'cpu' or 'cuda:N', or a list to split"),
    ("cuda:0,gpu1", r"devices 'cuda:0,gpu1': 'gpu1' is not a device.*; for a text encoder: 'auto', 'cpu' or 'cuda:N', or a list"),
    ("cpu,cuda:7", r"device 'cuda:7' does not exist; this machine has cpu"),
])
def test_bad_device_strings_fail_clearly_before_loading(env, files, device, match):
    """Named in validate_inputs (the message under the input) and when the node runs; nothing loads."""
    node = _nodes(env)["ShardDiTLoadTextEncoder"]
    said = node.validate_inputs(device=device)
    assert re.search(match, said) and said.startswith("[ShardDiT] ") and said.count("[ShardDiT]") == 1, said
    before = [id(m) for m in env.mm.loaded_models()]
    with pytest.raises(ValueError, match=match):
        node.execute(files["qwen"], "minimax", device)
    assert [id(m) for m in env.mm.loaded_models()] == before


def test_plan_shows_h3s_encoder_over_the_gpus_and_its_time(env, capsys):
    """The issue's `plan` (H3 fp8, 4 x 24 GiB, DiT over all four in `sequence`): Qwen3-VL 32B's 48 GiB
    fits no GPU beside the DiT, so its 50 layers go over the four GPUs' room, the CPU only for the
    last ones; the line names the layers per device and the time per prompt, which is each layer's
    2 FLOP per parameter per token at its device's rate (no GPU name given: the RTX 4090 row)."""
    import json

    from sharddit.loaders.cli.main import main
    from sharddit.loaders.plan import text_encoders as te

    _skip_before_033()
    from sharddit.parallel.cost.inputs import gpu_flops

    four = ",".join(f"cuda:{i}=24GiB" for i in range(4))
    args = ["plan", "--model", "minimax-h3-fp8", "--devices", four, "--size", "1280x704", "--frames", "121"]
    assert main(args + ["--json"]) in (0, 3)
    data = json.loads(capsys.readouterr().out)["text_encoder"]
    split = data["split"]
    assert [s[1:] for s in split] == [[a, b] for a, b in zip([0] + [s[2] for s in split[:-1]], [s[2] for s in split])]
    assert split[-1][2] == 50 and split[-1][0] == "cpu" and {s[0] for s in split[:-1]} == {f"cuda:{i}" for i in range(4)}
    gpu_layers, cpu_layers = 50 - (split[-1][2] - split[-1][1]), split[-1][2] - split[-1][1]
    per_layer_flops = 2 * te.LAYERS["qwen3-vl-32b-h3"][1] / 50 * 256
    expected = gpu_layers * per_layer_flops / gpu_flops("RTX 4090") + cpu_layers * per_layer_flops / (te.CPU_TFLOPS * 1e12)
    assert data["prompt_tokens"] == 256 and abs(data["seconds_per_prompt"] / expected - 1) < 1e-9
    assert main(args) in (0, 3)
    out = capsys.readouterr().out
    counts = ", ".join(f"{d} {b - a}" for d, a, b in split)
    assert (f"ShardDiTLoadTextEncoder auto -> split, layers per device: {counts} (home {split[0][0]}; no single "
            f"device holds it, GPUs first); about {expected:.1f} s per prompt (256 tokens;") in out, out


def test_plan_layer_counts_are_what_the_loader_splits(env):
    """``LAYERS`` (the plan's) is what ``encoder_layers`` (the loader's) finds in ComfyUI 0.33's own
    classes on meta: Gemma 3 12B's 48, Qwen3-VL 32B's 50 (vision towers left out), umT5's 24 blocks."""
    _skip_before_033()
    from comfy.text_encoders import lt, minimax, wan
    from sharddit.loaders.plan.text_encoders import LAYERS

    split = _pack(env, "loaders.comfy.loading.text_encoder_split")
    builds = {"gemma3-12b": (lt.ltxav_te(), "gemma3_12b"), "qwen3-vl-32b-h3": (minimax.te(), "qwen3vl_32b"),
              "umt5-xxl": (wan.te(), "umt5xxl")}
    for key, (factory, attr) in builds.items():
        layers = split.encoder_layers(getattr(factory(device="meta", dtype=torch.bfloat16), attr))
        assert (len(layers), sum(p.numel() for layer in layers for p in layer.parameters())) == LAYERS[key], key


def test_a_list_without_room_names_the_fix_and_auto_keeps_the_cpu(env, files, placement_reset, monkeypatch):
    """Two fake GPUs with room for half a layer beyond the 1 GiB reserve: the list ``cuda:0,cuda:1`` is
    refused with each device's room and the fix (end the list with ',cpu'); ``auto`` keeps the whole
    encoder on the CPU as before (no GPU can take a layer)."""
    layer_bytes, _ = _layer_bytes(env, files, "stable_diffusion")
    free = GiB + min(layer_bytes) // 2
    plans = _fake_gpus(env, monkeypatch, f"cuda:0={free}bytes,cuda:1={free}bytes")
    placement_error = _pack(env, "parallel.placement.plan_text").PlacementError
    with pytest.raises(placement_error, match=r"does not fit device 'cuda:0,cuda:1' \(room for layers: cuda:0 -?0\.00 "
                                              r"GiB, cuda:1 0\.00 GiB\)\. Add devices \(e\.g\. end the list with ',cpu'\)"):
        load(env, files, "stable_diffusion", "cuda:0,cuda:1")
    clip = load(env, files, "stable_diffusion", "auto")
    assert plans == [] and str(clip.patcher.load_device) == "cpu"


def test_the_split_is_put_back_after_each_comfyui_load(env, files, placement_reset):
    """ComfyUI moves a model it loads to its load device (the CPU for a split encoder); the patcher's
    ON_LOAD callback then places the layers again. Here the routing is taken off, ComfyUI unloads
    everything and the next encode loads the encoder again: every layer is routed once more and
    the conditioning is unchanged."""
    from sharddit.parallel.blocks.layer_devices import layer_device, remove_layer_hooks

    split = _pack(env, "loaders.comfy.loading.text_encoder_split")
    clip = load(env, files, "minimax", "cpu,cpu")
    ref, _ = encode(clip)
    layers = split.encoder_layers(clip.patcher.model)
    remove_layer_hooks(layers)
    env.mm.unload_all_models()
    assert all(layer_device(layer) is None for layer in layers)
    cond, _ = encode(clip)
    assert all(layer_device(layer) == torch.device("cpu") for layer in layers)
    assert torch.equal(cond, ref)


def test_the_dual_loader_splits_its_pair_too(env, files, placement_reset, caplog):
    """Kandinsky 5's pair (Qwen2.5-VL 7B + CLIP-L) through ShardDiTLoadDualTextEncoder over
    ``cpu,cpu``: both encoders' layers (4 + 2) are split as one list, by bytes, and the conditioning
    and pooled output are core DualCLIPLoader's."""
    from harness import tiny_encoders as te

    paths = te.write_tiny_encoders(files["clip_path"].parent.parent, kinds=("qwen25_7b", "clip_l"))
    te.register_tiny_encoders(paths)
    first, second = paths["qwen25_7b"].name, paths["clip_l"].name
    with caplog.at_level("INFO", logger="sharddit"):
        clip = _nodes(env)["ShardDiTLoadDualTextEncoder"].execute(first, second, "kandinsky5", "cpu,cpu").result[0]
    assert len(_pack(env, "loaders.comfy.loading.text_encoder_split").encoder_layers(clip.patcher.model)) == 6
    assert any(re.search(r"split over cpu: cpu layers 0-\d, cpu layers \d-5$", m) for m in caplog.messages)
    cond, extra = encode(clip)
    ref, ref_extra = encode(_nodes(env)["DualCLIPLoader"]().load_clip(first, second, "kandinsky5")[0])
    assert torch.equal(cond, ref) and torch.equal(extra["pooled_output"], ref_extra["pooled_output"])


def test_tokens_are_embedded_on_the_first_device_not_the_load_device(env, files, placement_reset):
    """Core's encode sets the execution device to the patcher's load device (the CPU, for a split
    encoder); the split encoder takes its first device instead, where its embeddings are (here the
    CPU again, so the load device is given as ``meta`` to tell the two apart)."""
    clip = load(env, files, "minimax", "cpu,cpu")
    model = clip.cond_stage_model
    model.set_clip_options({"execution_device": torch.device("meta")})
    assert getattr(model, model.clip).execution_device == torch.device("cpu")
    model.reset_clip_options()
