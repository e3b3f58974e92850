"""Headless ComfyUI as a subprocess, with this pack and the tiny models, plus a small client.

``ComfyServer(comfy_root, workdir, models_dir).start()`` runs
``main.py --cpu --listen 127.0.0.1 --port <free> --disable-auto-launch`` with

- ``--base-directory <workdir>/base``: input/output/temp/user stay in the test's tmp dir, never
  in the shared ComfyUI tree (and ``--database-url sqlite:///:memory:``, whose default is there);
- ``--use-pytorch-cross-attention --disable-api-nodes``, as the in-process ``load_comfy()``;
- ``--extra-model-paths-config <workdir>/extra_model_paths.yaml``: the tiny models'
  ``diffusion_models/ text_encoders/ vae/ loras/`` and ``custom_nodes: <workdir>/custom_nodes``
  (0.3.64 accepts any ``folder_paths`` key there, custom_nodes included), which holds
  ``sharddit`` (a symlink to this repo, as ``git clone`` into custom_nodes would) and
  ``sharddit_test_hooks`` (test-only: installs ``harness.tiny_te_hook`` and ``harness.tiny_vae_hook``).

It only ever talks to 127.0.0.1. The server log goes to ``<workdir>/comfyui.log``; errors
include its tail. ``comfy_run`` drives the same server with comfy-cli's ``comfy run --wait``.
"""
from __future__ import annotations

import atexit
import json
import os
import re
import signal
import shutil
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import requests

REPO = Path(__file__).resolve().parents[2]
HOST = "127.0.0.1"
PACK_DIR_NAME = "sharddit"
HOOKS_DIR_NAME = "sharddit_test_hooks"
MODEL_FOLDERS = ("diffusion_models", "text_encoders", "vae", "loras")

_HOOK_INIT = '''"""Test-only (ShardDiT test harness): let stock loaders read the harness's tiny text encoders and VAEs."""
import importlib.util
import sys

for _name, _path, _install in (("tiny_te_hook", {path!r}, "install_tiny_te_hook"),
                               ("tiny_vae_hook", {vae_path!r}, "install_tiny_vae_hook")):
    _spec = importlib.util.spec_from_file_location("sharddit_test_harness_" + _name, _path)
    _mod = importlib.util.module_from_spec(_spec)
    sys.modules[_spec.name] = _mod
    _spec.loader.exec_module(_mod)
    getattr(_mod, _install)()
NODE_CLASS_MAPPINGS = {{}}
'''


_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_LEVEL_PREFIX = re.compile(r"^\[(?:DEBUG|INFO|WARNING|ERROR|CRITICAL)\] ")


class ComfyServerError(RuntimeError):
    pass


def _die_with_parent() -> None:
    """In the child: get SIGTERM when the test process dies, even by SIGKILL (Linux only)."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


class ComfyServer:
    """One ComfyUI subprocess and a client for its HTTP API."""

    def __init__(self, comfy_root, workdir, models_dir, port: int | None = None,
                 python: str = sys.executable, extra_args=(), pack_dir=REPO):
        self.comfy_root = Path(comfy_root)
        self.workdir = Path(workdir)
        self.models_dir = Path(models_dir)
        self.port = port or free_port()
        self.python = python
        self.extra_args = list(extra_args)
        self.pack_dir = Path(pack_dir)
        self.log_path = self.workdir / "comfyui.log"
        self.proc: subprocess.Popen | None = None
        self.client_id = uuid.uuid4().hex

    # ------------------------------------------------------------------ lifecycle
    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.port}"

    def _prepare(self) -> Path:
        custom_nodes = self.workdir / "custom_nodes"
        custom_nodes.mkdir(parents=True, exist_ok=True)
        link = custom_nodes / PACK_DIR_NAME
        if not link.exists():
            os.symlink(self.pack_dir, link, target_is_directory=True)
        hooks = custom_nodes / HOOKS_DIR_NAME
        hooks.mkdir(exist_ok=True)
        hook = Path(__file__).with_name("tiny_te_hook.py")
        vae_hook = Path(__file__).with_name("tiny_vae_hook.py")
        (hooks / "__init__.py").write_text(_HOOK_INIT.format(path=str(hook), vae_path=str(vae_hook)))
        # --base-directory's own custom_nodes/ must exist (main.py lists it); it stays empty.
        (self.workdir / "base" / "custom_nodes").mkdir(parents=True, exist_ok=True)
        lines = ["sharddit_tests:"]
        for folder in MODEL_FOLDERS:
            lines.append(f"  {folder}: {self.models_dir / folder}")
        lines.append(f"  custom_nodes: {custom_nodes}")
        yaml_path = self.workdir / "extra_model_paths.yaml"
        yaml_path.write_text("\n".join(lines) + "\n")
        return yaml_path

    def command(self) -> list:
        yaml_path = self._prepare()
        return [self.python, str(self.comfy_root / "main.py"), "--cpu", "--listen", HOST,
                "--port", str(self.port), "--disable-auto-launch", "--use-pytorch-cross-attention",
                "--base-directory", str(self.workdir / "base"),
                "--extra-model-paths-config", str(yaml_path),
                # API (partner) nodes: not needed, many imports, and they talk to the internet.
                "--disable-api-nodes",
                # The default sqlite db lives in ComfyUI/user/ (not under --base-directory).
                "--database-url", "sqlite:///:memory:", *self.extra_args]

    def start(self, timeout: float = 180.0) -> "ComfyServer":
        cmd = self.command()
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        # One intra-op thread by default: on a few shared cores, OpenMP workers spin-waiting on
        # descheduled siblings made tiny graphs 10-40x slower. SHARDDIT_TEST_THREADS overrides.
        threads = os.environ.get("SHARDDIT_TEST_THREADS", "1")
        env.update(OMP_NUM_THREADS=threads, MKL_NUM_THREADS=threads)
        env.pop("PYTHONPATH", None)  # never let the test process' path (repo, tests/) leak in
        self._log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(cmd, cwd=self.workdir, stdout=self._log, stderr=subprocess.STDOUT,
                                     env=env, start_new_session=True, preexec_fn=_die_with_parent)
        atexit.register(self.stop)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise ComfyServerError(f"ComfyUI exited with {self.proc.returncode} during start\n{self.log_tail()}")
            try:
                if requests.get(f"{self.url}/system_stats", timeout=2).status_code == 200:
                    return self
            except requests.RequestException:
                pass
            time.sleep(0.5)
        self.stop()
        raise ComfyServerError(f"ComfyUI not ready after {timeout:.0f}s\n{self.log_tail()}")

    def stop(self, timeout: float = 15.0) -> None:
        """Terminate the server (kill after ``timeout``); idempotent."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout)
        if getattr(self, "_log", None) is not None:
            self._log.close()

    def __enter__(self):
        return self.start() if self.proc is None else self

    def __exit__(self, *exc):
        self.stop()

    # ------------------------------------------------------------------ log
    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def messages(self) -> list:
        """The log's lines as the messages that were logged: ComfyUI 0.29 prefixes warnings and errors
        with their level in colour (``\\x1b[1m\\x1b[31m[ERROR]\\x1b[0m ...``), 0.3.64 prints the
        message alone."""
        return [_LEVEL_PREFIX.sub("", _ANSI.sub("", line)) for line in self.log_text().splitlines()]

    def log_tail(self, lines: int = 60) -> str:
        tail = "\n".join(self.log_text().splitlines()[-lines:])
        return f"--- last {lines} lines of {self.log_path} ---\n{tail}"

    def import_failures(self) -> list:
        """Log lines where ComfyUI reports a custom node folder of ours failing to import."""
        # our folder as a whole path component (not e.g. a temp dir named "sharddit-ci.x/ComfyUI/...")
        ours = re.compile(r"(?:^|[\s/\\])(?:%s|%s)(?=\s|$)" % (re.escape(PACK_DIR_NAME), re.escape(HOOKS_DIR_NAME)))
        bad = []
        for line in self.log_text().splitlines():
            if ("IMPORT FAILED" in line or "Cannot import" in line or "Error while calling comfy_entrypoint" in line) \
                    and ours.search(line):
                bad.append(line.strip())
        return bad

    # ------------------------------------------------------------------ client
    def _get(self, path: str, **kw):
        r = requests.get(f"{self.url}{path}", timeout=kw.pop("timeout", 30), **kw)
        r.raise_for_status()
        return r.json()

    def _post(self, path: str, payload=None, timeout: float = 30):
        return requests.post(f"{self.url}{path}", json=payload if payload is not None else {}, timeout=timeout)

    def object_info(self, node_class: str | None = None) -> dict:
        return self._get(f"/object_info/{node_class}" if node_class else "/object_info", timeout=60)

    def queue_prompt(self, api_graph: dict) -> str:
        """POST /prompt; returns the prompt id. ComfyUI's validation errors raise with its JSON."""
        r = self._post("/prompt", {"prompt": api_graph, "client_id": self.client_id})
        if r.status_code != 200:
            raise ComfyServerError(f"POST /prompt rejected ({r.status_code}): {r.text}")
        return r.json()["prompt_id"]

    def validate(self, api_graph: dict) -> dict:
        """POST /prompt and return ComfyUI's answer without raising: ``{"status", "body"}``.

        A graph that passes is queued and runs; use for graphs that are cheap to run or
        interrupt them."""
        r = self._post("/prompt", {"prompt": api_graph, "client_id": self.client_id})
        try:
            body = r.json()
        except ValueError:
            body = r.text
        return {"status": r.status_code, "body": body}

    def history(self, prompt_id: str | None = None) -> dict:
        return self._get(f"/history/{prompt_id}" if prompt_id else "/history")

    def status(self, prompt_id: str, timeout: float = 300.0, poll: float = 0.1) -> dict:
        """Poll /history until the prompt finishes, successfully or not; returns its ``status``."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            entry = self.history(prompt_id).get(prompt_id)
            if entry and entry.get("status", {}).get("completed") is not None:
                return entry["status"]
            if self.proc is not None and self.proc.poll() is not None:
                raise ComfyServerError(f"ComfyUI died while running {prompt_id}\n{self.log_tail()}")
            time.sleep(poll)
        raise ComfyServerError(f"prompt {prompt_id} not done after {timeout:.0f}s\n{self.log_tail()}")

    def wait(self, prompt_id: str, timeout: float = 300.0, poll: float = 0.25) -> dict:
        """Poll /history until the prompt finishes; returns its history entry, raises on error."""
        status = self.status(prompt_id, timeout, poll)
        if status.get("status_str") != "success":
            msgs = [m for m in status.get("messages", []) if m[0] == "execution_error"]
            detail = json.dumps(msgs, indent=1)[:4000]
            raise ComfyServerError(f"prompt {prompt_id} failed: {detail}\n{self.log_tail()}")
        return self.history(prompt_id)[prompt_id]

    def outputs(self, prompt_id: str) -> dict:
        """``{node_id: ui_output}`` of a finished prompt (e.g. ``{"9": {"images": [...]}}``)."""
        return self.history(prompt_id)[prompt_id]["outputs"]

    def output_files(self, prompt_id: str) -> list:
        """Paths of the files a finished prompt saved (images/videos/latents under output/)."""
        files = []
        for out in self.outputs(prompt_id).values():
            for items in out.values():
                for item in items if isinstance(items, list) else []:
                    if isinstance(item, dict) and "filename" in item:
                        sub = item.get("subfolder", "")
                        base = self.workdir / "base" / (item.get("type") or "output")
                        files.append(base / sub / item["filename"])
        return files

    def run(self, api_graph: dict, timeout: float = 300.0) -> dict:
        """queue_prompt + wait; returns the outputs."""
        pid = self.queue_prompt(api_graph)
        self.wait(pid, timeout)
        return self.outputs(pid)

    def free(self, unload_models: bool = True, free_memory: bool = True) -> None:
        """POST /free and make sure it has taken effect before the next prompt runs.

        ComfyUI's prompt worker reads the /free flags only after it returns from waiting on its
        queue, that is after the *next* prompt (or a gc timeout, up to 10 s later). Without a
        barrier the unload lands after the caller's first prompt, at random: queue one tiny prompt
        of core nodes, so the flags are applied before anything the caller queues next."""
        self._post("/free", {"unload_models": unload_models, "free_memory": free_memory}).raise_for_status()
        barrier = {"1": {"class_type": "EmptyLatentImage", "inputs": {"width": 16, "height": 16, "batch_size": 1}},
                   "2": {"class_type": "SaveLatent",
                         "inputs": {"samples": ["1", 0], "filename_prefix": f"free_barrier/{uuid.uuid4().hex}"}}}
        self.run(barrier)

    def interrupt(self) -> None:
        self._post("/interrupt").raise_for_status()

    def clear_queue(self) -> None:
        self._post("/queue", {"clear": True}).raise_for_status()


def comfy_cli() -> str:
    """Path of comfy-cli's ``comfy`` next to this Python, else on PATH."""
    here = Path(sys.executable).with_name("comfy")
    found = str(here) if here.exists() else shutil.which("comfy")
    if not found:
        raise ComfyServerError("comfy-cli not installed: pip install comfy-cli (tests/requirements.txt)")
    return found


def comfy_run(api_json_path, server: ComfyServer, timeout: int = 300, extra_args=()) -> subprocess.CompletedProcess:
    """``comfy run --workflow F --wait`` against ``server`` (127.0.0.1:port), non-interactive.

    comfy-cli gets a private HOME/config dir under the server's workdir (no prompts, no
    tracking, nothing written to the user's config). ``--json`` makes it print NDJSON events;
    the last line is an ``envelope`` with ``ok``. Returns the CompletedProcess (not checked).
    """
    home = server.workdir / "comfy_cli_home"
    home.mkdir(exist_ok=True)
    env = {**os.environ, "HOME": str(home), "XDG_CONFIG_HOME": str(home / ".config"),
           "COMFY_NO_WATCH": "1", "NO_COLOR": "1", "DO_NOT_TRACK": "1", "COMFY_NO_TELEMETRY": "1",
           "COMFY_CLI_NO_REMOTE_REFRESH": "1"}
    cmd = [comfy_cli(), "--skip-prompt", "run", "--workflow", str(api_json_path),
           "--wait", "--where", "local", "--host", HOST, "--port", str(server.port),
           "--timeout", str(timeout), "--json", "--no-notify", *extra_args]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout + 30)


def parse_comfy_run_events(stdout: str) -> list:
    """The NDJSON events ``comfy run --json`` printed (non-JSON lines skipped)."""
    events = []
    for line in stdout.splitlines():
        line = line.strip()
        if line.startswith("{"):
            try:
                events.append(json.loads(line))
            except ValueError:
                pass
    return events
