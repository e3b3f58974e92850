"""A ComfyUI server that accepts ShardDiT workers, and worker processes joining it (127.0.0.1).

``dist_server_scope(tiny_models, workdir, timeout_s, weights)``: the server started with
``SHARDDIT_DIST_ADDR`` on a free port; ``Worker(server, name)``: ``python <pack-dir> worker --join``
as a subprocess with its output in a log file; ``wan_graph(...)``: a tiny Wan 2.1 text-to-video
graph with a LoRA, sampled by core's KSampler or ShardDiT's.
"""
from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time

from harness.server import REPO, ComfyServer, free_port


class Worker:
    """``python <pack-dir> worker --join 127.0.0.1:PORT --name NAME --devices cpu`` (output in ``log``)."""

    def __init__(self, server, name: str = "w1", timeout_s: float = 10.0):
        from harness.comfy_env import comfy_path
        self.log = server.workdir / f"worker_{name}_{time.monotonic_ns()}.log"
        env = {**os.environ, "COMFYUI_PATH": str(comfy_path()), "SHARDDIT_DIST_TIMEOUT": str(timeout_s),
               "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
        env.pop("PYTHONPATH", None)
        with open(self.log, "wb") as out:
            cmd = [sys.executable, str(REPO), "worker", "--join", f"127.0.0.1:{server.dist_port}", "--name", name,
                   "--devices", "cpu"]
            self.proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def wait_joined(self, timeout: float = 120.0) -> "Worker":
        deadline = time.monotonic() + timeout
        while "joined" not in self.text():
            assert self.proc.poll() is None, self.text()
            assert time.monotonic() < deadline, self.text()
            time.sleep(0.2)
        return self

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(15)


@contextlib.contextmanager
def dist_server_scope(tiny_models, workdir, timeout_s: float = 10.0, weights: str | None = None):
    """A started ComfyUI server listening for workers (``server.dist_port``); ``server.workers``:
    the ``Worker``s a test started, killed at the end with the server."""
    from harness.comfy_env import comfy_path
    port = free_port()
    keys = ("SHARDDIT_DIST_ADDR", "SHARDDIT_DIST_TIMEOUT", "SHARDDIT_DIST_WEIGHTS")
    old = {k: os.environ.get(k) for k in keys}
    os.environ.update(SHARDDIT_DIST_ADDR=f"127.0.0.1:{port}", SHARDDIT_DIST_TIMEOUT=str(timeout_s))
    os.environ.pop("SHARDDIT_DIST_WEIGHTS", None)
    if weights:
        os.environ["SHARDDIT_DIST_WEIGHTS"] = weights
    server = ComfyServer(comfy_path(), workdir, tiny_models.root)
    try:
        server.start()
    finally:
        for k, v in old.items():
            os.environ.pop(k, None) if v is None else os.environ.__setitem__(k, v)
    server.dist_port, server.workers = port, []
    try:
        yield server
    finally:
        for w in server.workers:
            w.kill()
        server.stop()


def wan_graph(names, sampler: str, prefix: str, devices: str = "", cfg: float = 1.0, steps: int = 2, seed: int = 5,
              width: int = 80, height: int = 80, length: int = 5, lora: float = 1.0,
              lora_name: str = "wan21_lora_all", parallel: str = "sequence", decode: bool = False,
              shard_loader: bool = False, shift: float | None = None) -> dict:
    """Tiny Wan 2.1 + LoRA, text to video, sampled by core's ``KSampler`` (``sampler="core"``) or
    ``ShardDiTKSampler`` on ``devices``; the latent saved under ``prefix``. ``decode``: core's
    ``VAEDecode`` of it too (ComfyUI loads the VAE after sampling); ``shard_loader``: ours load the
    model with ``ShardDiTLoadDiffusionModel`` on ``devices`` (core: ``UNETLoader``); ``shift``: a
    ``ModelSamplingSD3`` before the sampler, as the shipped workflows have."""
    if sampler != "core" and shard_loader:
        loader = {"class_type": "ShardDiTLoadDiffusionModel",
                  "inputs": {"unet_name": names["wan21_t2v"], "weight_dtype": "default", "devices": devices,
                             "reserve_vram_gb": 0.0, "parallel": parallel}}
    else:
        loader = {"class_type": "UNETLoader", "inputs": {"unet_name": names["wan21_t2v"], "weight_dtype": "default"}}
    g = {
        "1": loader,
        "2": {"class_type": "LoraLoaderModelOnly",
              "inputs": {"model": ["1", 0], "lora_name": names[lora_name], "strength_model": lora}},
        "3": {"class_type": "CLIPLoader", "inputs": {"clip_name": names["umt5"], "type": "wan", "device": "default"}},
        "4": {"class_type": "CLIPTextEncode", "inputs": {"text": "a red fox in the rain", "clip": ["3", 0]}},
        "5": {"class_type": "CLIPTextEncode", "inputs": {"text": "", "clip": ["3", 0]}},
        "6": {"class_type": "EmptyHunyuanLatentVideo",
              "inputs": {"width": width, "height": height, "length": length, "batch_size": 1}},
        "8": {"class_type": "SaveLatent", "inputs": {"samples": ["7", 0], "filename_prefix": prefix}},
    }
    if shift is not None:
        g["12"] = {"class_type": "ModelSamplingSD3", "inputs": {"model": ["2", 0], "shift": shift}}
    common = {"model": ["12" if shift is not None else "2", 0], "seed": seed, "steps": steps, "cfg": cfg,
              "sampler_name": "euler", "scheduler": "simple", "positive": ["4", 0], "negative": ["5", 0],
              "latent_image": ["6", 0], "denoise": 1.0}
    if sampler == "core":
        g["7"] = {"class_type": "KSampler", "inputs": common}
    else:
        g["7"] = {"class_type": "ShardDiTKSampler",
                  "inputs": {**common, "devices": devices, "parallel": parallel}}
    if decode:
        g["9"] = {"class_type": "VAELoader", "inputs": {"vae_name": names["wan21_vae"]}}
        g["10"] = {"class_type": "VAEDecode", "inputs": {"samples": ["7", 0], "vae": ["9", 0]}}
        g["11"] = {"class_type": "PreviewImage", "inputs": {"images": ["10", 0]}}
    return g


def run_latent(server, graph, timeout: float = 300.0):
    """Queue ``graph``, wait, return its saved latent (AssertionError with the log on failure)."""
    from safetensors.torch import load_file
    prompt_id = server.queue_prompt(graph)
    status = server.status(prompt_id, timeout)
    assert status["status_str"] == "success", f"{status}\n{server.log_tail()}"
    (path,) = [p for p in server.output_files(prompt_id) if str(p).endswith(".latent")]
    return load_file(str(path))["latent_tensor"]
