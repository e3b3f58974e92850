"""ShardDiTKSampler on a MODEL from core's UNETLoader, through a real server: repeated prompts
(new seed each, so the sampler runs while the loader's output is cached) keep the same sharded
clone loaded. ComfyUI logs one "Requested to load <model>" line per model it loads; the shards
are ShardRoot modules."""
import re

import pytest

pytestmark = pytest.mark.comfy


def _graph(tiny_models, seed: int) -> dict:
    names = tiny_models.names
    return {
        "1": {"class_type": "UNETLoader", "inputs": {"unet_name": names["wan21_t2v"], "weight_dtype": "default"}},
        "2": {"class_type": "CLIPLoader", "inputs": {"clip_name": names["umt5"], "type": "wan", "device": "default"}},
        "3": {"class_type": "CLIPTextEncode", "inputs": {"text": "a fox", "clip": ["2", 0]}},
        "4": {"class_type": "CLIPTextEncode", "inputs": {"text": "", "clip": ["2", 0]}},
        "5": {"class_type": "EmptyHunyuanLatentVideo", "inputs": {"width": 16, "height": 16, "length": 1, "batch_size": 1}},
        "6": {"class_type": "ShardDiTKSampler",
              "inputs": {"model": ["1", 0], "seed": seed, "steps": 1, "cfg": 1.0, "sampler_name": "euler",
                         "scheduler": "simple", "positive": ["3", 0], "negative": ["4", 0],
                         "latent_image": ["5", 0], "denoise": 1.0, "devices": "cpu,cpu"}},
        "7": {"class_type": "SaveLatent", "inputs": {"samples": ["6", 0], "filename_prefix": f"reuse/{seed}"}},
    }


def test_ksampler_on_core_model_loads_once_over_ten_prompts(comfy_server, tiny_models):
    server = comfy_server
    server.free()
    start = len(server.log_text())
    for seed in range(10):
        server.run(_graph(tiny_models, 1000 + seed))
    log = server.log_text()[start:]
    requested = re.findall(r"Requested to load (\w+)", log)
    assert requested.count("WAN21") == 1, requested
    assert requested.count("ShardRoot") == 2, requested  # one per shard, once
    assert "unloading the unsharded copy" not in log
