"""Careless inputs through a real ComfyUI server (CPU): refused early, on the input that is
wrong, with the value and the fix; the server stays up and the next good prompt runs.

- a 500-entry VAE ``devices`` list is refused at validation; a 40-entry one decodes a one-tile
  latent with the VAE alone and logs the entries it left out (one VAE copy per entry used to be
  built first: 43 copies of a 484 MiB VAE killed the server);
- device errors sit on ``devices``/``device`` only; ``reserve_vram_gb`` out of range is refused at
  validation, NaN when the loader starts (before loading); ``cuda:²`` is "not a device";
- broken model files fail before loading, naming the file and the fix.
"""
import json
import math
import shutil

import pytest
import requests

pytestmark = pytest.mark.comfy


def _vae_graph(tiny_models, devices: str) -> dict:
    return {
        "1": {"class_type": "EmptyHunyuanLatentVideo", "inputs": {"width": 64, "height": 64, "length": 1, "batch_size": 1}},
        "2": {"class_type": "VAELoader", "inputs": {"vae_name": tiny_models.names["wan21_vae"]}},
        "3": {"class_type": "ShardDiTVAEDecodeTiled",
              "inputs": {"samples": ["1", 0], "vae": ["2", 0], "tile_size": 512, "overlap": 64, "temporal_size": 64,
                         "temporal_overlap": 8, "tile_batch_size": "auto", "devices": devices}},
        "4": {"class_type": "PreviewImage", "inputs": {"images": ["3", 0]}},
    }


def _errors(answer, node_id):
    assert answer["status"] == 400, answer
    errors = answer["body"]["node_errors"][node_id]["errors"]
    return {e["extra_info"]["input_name"] for e in errors}, " ".join(f'{e["message"]}: {e["details"]}' for e in errors)


def test_long_vae_devices_list_refused_or_bounded(comfy_server, tiny_models):
    server = comfy_server
    inputs, text = _errors(server.validate(_vae_graph(tiny_models, ",".join(["cpu"] * 500))), "3")
    assert inputs == {"devices"} and "500 entries" in text, text
    start = len(server.log_text())
    outputs = server.run(_vae_graph(tiny_models, ",".join(["cpu"] * 40)), timeout=300)
    assert outputs["4"]["images"]
    log = server.log_text()[start:]
    assert "[ShardDiT] VAE decode: 39 of 40 listed devices left out: cpu x39 (only 1 decoder call to make)" in log
    assert "VAE replica for" not in log  # no copy was built
    assert server.proc.poll() is None


LOADERS = {  # node -> (inputs with a good file, name of its device input)
    "ShardDiTLoadDiffusionModel": ({"unet_name": "wan21_t2v", "weight_dtype": "default", "reserve_vram_gb": 0.0}, "devices"),
    "ShardDiTLoadTextEncoder": ({"clip_name": "umt5", "type": "wan"}, "device"),
    "ShardDiTLoadVAE": ({"vae_name": "wan21_vae"}, "device"),
}


def _loader_graph(tiny_models, node, **override):
    inputs, dev = LOADERS[node]
    inputs = {k: tiny_models.names[v] if k.endswith("_name") else v for k, v in inputs.items()}
    inputs[dev] = "cpu"
    inputs.update(override)
    return {"1": {"class_type": node, "inputs": inputs}, "2": {"class_type": "PreviewAny",
                                      "inputs": {"source": ["1", 0]}}}


@pytest.mark.parametrize("node", sorted(LOADERS))
@pytest.mark.parametrize("value,words", [("cuda:7", "does not exist"), ("cuda:\u00b2", "'cuda:\u00b2' is not ")])
def test_device_errors_sit_on_the_device_input_only(comfy_server, tiny_models, node, value, words):
    """ComfyUI 0.3.64 puts a validate_inputs message on every input the method takes: the loaders
    take only their device input, never the file or the reserve."""
    dev = LOADERS[node][1]
    inputs, text = _errors(comfy_server.validate(_loader_graph(tiny_models, node, **{dev: value})), "1")
    assert inputs == {dev}, text
    assert words in text and "invalid literal" not in text, text


def test_vae_decode_device_error_not_on_tile_batch_size(comfy_server, tiny_models):
    inputs, text = _errors(comfy_server.validate(_vae_graph(tiny_models, "cpu,cuda:5")), "3")
    assert inputs == {"devices"} and "'cuda:5' does not exist" in text, text


def _post_raw(server, graph):
    body = json.dumps({"prompt": graph, "client_id": server.client_id})  # NaN as a careless client sends it
    r = requests.post(f"{server.url}/prompt", data=body, timeout=30)
    return {"status": r.status_code, "body": r.json()}


@pytest.mark.parametrize("value,words", [(-1.0, "smaller than min of 0"), (5000.0, "bigger than max of 1024")])
def test_reserve_vram_out_of_range_refused_at_validation(comfy_server, tiny_models, value, words):
    """Core's own min/max check, on reserve_vram_gb only (validate_inputs takes devices alone)."""
    graph = _loader_graph(tiny_models, "ShardDiTLoadDiffusionModel", reserve_vram_gb=value)
    inputs, text = _errors(_post_raw(comfy_server, graph), "1")
    assert inputs == {"reserve_vram_gb"} and words in text, text


def test_reserve_vram_nan_refused_before_loading(comfy_server, tiny_models):
    """NaN passes core's min/max (every comparison is False) and a second validate_inputs input
    would repeat each devices message under it: the loader refuses it first thing when it runs."""
    answer = _post_raw(comfy_server, _loader_graph(tiny_models, "ShardDiTLoadDiffusionModel", reserve_vram_gb=math.nan))
    assert answer["status"] == 200, answer
    pid = answer["body"]["prompt_id"]
    with pytest.raises(Exception):
        comfy_server.wait(pid, timeout=120)
    msg = [m for m in comfy_server.history(pid)[pid]["status"]["messages"] if m[0] == "execution_error"][0][1]
    assert msg["node_id"] == "1" and "reserve_vram_gb nan is not valid" in msg["exception_message"], msg
    assert "from 0 to 1024" in msg["exception_message"], msg


@pytest.fixture
def broken_files(tiny_models):
    """Broken files under diffusion_models/sharddit_broken/ (removed afterwards)."""
    folder = tiny_models.root / "diffusion_models" / "sharddit_broken"
    folder.mkdir(exist_ok=True)
    good = tiny_models.path("wan21_t2v").read_bytes()
    (folder / "page.safetensors").write_text("<!DOCTYPE html><html><body>Sign in to download</body></html>\n")
    (folder / "empty.safetensors").write_bytes(b"")
    (folder / "truncated.safetensors").write_bytes(good[: len(good) // 2])
    shutil.copy(tiny_models.path("wan21_vae"), folder / "vae_as_dit.safetensors")
    shutil.copy(tiny_models.path("umt5"), folder / "te_as_dit.safetensors")
    yield "sharddit_broken/"
    shutil.rmtree(folder)


@pytest.mark.parametrize("name,words", [
    ("page.safetensors", "is not a safetensors file"),
    ("empty.safetensors", "is empty (0 bytes)"),
    ("truncated.safetensors", "is truncated"),
    ("vae_as_dit.safetensors", "models/vae/"),
    ("te_as_dit.safetensors", "models/text_encoders/"),
])
def test_broken_model_file_named_with_the_fix(comfy_server, tiny_models, broken_files, name, words):
    server = comfy_server
    graph = _loader_graph(tiny_models, "ShardDiTLoadDiffusionModel", unet_name=broken_files + name)
    pid = server.queue_prompt(graph)
    with pytest.raises(Exception):
        server.wait(pid, timeout=120)
    msg = [m for m in server.history(pid)[pid]["status"]["messages"] if m[0] == "execution_error"][0][1]
    text = msg["exception_message"]
    assert name in text and words in text, text
    assert "SafetensorError" not in msg["exception_type"] and "Could not detect" not in text, msg
