"""Every ShardDiT node's checked inputs, through a real ComfyUI server's POST /prompt (CPU): a bad
value is refused at validation (HTTP 400, nothing queued), with exactly one error per bad input,
under that input, naming the value.

ComfyUI shows a ``validate_inputs`` message under EVERY input the method takes (a devices error
used to show under ``devices`` and ``reserve_vram_gb``); and ComfyUI 0.3.64 does not check a V3
combo's value at all ('' / 'ring' / null for ``parallel`` failed only when the node ran).
"""
import pytest

pytestmark = pytest.mark.comfy

MODEL = {"class_type": "UNETLoader", "inputs": {"unet_name": "wan21_t2v", "weight_dtype": "default"}}
CLIP = {"class_type": "CLIPLoader", "inputs": {"clip_name": "umt5", "type": "wan"}}
LATENT = {"class_type": "EmptyHunyuanLatentVideo", "inputs": {"width": 64, "height": 64, "length": 1, "batch_size": 1}}
PREVIEW = {"class_type": "PreviewAny", "inputs": {"source": ["1", 0]}}

# node -> (its good inputs, the other nodes of a graph that validates; node "1" is the one tested)
NODES = {
    "ShardDiTLoadDiffusionModel": ({"unet_name": "wan21_t2v", "weight_dtype": "default", "devices": "cpu",
                                    "reserve_vram_gb": 0.0, "parallel": "auto"}, {"9": PREVIEW}),
    "ShardDiTShardModel": ({"model": ["2", 0], "devices": "cpu", "reserve_vram_gb": 0.0, "parallel": "auto"},
                           {"2": MODEL, "9": PREVIEW}),
    "ShardDiTKSampler": ({"model": ["2", 0], "seed": 0, "steps": 1, "cfg": 1.0, "sampler_name": "euler",
                          "scheduler": "simple", "positive": ["4", 0], "negative": ["4", 0], "latent_image": ["5", 0],
                          "denoise": 1.0, "devices": "cpu", "parallel": "auto"},
                         {"2": MODEL, "3": CLIP, "4": {"class_type": "CLIPTextEncode",
                                                       "inputs": {"clip": ["3", 0], "text": "a cat"}},
                          "5": LATENT, "9": PREVIEW}),
    "ShardDiTVAEDecodeTiled": ({"samples": ["5", 0], "vae": ["6", 0], "tile_size": 512, "overlap": 64,
                                "temporal_size": 64, "temporal_overlap": 8, "tile_batch_size": "auto",
                                "devices": "cpu"},
                               {"5": LATENT, "6": {"class_type": "VAELoader", "inputs": {"vae_name": "wan21_vae"}},
                                "9": PREVIEW}),
    "ShardDiTLoadTextEncoder": ({"clip_name": "umt5", "type": "wan", "device": "cpu"}, {"9": PREVIEW}),
    "ShardDiTLoadVAE": ({"vae_name": "wan21_vae", "device": "cpu"}, {"9": PREVIEW}),
    "ShardDiTPlan": ({"devices": "cuda:0=24GiB", "model": "wan2.1-t2v-1.3b", "width": 256, "height": 256,
                      "frames": 5, "batch": "auto", "dtype": "bf16", "reserve_vram_gb": 1.0, "parallel": "auto",
                      "cfg": 6.0, "gpu": "", "link_gbps": 0.0}, {}),
}
_FILES = {"unet_name": "wan21_t2v", "clip_name": "umt5", "vae_name": "wan21_vae"}


def _graph(tiny_models, node, **bad):
    inputs, others = NODES[node]
    graph = {k: {"class_type": v["class_type"], "inputs": dict(v["inputs"])} for k, v in others.items()}
    graph["1"] = {"class_type": node, "inputs": {**inputs, **bad}}
    for n in graph.values():
        for k, kind in _FILES.items():
            if k in n["inputs"]:
                n["inputs"][k] = tiny_models.names[kind]
    return graph


def _errors(server, tiny_models, node, **bad) -> list[dict]:
    answer = server.validate(_graph(tiny_models, node, **bad))
    assert answer["status"] == 400, f"{node} {bad}: not refused at validation: {answer}"
    node_errors = answer["body"]["node_errors"]
    assert set(node_errors) == {"1"}, node_errors  # only the node with the bad input
    return node_errors["1"]["errors"]


def _one_error_under(errors, name) -> str:
    assert [e["extra_info"]["input_name"] for e in errors] == [name], errors
    return f'{errors[0]["message"]}: {errors[0]["details"]}'


CASES = [  # (node, input, bad value, words of the one message)
    *[(n, "devices", v, w) for n in ("ShardDiTLoadDiffusionModel", "ShardDiTShardModel", "ShardDiTKSampler",
                                    "ShardDiTVAEDecodeTiled")
      for v, w in (("cuda:7", "'cuda:7' does not exist"), ("", "'' is not a device"),
                   ("cpu,w1/cpu,w1/cpu", "'w1/cpu' 2 times"))
      if not (n == "ShardDiTVAEDecodeTiled" and "/" in v)],
    *[(n, "device", v, w) for n in ("ShardDiTLoadTextEncoder", "ShardDiTLoadVAE")
      for v, w in (("cuda:7", "'cuda:7' does not exist"), ("cpu,cpu", "'cpu,cpu' is not valid"))
      if not (n == "ShardDiTLoadTextEncoder" and v == "cpu,cpu")],  # a text encoder splits over a list
    ("ShardDiTLoadTextEncoder", "device", "cpu,gpu1", "'gpu1' is not a device"),
    # null: 0.3.64 names it 'None' (a string by then), 0.29 None
    *[(n, "parallel", v, "None" if v is None else repr(v)) for n in ("ShardDiTLoadDiffusionModel", "ShardDiTShardModel",
                                                 "ShardDiTKSampler", "ShardDiTPlan")
      for v in ("", "ring", None)],
    *[(n, "reserve_vram_gb", v, w) for n in ("ShardDiTLoadDiffusionModel", "ShardDiTShardModel", "ShardDiTPlan")
      for v, w in ((-1.0, "smaller than min of 0"), (5000.0, "bigger than max of 1024"))],
    ("ShardDiTLoadDiffusionModel", "weight_dtype", "fp4", "'fp4'"),
    ("ShardDiTLoadTextEncoder", "type", "no_such_type", "'no_such_type'"),
    ("ShardDiTKSampler", "sampler_name", "eulerr", "'eulerr'"),
    ("ShardDiTKSampler", "scheduler", "", "''"),
    ("ShardDiTPlan", "batch", "3", "'3'"),
    ("ShardDiTPlan", "model", "wan9", "'wan9'"),
    ("ShardDiTPlan", "dtype", "int4", "'int4'"),
    ("ShardDiTPlan", "gpu", "RTX 9999", "'RTX 9999'"),
    ("ShardDiTPlan", "cfg", 0.5, "smaller than min of 1"),
    ("ShardDiTPlan", "link_gbps", -1.0, "smaller than min of 0"),
]


@pytest.mark.parametrize("node,name,value,words", CASES, ids=[f"{c[0]}-{c[1]}-{c[2]!r}" for c in CASES])
def test_a_bad_input_is_one_error_under_that_input(comfy_server, tiny_models, node, name, value, words):
    text = _one_error_under(_errors(comfy_server, tiny_models, node, **{name: value}), name)
    assert words in text, text
    if name in ("devices", "device"):  # the pack's own check: its message carries the prefix once
        assert text.count("[ShardDiT]") == 1, text


@pytest.mark.parametrize("node,bad", [
    ("ShardDiTLoadDiffusionModel", {"devices": "cuda:7", "parallel": "ring", "reserve_vram_gb": -1.0}),
    ("ShardDiTShardModel", {"devices": "", "parallel": None}),
    ("ShardDiTKSampler", {"devices": "cuda:7", "parallel": "", "sampler_name": "eulerr"}),
    ("ShardDiTPlan", {"batch": "3", "parallel": "ring", "gpu": "RTX 9999", "cfg": 0.5}),
])
def test_several_bad_inputs_each_one_error_under_its_own_input(comfy_server, tiny_models, node, bad):
    errors = _errors(comfy_server, tiny_models, node, **bad)
    assert sorted(e["extra_info"]["input_name"] for e in errors) == sorted(bad), errors


@pytest.mark.parametrize("node,name", [("ShardDiTLoadDiffusionModel", "devices"), ("ShardDiTLoadVAE", "device")])
def test_a_devices_input_fed_by_a_link_is_checked_when_the_node_runs(comfy_server, tiny_models, node, name):
    """A linked input reaches ``validate_inputs`` as None (its value is made later): not an error
    then; the node checks it when it runs. A bad linked value fails there, naming it."""
    graph = _graph(tiny_models, node, **{name: ["7", 0]})
    graph["7"] = {"class_type": "PrimitiveString", "inputs": {"value": "cuda:7"}}
    answer = comfy_server.validate(graph)
    assert answer["status"] == 200, answer
    pid = answer["body"]["prompt_id"]
    with pytest.raises(Exception):
        comfy_server.wait(pid, timeout=120)
    msg = [m for m in comfy_server.history(pid)[pid]["status"]["messages"] if m[0] == "execution_error"][0][1]
    assert msg["node_id"] == "1" and "'cuda:7' does not exist" in msg["exception_message"], msg
