"""A ComfyUI server on a local Ray cluster, and worker machines joining it (127.0.0.1).

``dist_server_scope(tiny_models, workdir, timeout_s, weights)``: a Ray head (token auth on) and a
ComfyUI server started with ``SHARDDIT_RAY_ADDRESS`` pointing at it; ``Worker(server, name)``: a Ray
node started by the real ``python <pack-dir> worker --join ... --name NAME --devices cpu``, its rank
actors building ComfyUI's blocks (``COMFYUI_PATH``); ``wan_graph(...)``: a tiny Wan 2.1
text-to-video graph with a LoRA, sampled by core's KSampler or ShardDiT's.
"""
from __future__ import annotations

import contextlib
import os
import time

from harness.ray_cluster import LocalRayCluster
from harness.server import REPO, ComfyServer


class Worker:
    """A worker machine: a Ray node serving ``NAME/cpu`` (its ``worker`` command's output in ``log``)."""

    def __init__(self, server, name: str = "w1"):
        from harness.comfy_env import comfy_path

        self.server, self.name, self.member = server, name, f"{name}/cpu"
        server.cluster.add_node(name, wait=False, env={"COMFYUI_PATH": str(comfy_path())})
        self.proc = server.cluster.procs[name]
        self.log = server.cluster.tmp / f"{name}.log"

    def wait_joined(self, timeout: float = 180.0) -> "Worker":
        """Until the cluster lists the member (``ray status`` shows its resource)."""
        self.server.cluster.wait_node(self.name, timeout)
        deadline = time.monotonic() + 60
        while f"sharddit/{self.member}" not in self.server.cluster.status():
            assert self.proc.poll() is None, self.log.read_text(errors="replace")
            assert time.monotonic() < deadline, self.server.cluster.status()
            time.sleep(1)
        return self

    def kill(self) -> None:
        """The node, its raylet and its rank actors, at once (a machine that went away)."""
        self.server.cluster.kill_node(self.name)


@contextlib.contextmanager
def dist_server_scope(tiny_models, workdir, timeout_s: float = 10.0, weights: str | None = None):
    """A started ComfyUI server joined to a fresh local Ray cluster (``server.cluster``);
    ``server.workers``: the ``Worker``s a test started, stopped at the end with the server."""
    from harness.comfy_env import comfy_path

    cluster = LocalRayCluster(workdir / "r", REPO, timeout_s, driver=False)
    keys = ("SHARDDIT_RAY_ADDRESS", "SHARDDIT_DIST_TIMEOUT", "SHARDDIT_DIST_WEIGHTS", "RAY_AUTH_MODE",
            "RAY_AUTH_TOKEN")
    old = {k: os.environ.get(k) for k in keys}
    server = None
    try:
        cluster.start()
        os.environ.update(SHARDDIT_RAY_ADDRESS=cluster.address, SHARDDIT_DIST_TIMEOUT=str(timeout_s),
                          RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=cluster.token)
        os.environ.pop("SHARDDIT_DIST_WEIGHTS", None)
        if weights:
            os.environ["SHARDDIT_DIST_WEIGHTS"] = weights
        server = ComfyServer(comfy_path(), workdir / "c", tiny_models.root)
        try:
            server.start()
        finally:
            for k, v in old.items():
                os.environ.pop(k, None) if v is None else os.environ.__setitem__(k, v)
        server.cluster, server.workers = cluster, []
        yield server
    finally:
        if server is not None:
            server.stop()
        cluster.stop()


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
