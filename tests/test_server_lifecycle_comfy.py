"""A sharded model through ComfyUI's real server (headless, CPU): POST /interrupt mid-sampling
stops promptly and the next prompt succeeds; POST /free (unload models) and the next prompt loads
the shards again and succeeds."""
import re
import time

import pytest

pytestmark = pytest.mark.comfy


def _graph(tiny_models, steps: int, seed: int, prefix: str, parallel: str = "auto") -> dict:
    names = tiny_models.names
    return {
        "1": {"class_type": "ShardDiTLoadDiffusionModel",
              "inputs": {"unet_name": names["wan21_t2v"], "weight_dtype": "default", "devices": "cpu,cpu",
                         "reserve_vram_gb": 0.0, "parallel": parallel}},
        "2": {"class_type": "CLIPLoader", "inputs": {"clip_name": names["umt5"], "type": "wan", "device": "default"}},
        "3": {"class_type": "CLIPTextEncode", "inputs": {"text": "a red fox in the rain", "clip": ["2", 0]}},
        "4": {"class_type": "CLIPTextEncode", "inputs": {"text": "", "clip": ["2", 0]}},
        "5": {"class_type": "EmptyHunyuanLatentVideo", "inputs": {"width": 64, "height": 64, "length": 1, "batch_size": 1}},
        "6": {"class_type": "ShardDiTKSampler",
              "inputs": {"model": ["1", 0], "seed": seed, "steps": steps, "cfg": 2.0, "sampler_name": "euler",
                         "scheduler": "simple", "positive": ["3", 0], "negative": ["4", 0],
                         "latent_image": ["5", 0], "denoise": 1.0, "devices": "auto"}},
        "7": {"class_type": "SaveLatent", "inputs": {"samples": ["6", 0], "filename_prefix": prefix}},
    }


STATUS_TIMEOUT_S = 120.0
"""How long a prompt may take to finish here; 10000 tiny steps take far longer, so a prompt that
ends within it after an interrupt was stopped by it."""


def _status(server, prompt_id, timeout=STATUS_TIMEOUT_S):
    return server.status(prompt_id, timeout)


def _last_step(server) -> int:
    return max((int(n) for n in re.findall(r"\b(\d+)/10000\b", server.log_tail(50))), default=0)


@pytest.mark.parametrize("parallel", ["blocks", "sequence"])
def test_interrupt_then_free_then_prompts_succeed(comfy_server, tiny_models, parallel):
    server = comfy_server
    long_id = server.queue_prompt(_graph(tiny_models, 10000, 2, f"life/long_{parallel}", parallel))
    deadline = time.monotonic() + 120
    while "/10000 " not in server.log_tail(5):  # the sampler's progress bar: steps are running
        assert time.monotonic() < deadline, server.log_tail()
        time.sleep(0.2)
    started = time.monotonic()
    server.interrupt()
    status = _status(server, long_id)
    stopped_after = time.monotonic() - started
    assert status["status_str"] == "error"
    assert any(m[0] == "execution_interrupted" for m in status["messages"]), status
    # _status waits at most STATUS_TIMEOUT_S: an ignored interrupt would run on to step 10000
    assert stopped_after < STATUS_TIMEOUT_S and _last_step(server) < 10000, (stopped_after, server.log_tail())

    after_interrupt = server.queue_prompt(_graph(tiny_models, 2, 3, f"life/after_interrupt_{parallel}", parallel))
    server.wait(after_interrupt)
    assert server.output_files(after_interrupt)

    server.free()
    after_free = server.queue_prompt(_graph(tiny_models, 2, 4, f"life/after_free_{parallel}", parallel))
    server.wait(after_free)
    assert server.output_files(after_free)
