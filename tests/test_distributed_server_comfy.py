"""Distributed `sequence` mode through ComfyUI's real server: the server is rank 0 and one
``python <pack-dir> worker`` process on 127.0.0.1 joins it over gloo (issue 14).

- ``devices=cpu,w1/cpu``, ``parallel=sequence``, Wan 2.1 tiny with a LoRA: latents bit-identical
  to the local ``cpu,cpu`` run (the same split, the same GEMM shapes) and equal to core's KSampler
  or within the split bound of tests/harness/numerics.py (a split gives GEMMs fewer rows), at cfg > 1 (batch split: the worker runs
  the uncond half) and cfg = 1 (token split: Ulysses exchanges cross the processes).
- ``devices=auto`` with w1 joined resolves to ``cpu,w1/cpu`` (bit-identical latents, logged).
- Killing the worker mid-sampling fails the prompt within the timeout with the worker named; the
  next local prompt succeeds; the worker re-joins (same name) and a distributed prompt succeeds.

Latent 80x80, 5 frames -> 2x10x10 -> 50 tokens: 25 rows per rank (> 10, see test_sequence_comfy).
"""
import os
import re
import signal
import subprocess
import sys
import time

import pytest
import torch
from harness.numerics import COMFY_SPLIT_BOUND, assert_split_close
from harness.server import REPO, ComfyServer, free_port

pytestmark = pytest.mark.comfy
TIMEOUT_S = 10


def _graph(names, sampler: str, devices: str, cfg: float, steps: int, prefix: str, lora: float = 1.0,
           lora_name: str = "wan21_lora_all", parallel: str = "sequence") -> dict:
    g = {
        "1": {"class_type": "UNETLoader", "inputs": {"unet_name": names["wan21_t2v"], "weight_dtype": "default"}},
        "2": {"class_type": "LoraLoaderModelOnly",
              "inputs": {"model": ["1", 0], "lora_name": names[lora_name], "strength_model": lora}},
        "3": {"class_type": "CLIPLoader", "inputs": {"clip_name": names["umt5"], "type": "wan", "device": "default"}},
        "4": {"class_type": "CLIPTextEncode", "inputs": {"text": "a red fox in the rain", "clip": ["3", 0]}},
        "5": {"class_type": "CLIPTextEncode", "inputs": {"text": "", "clip": ["3", 0]}},
        "6": {"class_type": "EmptyHunyuanLatentVideo", "inputs": {"width": 80, "height": 80, "length": 5, "batch_size": 1}},
        "8": {"class_type": "SaveLatent", "inputs": {"samples": ["7", 0], "filename_prefix": prefix}},
    }
    common = {"model": ["2", 0], "seed": 5, "steps": steps, "cfg": cfg, "sampler_name": "euler",
              "scheduler": "simple", "positive": ["4", 0], "negative": ["5", 0], "latent_image": ["6", 0],
              "denoise": 1.0}
    if sampler == "core":
        g["7"] = {"class_type": "KSampler", "inputs": common}
    else:
        g["7"] = {"class_type": "ShardDiTKSampler", "inputs": {**common, "devices": devices, "parallel": parallel}}
    return g


def _latent(server, prompt_id):
    from safetensors.torch import load_file
    (path,) = [p for p in server.output_files(prompt_id) if str(p).endswith(".latent")]
    return load_file(str(path))["latent_tensor"]


class _Worker:
    def __init__(self, workdir, port, name="w1"):
        from harness.comfy_env import comfy_path
        self.log = workdir / f"worker_{name}_{time.monotonic_ns()}.log"
        env = {**os.environ, "COMFYUI_PATH": str(comfy_path()), "SHARDDIT_DIST_TIMEOUT": str(TIMEOUT_S),
               "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
        env.pop("PYTHONPATH", None)
        with open(self.log, "wb") as out:
            self.proc = subprocess.Popen([sys.executable, str(REPO), "worker", "--join", f"127.0.0.1:{port}",
                                          "--name", name, "--devices", "cpu"], stdout=out, stderr=subprocess.STDOUT,
                                         env=env, start_new_session=True)

    def text(self):
        return self.log.read_text(errors="replace")

    def wait_joined(self, timeout=120):
        deadline = time.monotonic() + timeout
        while "joined" not in self.text():
            assert self.proc.poll() is None, self.text()
            assert time.monotonic() < deadline, self.text()
            time.sleep(0.2)

    def kill(self):
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(15)


@pytest.fixture(scope="module")
def dist_server(tiny_models, tmp_path_factory):
    from harness.comfy_env import comfy_path
    port = free_port()
    workdir = tmp_path_factory.mktemp("dist_server")
    old = {k: os.environ.get(k) for k in ("SHARDDIT_DIST_ADDR", "SHARDDIT_DIST_TIMEOUT", "SHARDDIT_DIST_WEIGHTS")}
    # share: the worker (a CPU with room for every block) keeps only its share, as a GPU that could not
    # hold them all would (auto and all are covered in test_dist_sequence / test_dist_blocks)
    os.environ.update(SHARDDIT_DIST_ADDR=f"127.0.0.1:{port}", SHARDDIT_DIST_TIMEOUT=str(TIMEOUT_S),
                      SHARDDIT_DIST_WEIGHTS="share")
    server = ComfyServer(comfy_path(), workdir, tiny_models.root)
    workers = []
    try:
        server.start()
    finally:
        for k, v in old.items():
            os.environ.pop(k, None) if v is None else os.environ.__setitem__(k, v)
    server.dist_port, server.workers = port, workers
    try:
        yield server
    finally:
        for w in workers:
            w.kill()
        server.stop()


def _worker(server):
    w = _Worker(server.workdir, server.dist_port)
    server.workers.append(w)
    w.wait_joined()
    return w


def _status(server, prompt_id, timeout=300.0):
    return server.status(prompt_id, timeout)


def _wait_steps(server, timeout=120.0):
    """Until the sampler has finished a step (the bar shows 0/N before the first forward, while
    the session may still be opening)."""
    deadline = time.monotonic() + timeout
    while not re.search(r"\b[1-9]\d*/10000\b", server.log_tail(5)):
        assert time.monotonic() < deadline, server.log_tail()
        time.sleep(0.2)


def _run(server, graph):
    pid = server.queue_prompt(graph)
    status = _status(server, pid)
    assert status["status_str"] == "success", f"{status}\n{server.log_tail()}"
    return _latent(server, pid)


@pytest.fixture(scope="module")
def core_latents(dist_server, tiny_models):
    """Core's KSampler first, before any ShardDiT prompt on this server (the shards then start from
    a fresh MODEL); ``test_core_after_sharddit_matches_core_before`` runs the other order."""
    return {cfg: _run(dist_server, _graph(tiny_models.names, "core", "", cfg, 2, f"dist/core_{cfg}"))
            for cfg in (3.0, 1.0)}


@pytest.mark.parametrize("cfg", [3.0, 1.0])
def test_worker_rank_matches_core_and_local(dist_server, tiny_models, core_latents, cfg):
    server, names = dist_server, tiny_models.names
    if not any(w.proc.poll() is None for w in server.workers):
        _worker(server)
    core = core_latents[cfg]
    local = _run(server, _graph(names, "ours", "cpu,cpu", cfg, 2, f"dist/local_{cfg}"))
    worker = next(w for w in server.workers if w.proc.poll() is None)
    before = len(worker.text())
    dist = _run(server, _graph(names, "ours", "cpu,w1/cpu", cfg, 2, f"dist/dist_{cfg}"))
    assert torch.equal(dist, local), f"max diff {(dist - local).abs().max()}"  # same split, same shapes
    assert_split_close(dist, core, COMFY_SPLIT_BOUND, f"cpu,w1/cpu vs core, cfg {cfg}")
    # the worker owns the second half of the blocks and keeps only those; sent once for two steps
    first, last = map(int, re.findall(r"w1/cpu owns blocks (\d+)-(\d+)", server.log_text())[-1])
    n_blocks = int(re.findall(r"(\d+) blocks sharded over 'cpu'", server.log_text())[-1])
    assert (first, last) == (n_blocks // 2, n_blocks - 1), (first, last, n_blocks)
    got = [int(i) for b in re.findall(r"received blocks \[([\d, ]+)\]", worker.text()[before:]) for i in b.split(",")]
    assert sorted(got) == list(range(first, last + 1)), worker.text()  # each once, in two steps
    held = re.findall(r"holds blocks \[([\d, ]+)\]", worker.text())[-1]
    assert [int(i) for i in held.split(",")] == list(range(first, last + 1)), held


def test_two_host_ranks_and_a_worker_in_one_group(dist_server, tiny_models, core_latents):
    """cpu,cpu,w1/cpu at cfg 1: one batch group, two positions in the server's process (threads
    sharing one exchange) and one in the worker; equal to core's KSampler or within the split bound."""
    server, names = dist_server, tiny_models.names
    if not any(w.proc.poll() is None for w in server.workers):
        _worker(server)
    dist = _run(server, _graph(names, "ours", "cpu,cpu,w1/cpu", 1.0, 2, "dist/three"))
    assert_split_close(dist, core_latents[1.0], COMFY_SPLIT_BOUND, "cpu,cpu,w1/cpu vs core, cfg 1")


@pytest.mark.parametrize("cfg", [3.0, 1.0])
def test_core_after_sharddit_matches_core_before(dist_server, tiny_models, core_latents, cfg):
    """The other order: a ShardDiT `sequence` prompt on the server's cached LoRA'd MODEL, then core's
    KSampler again: bit-identical to core's run before any ShardDiT prompt (same path, same shapes),
    so the shards gave the MODEL back as they found it. (Local ranks only: on this branch a further
    distributed prompt here makes the next test's distributed prompt fail, issue 19's "every
    second prompt" fault, which is fixed and tested apart.)"""
    server, names = dist_server, tiny_models.names
    _run(server, _graph(names, "ours", "cpu,cpu", cfg, 2, f"dist/before_core_local_{cfg}"))
    pid = server.queue_prompt(_graph(names, "core", "", cfg, 2, f"dist/core_again_{cfg}"))
    status = _status(server, pid)
    assert status["status_str"] == "success", f"{status}\n{server.log_tail()}"
    cached = [n for m in status["messages"] if m[0] == "execution_cached" for n in m[1]["nodes"]]
    assert "7" not in cached and "2" in cached, cached  # KSampler ran again, on the LoRA'd MODEL ShardDiT used
    again = _latent(server, pid)
    assert torch.equal(again, core_latents[cfg]), f"max diff {(again - core_latents[cfg]).abs().max()}"


def test_lora_change_resends_only_the_changed_blocks(dist_server, tiny_models):
    """Weights follow ComfyUI's patch state: a new strength of a LoRA on every block sends the
    worker its blocks (2-3) again, once; the same strength again sends nothing; a LoRA on the
    host's blocks only (0-1) sends 2-3 once (back to unpatched), then a new strength of it sends
    nothing; results equal the local run. The blocks of a released model leave the worker."""
    server, names = dist_server, tiny_models.names
    live = [w for w in server.workers if w.proc.poll() is None]
    worker = live[0] if live else _worker(server)

    def received(since):
        return [int(i) for b in re.findall(r"received blocks \[([\d, ]+)\]", worker.text()[since:]) for i in b.split(",")]

    _run(server, _graph(names, "ours", "cpu,w1/cpu", 1.0, 1, "dist/lora_a", lora=1.0))
    dists = {}
    for strength, lora_name, resent in ((0.5, "wan21_lora_all", [2, 3]), (0.5, "wan21_lora_all", []),
                                        (0.7, "wan21_lora", [2, 3]), (0.9, "wan21_lora", [])):  # 2-3 unpatched, then kept
        before = len(worker.text())
        dists[strength, lora_name] = _run(server, _graph(names, "ours", "cpu,w1/cpu", 1.0, 1, "dist/lora_b", strength,
                                                         lora_name))
        assert sorted(received(before)) == resent, (strength, lora_name, worker.text()[before:])
    held = re.findall(r"\(([\d.]+) MiB owned in all\)", worker.text())
    assert max(map(float, held)) == float(held[1]), held  # one share (blocks 2-3), not one per shard state made
    for (strength, lora_name), dist in dists.items():  # local runs last: a new device list regroups the blocks
        local = _run(server, _graph(names, "ours", "cpu,cpu", 1.0, 1, "dist/lora_local", strength, lora_name))
        assert torch.equal(dist, local), f"{lora_name} {strength}: max diff {(dist - local).abs().max()}"


def test_auto_devices_include_the_joined_worker(dist_server, tiny_models):
    """``devices=auto`` on a GPU-less host with w1 joined resolves to ``cpu,w1/cpu`` (logged with the
    workers it took) and samples bit-identically to that explicit string; with parallel=blocks the
    worker is left out (logged) and the result is the local ``cpu`` one."""
    server, names = dist_server, tiny_models.names
    if not any(w.proc.poll() is None and w.log.name.startswith("worker_w1") for w in server.workers):
        _worker(server)
    explicit = _run(server, _graph(names, "ours", "cpu,w1/cpu", 1.0, 2, "dist/explicit_members"))
    auto = _run(server, _graph(names, "ours", "auto", 1.0, 2, "dist/auto_members"))
    assert torch.equal(auto, explicit), f"max diff {(auto - explicit).abs().max()}"
    assert "devices=auto with joined workers -> 'cpu,w1/cpu' (this machine: cpu; workers: w1/cpu)" in \
        server.log_text(), server.log_tail()
    blocks = _run(server, _graph(names, "ours", "auto", 1.0, 2, "dist/auto_blocks", parallel="blocks"))
    local = _run(server, _graph(names, "ours", "cpu", 1.0, 2, "dist/auto_blocks_local", parallel="blocks"))
    assert torch.equal(blocks, local)
    assert "devices=auto with parallel=blocks: joined worker(s) w1/cpu left out (worker devices run " \
        "parallel=sequence only" in server.log_text(), server.log_tail()


def test_worker_killed_mid_sampling_then_local_then_rejoin(dist_server, tiny_models):
    server, names = dist_server, tiny_models.names
    live = [w for w in server.workers if w.proc.poll() is None]
    worker = live[0] if live else _worker(server)
    long_id = server.queue_prompt(_graph(names, "ours", "cpu,w1/cpu", 1.0, 10000, "dist/long"))
    _wait_steps(server)
    killed = time.monotonic()
    os.kill(worker.proc.pid, signal.SIGKILL)
    status = _status(server, long_id)
    took = time.monotonic() - killed
    assert status["status_str"] == "error"
    errors = [m[1] for m in status["messages"] if m[0] == "execution_error"]
    assert errors and "'w1'" in errors[0]["exception_message"], status
    assert took < TIMEOUT_S * 2 + 10, f"the failure took {took:.1f} s"
    worker.kill()

    local = _run(server, _graph(names, "ours", "cpu,cpu", 1.0, 2, "dist/after_kill_local"))
    _worker(server)  # the same name joins again; ComfyUI was not restarted
    again = _run(server, _graph(names, "ours", "cpu,w1/cpu", 1.0, 2, "dist/after_rejoin"))
    assert torch.equal(again, local)


def test_worker_devices_without_dist_addr_are_refused_with_the_fix(comfy_env, monkeypatch):
    """In-process ComfyUI: no SHARDDIT_DIST_ADDR, so nothing listens and a worker device is a
    validation error that says what to set (before anything loads)."""
    from harness.comfy_env import pack_module

    monkeypatch.delenv("SHARDDIT_DIST_ADDR", raising=False)
    dist = pack_module(comfy_env, "loaders.comfy.distributed")
    monkeypatch.setattr(dist, "_LOBBY", [])
    check_devices = pack_module(comfy_env, "loaders.comfy.model_loading").check_devices  # the nodes' validate_inputs
    with pytest.raises(ValueError) as err:
        check_devices("cpu,w1/cpu")
    assert "SHARDDIT_DIST_ADDR" in str(err.value) and "--join" in str(err.value), err.value
    with pytest.raises(ValueError, match="'gpu' is not a device"):
        check_devices("cpu,w1/gpu")


def _exit_code(proc, timeout_s: float, log) -> int:
    """The process's exit code; a failure that shows its log when it has not exited in ``timeout_s``
    (a worker that does not stop on Ctrl+C: once seen in a CI run, not reproduced here)."""
    try:
        return proc.wait(timeout_s)
    except subprocess.TimeoutExpired:
        pytest.fail(f"no exit {timeout_s} s after Ctrl+C; its log:\n{log.read_text(errors='replace')[-4000:]}")


def test_unknown_worker_is_refused_and_ctrl_c_stops_a_worker(dist_server, tiny_models):
    server, names = dist_server, tiny_models.names
    w2 = _Worker(server.workdir, server.dist_port, name="w2")
    server.workers.append(w2)
    w2.wait_joined()
    # refused when the prompt runs, before anything loads: validation (on ComfyUI's web-server
    # thread) asks no lobby, which a stranger holding its port could stall
    status = _status(server, server.queue_prompt(_graph(names, "ours", "cpu,w9/cpu", 1.0, 2, "dist/unknown")))
    said = str(status["messages"])
    assert status["status_str"] == "error" and "no worker named 'w9'" in said and "w2" in said, said
    w2.proc.send_signal(signal.SIGINT)  # Ctrl+C
    assert _exit_code(w2.proc, 30, w2.log) == 0, w2.text()
    assert "stopped" in w2.text()


def test_interrupt_a_distributed_prompt_then_it_runs_again(dist_server, tiny_models):
    server, names = dist_server, tiny_models.names
    if not any(w.proc.poll() is None and w.log.name.startswith("worker_w1") for w in server.workers):
        _worker(server)
    long_id = server.queue_prompt(_graph(names, "ours", "cpu,w1/cpu", 1.0, 10000, "dist/long_interrupt"))
    _wait_steps(server)
    started = time.monotonic()
    server.interrupt()
    status = _status(server, long_id)
    stopped_after = time.monotonic() - started
    assert any(m[0] == "execution_interrupted" for m in status["messages"]), status
    assert stopped_after < TIMEOUT_S + 15, f"interrupt took {stopped_after:.1f}s"
    local = _run(server, _graph(names, "ours", "cpu,cpu", 1.0, 2, "dist/after_interrupt_local"))
    again = _run(server, _graph(names, "ours", "cpu,w1/cpu", 1.0, 2, "dist/after_interrupt_dist"))
    assert torch.equal(again, local)


def _launcher(server, name, devices):
    """``worker_command``'s several-device launcher for ``devices`` (``python <pack-dir> worker
    --devices A,B`` calls it after checking the devices exist; on a GPU-less machine only this way
    can it start more than one child)."""
    from harness.comfy_env import comfy_path
    code = ("import argparse, sys; sys.path.insert(0, sys.argv[1]); from harness.pack import import_pack; "
            "import_pack(); from sharddit.loaders.cli import worker_command as w; "
            "sys.exit(w._run_members(argparse.Namespace(join=sys.argv[2], name=sys.argv[3]), sys.argv[4:]))")
    log = server.workdir / f"launcher_{name}_{time.monotonic_ns()}.log"
    env = {**os.environ, "COMFYUI_PATH": str(comfy_path()), "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    env.pop("PYTHONPATH", None)
    with open(log, "wb") as out:
        proc = subprocess.Popen([sys.executable, "-c", code, str(REPO / "tests"), f"127.0.0.1:{server.dist_port}",
                                 name, *devices], stdout=out, stderr=subprocess.STDOUT, env=env,
                                start_new_session=True)
    return proc, log


def test_several_device_launcher_ctrl_c_and_a_failed_member(dist_server):
    """Ctrl+C stops every member cleanly (exit 0, each child stopped, no traceback); a member that
    fails (cuda:0 on a GPU-less machine) stops the others and the worker exits 1 naming it."""
    server = dist_server
    proc, log = _launcher(server, "w5", ["cpu"])
    try:
        deadline = time.monotonic() + 120
        while "'w5/cpu' (pid" not in log.read_text(errors="replace"):
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text(errors="replace")
            time.sleep(0.2)
        proc.send_signal(signal.SIGINT)  # Ctrl+C
        assert _exit_code(proc, 60, log) == 0, log.read_text(errors="replace")
    finally:
        proc.kill()
    text = log.read_text(errors="replace")
    assert "worker 'w5/cpu': stopped" in text and "worker 'w5': stopped (cpu)" in text, text
    assert "Traceback" not in text, text

    proc, log = _launcher(server, "w6", ["cpu", "cuda:0"])
    try:
        assert proc.wait(180) == 1, log.read_text(errors="replace")
    finally:
        proc.kill()
    text = log.read_text(errors="replace")
    assert "'cuda:0' does not exist" in text, text
    assert "the process serving cuda:0 exited with 2; stopping the others (cpu)" in text, text
    assert "worker 'w6/cpu': stopped" in text or "worker 'w6': stopped" in text, text
