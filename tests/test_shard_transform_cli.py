"""``python <pack-dir> shard-workflow`` (loaders/cli/shard_workflow_command.py) as a subprocess
of the pure environment: file to file, standard output, ``--unshard``, an already sharded file,
``--template`` and ``--list-templates`` without the templates package, and the bad inputs (exit 2
with a message naming the file, never a traceback)."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from harness.shard_workflows import api_workflow, node, ui_workflow
from sharddit.loaders.workflow.shard_transform import shard_workflow

pytestmark = pytest.mark.no_blas

REPO = Path(__file__).resolve().parents[1]

# ----------------------------------------------------------------------------- command line
# Every invocation is its own ``python <pack-dir> shard-workflow`` process; they start together
# (the command imports the whole CLI, torch included: ~2 s of CPU each).
BAD = {"missing.json": "cannot read", "bad.json": "is not JSON", "latin1.json": "cannot read",
       "list.json": "not a ComfyUI workflow: found a JSON list", "note.json": "nothing to shard: no diffusion-model loader"}


@pytest.fixture(scope="module")
def cli(tmp_path_factory):
    """``(folder, {case: CompletedProcess-like})`` of every command-line case."""
    d = tmp_path_factory.mktemp("cli")
    sharded = shard_workflow(ui_workflow()).workflow
    (d / "in.json").write_text(json.dumps(ui_workflow()))
    (d / "sharded.json").write_text(json.dumps(sharded))
    (d / "api.json").write_text(json.dumps(api_workflow()))
    (d / "api_sharded.json").write_text(json.dumps(shard_workflow(api_workflow()).workflow))
    (d / "bad.json").write_text("{not json")
    (d / "list.json").write_text("[1, 2]")
    (d / "note.json").write_text(json.dumps({"nodes": [node(1, "Note", (0, 0))], "links": []}))
    (d / "latin1.json").write_bytes(b"\xff\xfe\x00bad")
    cases = {"file": [d / "in.json", "-o", d / "out.json"], "unshard": [d / "sharded.json", "--unshard", "-o", d / "back.json"],
             "stdout": [d / "api.json"], "already": [d / "api_sharded.json"],
             "template": ["--template", "video_no_such_template"], "list": ["--list-templates"],
             **{name: [d / name] for name in BAD}}
    procs = {k: subprocess.Popen([sys.executable, str(REPO), "shard-workflow", *map(str, a)], stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True) for k, a in cases.items()}
    done = {}
    for k, p in procs.items():
        out, err = p.communicate(timeout=180)
        done[k] = subprocess.CompletedProcess(p.args, p.returncode, out, err)
    return d, done


def test_cli_file_to_file_then_unshard(cli):
    d, runs = cli
    done = runs["file"]
    assert done.returncode == 0, done.stderr
    assert done.stdout == "" and "[ShardDiT] 3 Shard nodes added: Wan high noise, wan_low, ltx" in done.stderr
    assert json.loads((d / "out.json").read_text()) == shard_workflow(ui_workflow()).workflow
    back = runs["unshard"]
    assert back.returncode == 0 and "[ShardDiT] 3 Shard nodes removed" in back.stderr, back.stderr
    assert json.loads((d / "back.json").read_text()) == ui_workflow()


def test_cli_api_to_stdout_and_already_sharded(cli):
    _, runs = cli
    done = runs["stdout"]
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == shard_workflow(api_workflow()).workflow
    again = runs["already"]
    assert again.returncode == 0 and json.loads(again.stdout) == json.loads(done.stdout), again.stderr
    assert "already sharded" in again.stderr


@pytest.mark.parametrize("name", list(BAD))
def test_cli_bad_input_exits_2_with_a_message(cli, name):
    done = cli[1][name]
    assert done.returncode == 2 and done.stdout == "", (done.returncode, done.stdout[:200])
    assert BAD[name] in done.stderr and name in done.stderr and "Traceback" not in done.stderr, done.stderr


def test_cli_unknown_or_absent_template_exits_2(cli):
    from sharddit.loaders.workflow.templates import video_templates

    done = cli[1]["template"]
    assert done.returncode == 2 and done.stdout == "" and "Traceback" not in done.stderr, done.stderr
    assert "no installed video template 'video_no_such_template'" in done.stderr, done.stderr
    listed = cli[1]["list"]
    if not video_templates():   # the pure environment: no templates package at all
        assert "none: no comfyui_workflow_templates package installed" in done.stderr
        assert "pip install comfyui-workflow-templates" in done.stderr
        assert listed.returncode == 2 and "no comfyui_workflow_templates package installed" in listed.stdout
    else:
        assert listed.returncode == 0 and set(listed.stdout.splitlines()) == set(video_templates())
