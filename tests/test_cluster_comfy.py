"""Several machines on Ray through ComfyUI's real server (issue 32): a local Ray cluster with
token auth on (a head, and a second node started by the real ``python <pack-dir> worker --join
... --name box2 --devices cpu``; ``harness.dist_server``); the server joins it as a Ray driver
(``SHARDDIT_RAY_ADDRESS``) and samples with ``devices=cpu,box2/cpu``, ``parallel=sequence``.

- six prompts in a row, changing the seed, the shape, cfg and the LoRA strength and back, each
  equal to core's KSampler within the split bound (tests/harness/numerics.py: a split gives GEMMs
  fewer rows); the last repeats the first and is bit-identical to it; ComfyUI's ``/system_stats``
  answers within 1 s all along (nothing of the cluster runs on its web-server thread);
- ``devices=auto`` takes the member (``cpu,box2/cpu``, logged) and gives the same latent;
- ``plan --workers ray:HOST:PORT`` reads the member's free memory from the cluster;
- the worker node killed: the next prompt fails within the timeout naming the member, and the
  prompt after it runs on this machine's devices.
"""
import os
import re
import sys
import threading
import time

import pytest
import requests
import torch
from harness.dist_server import Worker, dist_server_scope
from harness.numerics import COMFY_SPLIT_BOUND, assert_split_close
from harness.server import REPO
from test_distributed_server_comfy import _graph, _run

pytestmark = [pytest.mark.comfy, pytest.mark.cluster]
TIMEOUT_S = 20


@pytest.fixture(scope="module")
def ray_server(tiny_models, tmp_path_factory):
    with dist_server_scope(tiny_models, tmp_path_factory.mktemp("rc"), TIMEOUT_S, weights="share") as server:
        server.worker = Worker(server, "box2").wait_joined()
        server.workers.append(server.worker)
        yield server


def _graph_for(names, sampler, devices, seed, size, cfg, lora, prefix):
    g = _graph(names, sampler, devices, cfg, 2, prefix, lora=lora)
    g["7"]["inputs"]["seed"] = seed
    g["6"]["inputs"].update(width=size[0], height=size[1])
    return g


PROMPTS = [  # (seed, (width, height), cfg, LoRA strength): each setting changed, then back
    (5, (80, 80), 1.0, 1.0), (6, (80, 80), 1.0, 1.0), (6, (96, 80), 1.0, 1.0), (6, (96, 80), 3.0, 1.0),
    (6, (96, 80), 3.0, 0.5), (5, (80, 80), 1.0, 1.0)]


class _StatsWatch(threading.Thread):
    """Asks ``/system_stats`` every 0.25 s; ``slowest`` is the longest answer (a timeout counts as 5 s)."""

    def __init__(self, url):
        super().__init__(daemon=True)
        self.url, self.slowest, self.asked, self.done = url, 0.0, 0, threading.Event()

    def run(self):
        while not self.done.wait(0.25):
            t0 = time.monotonic()
            try:
                ok = requests.get(f"{self.url}/system_stats", timeout=5).status_code == 200
            except requests.RequestException:
                ok = False
            self.slowest = max(self.slowest, time.monotonic() - t0 if ok else 5.0)
            self.asked += 1


def test_six_prompts_on_a_ray_member_equal_core(ray_server, tiny_models):
    server, names = ray_server, tiny_models.names
    watch = _StatsWatch(server.url)
    watch.start()
    try:
        _six_prompts(server, names)
    finally:
        watch.done.set()
        watch.join()
    assert watch.asked > 10 and watch.slowest < 1.0, (watch.asked, watch.slowest)


def _six_prompts(server, names):
    first = None
    for i, (seed, size, cfg, lora) in enumerate(PROMPTS):
        core = _run(server, _graph_for(names, "core", "", seed, size, cfg, lora, f"ray/core_{i}"))
        ours = _run(server, _graph_for(names, "ours", "cpu,box2/cpu", seed, size, cfg, lora, f"ray/ours_{i}"))
        assert_split_close(ours, core, COMFY_SPLIT_BOUND, f"prompt {i}: cpu,box2/cpu vs core "
                                                         f"(seed {seed}, {size}, cfg {cfg}, LoRA {lora})")
        first = ours if first is None else first
    assert torch.equal(ours, first), "the last prompt repeats the first"
    log = server.log_text()
    assert "on Ray with box2/cpu" in log, server.log_tail()  # the session ran on the Ray member
    assert len(re.findall(r"session \d+ open on Ray", log)) == 1, "one session for all six prompts"


def test_devices_auto_takes_the_ray_member(ray_server, tiny_models):
    server, names = ray_server, tiny_models.names
    explicit = _run(server, _graph_for(names, "ours", "cpu,box2/cpu", 8, (80, 80), 1.0, 1.0, "ray/explicit"))
    auto = _run(server, _graph_for(names, "ours", "auto", 8, (80, 80), 1.0, 1.0, "ray/auto"))
    assert "devices=auto with joined workers -> 'cpu,box2/cpu'" in server.log_text(), server.log_tail()
    assert torch.equal(auto, explicit)


def test_plan_reads_the_members_free_memory_from_the_cluster(ray_server):
    import json
    import subprocess

    cluster = ray_server.cluster
    out = subprocess.run([sys.executable, str(REPO), "plan", "--model", "wan2.1-t2v-1.3b", "--devices",
                          "cpu=64GiB,box2/cpu", "--size", "480x320", "--frames", "17", "--parallel", "sequence",
                          "--workers", f"ray:{cluster.address}", "--json"], capture_output=True, text=True,
                         timeout=300, env={**cluster.node_env, "COMFYUI_PATH": os.environ["COMFYUI_PATH"]},
                         cwd=str(REPO))
    assert out.returncode in (0, 3), out.stdout + out.stderr
    row = json.loads(out.stdout)["workers"]["devices"]["box2/cpu"]
    assert row["free_bytes"] > 0, row  # the member's own offer, read over Ray
    assert "Ray members at" in out.stderr and re.search(r"box2/cpu: [\d.]+ GiB free", out.stderr), out.stderr


def test_a_killed_worker_node_is_named_and_the_next_prompt_runs_here(ray_server, tiny_models):
    server, names = ray_server, tiny_models.names
    server.worker.kill()  # the worker command, its raylet and its rank actor
    t0 = time.monotonic()
    pid = server.queue_prompt(_graph_for(names, "ours", "cpu,box2/cpu", 7, (80, 80), 1.0, 1.0, "ray/after_kill"))
    status = server.status(pid, 300)
    took = time.monotonic() - t0
    text = str(status["messages"])
    assert status["status_str"] == "error" and "box2/cpu" in text, f"{status}\n{server.log_tail()}"
    assert took < 3 * TIMEOUT_S + 30, took
    local = _run(server, _graph_for(names, "ours", "cpu,cpu", 7, (80, 80), 1.0, 1.0, "ray/local_after_kill"))
    core = _run(server, _graph_for(names, "core", "", 7, (80, 80), 1.0, 1.0, "ray/core_after_kill"))
    assert_split_close(local, core, COMFY_SPLIT_BOUND, "cpu,cpu after the member was lost")
