"""The pack's HTTP routes (``loaders/workflow/routes.py``) with real ComfyUI.

In this process (ComfyUI imported, no server): the routes are mounted on an aiohttp app of their
own and driven over HTTP on 127.0.0.1; ``node_io`` comes from the real ``NODE_CLASS_MAPPINGS``.
On the session's test server (``comfy_server``): the pack registered them itself, under ``/api``
too, and the template listing carries the ShardDiT category built from the installed templates.
"""
import asyncio
import json
import pickle

import pytest

from harness import templates as tpl
from sharddit.loaders.workflow.shard_transform import SHARD_NODE, shard_workflow

routes = None   # loaders/workflow/routes.py needs aiohttp (ComfyUI's environment): imported by the fixture below


@pytest.fixture(autouse=True)
def _routes(comfy_env):
    global routes
    from sharddit.loaders.workflow import routes as module

    routes = module

pytestmark = [pytest.mark.comfy, pytest.mark.no_blas]
TEMPLATE = "video_wan2_2_14B_t2v"


def _post(path: str, body: bytes, piece: int = 0):
    """``(status, JSON answer)`` of POST ``path`` on a fresh app with only our routes; with ``piece``,
    the body goes in pieces of that many bytes, a moment apart, without a length (chunked), as a
    browser's large body arrives."""
    from aiohttp import web
    from aiohttp.test_utils import TestClient, TestServer

    async def go():
        app, table = web.Application(), web.RouteTableDef()
        routes.attach(app, table)
        app.add_routes(table)
        async with TestClient(TestServer(app, host="127.0.0.1")) as client:
            data = body
            if piece:
                async def pieces():
                    for i in range(0, len(body), piece):
                        yield body[i:i + piece]
                        await asyncio.sleep(0.002)
                data = pieces()
            response = await client.post(path, data=data, headers={"Content-Type": "application/json"})
            return response.status, await response.json()
    return asyncio.run(go())


def _shard(workflow, path="/sharddit/workflow/shard"):
    return _post(path, json.dumps({"workflow": workflow}).encode())


def _template():
    path = tpl.template_path(f"{TEMPLATE}.json")
    if path is None:
        pytest.skip(f"no comfyui_workflow_templates_json package with {TEMPLATE} in this environment "
                    "(added after ComfyUI 0.3.64)")
    return json.loads(path.read_text())


def test_shard_then_unshard_a_core_template(comfy_env):
    """Wan 2.2 14B t2v: two Shard nodes inside its subgraph, named after the two experts; the
    answer's workflow is the transform's; unshard gives the template back exactly."""
    template = _template()
    status, answer = _shard(template)
    assert status == 200, answer
    assert sorted(answer) == ["added", "already", "format", "message", "reason", "workflow"]
    assert answer["workflow"] == shard_workflow(template).workflow
    assert len(answer["added"]) == 2 and answer["reason"] is None and answer["already"] == []
    assert all(c["graph"] and c["loader_type"] == "UNETLoader" for c in answer["added"]), answer["added"]
    assert answer["message"].startswith("2 Shard nodes added: "), answer["message"]
    again = _shard(answer["workflow"])[1]
    assert again["added"] == [] and len(again["already"]) == 2 and again["reason"].startswith("already sharded")
    status, undone = _shard(answer["workflow"], "/sharddit/workflow/unshard")
    assert status == 200 and len(undone["added"]) == 2
    assert undone["workflow"] == template


def test_a_body_arriving_in_pieces_is_read_whole(comfy_env):
    """A large workflow reaches the server in several packets (seen in the browser: the first
    packet alone was parsed and failed as "not JSON")."""
    template = _template()
    body = json.dumps({"workflow": template}).encode()
    status, answer = _post("/sharddit/workflow/shard", body, piece=4096)
    assert status == 200 and len(answer["added"]) == 2, answer.get("error")
    status, answer = _post("/sharddit/workflow/shard", b"x" * 3000, piece=1024)
    assert status == 400 and "not JSON" in answer["error"]


def test_api_prompt_reads_node_classes_from_comfyui(comfy_env):
    """An API prompt has no types: a loader the transform does not know by name (core's
    DiffusersLoader: MODEL out, no MODEL in) is found through the running ComfyUI's classes."""
    assert "DiffusersLoader" in comfy_env.nodes.NODE_CLASS_MAPPINGS
    prompt = {"1": {"class_type": "DiffusersLoader", "inputs": {"model_path": "x"}},
              "2": {"class_type": "ModelSamplingSD3", "inputs": {"model": ["1", 0], "shift": 8.0}}}
    status, answer = _shard(prompt)
    assert status == 200 and answer["format"] == "api", answer
    (change,) = answer["added"]
    shard = answer["workflow"][change["shard_id"]]
    assert shard["class_type"] == SHARD_NODE and shard["inputs"]["model"] == ["1", 0]
    assert answer["workflow"]["2"]["inputs"]["model"] == [change["shard_id"], 0]


def test_nothing_to_shard_is_an_answer_not_an_error(comfy_env):
    prompt = {"1": {"class_type": "EmptyLatentImage", "inputs": {"width": 64, "height": 64, "batch_size": 1}}}
    status, answer = _shard(prompt)
    assert status == 200 and answer["added"] == [] and answer["workflow"] == prompt
    assert answer["reason"].startswith("nothing to shard") and answer["message"] == answer["reason"]


@pytest.mark.parametrize("body, says", [
    (b"{not json", "not JSON"),
    (pickle.dumps({"workflow": {}}), "not JSON"),
    (b"[1, 2]", 'expected {"workflow"'),
    (b'{"graph": {}}', 'expected {"workflow"'),
    (b'{"workflow": {"a": 1}}', "not a ComfyUI workflow"),
    (b'{"workflow": {"nodes": ["not a node"], "links": []}}', "cannot be read"),
    (b'{"workflow": ' + b"[" * 100000 + b"]" * 100000 + b"}", "nests JSON deeper"),
    (b'{"workflow": {"1": {"class_type": "X", "inputs": {"a": ' + b"[" * 700 + b"]" * 700 + b"}}}}",
     "cannot be read"),
], ids=["broken", "pickle", "list", "no-workflow-key", "not-a-workflow", "malformed-ui", "deep-json", "deep-inputs"])
def test_bad_input_gets_400_with_its_reason(comfy_env, body, says):
    for path in ("/sharddit/workflow/shard", "/sharddit/workflow/unshard"):
        status, answer = _post(path, body)
        assert status == 400 and says in answer["error"], (path, status, answer)


def test_too_large_gets_400(comfy_env, monkeypatch):
    """Said by its length, and counted while it arrives when it comes without one."""
    monkeypatch.setattr(routes, "MAX_BODY", 1000)
    body = json.dumps({"workflow": {"1": {"class_type": "EmptyLatentImage", "inputs": {"pad": "x" * 2000}}}}).encode()
    for piece in (0, 256):
        status, answer = _post("/sharddit/workflow/shard", body, piece=piece)
        assert status == 400 and "too large" in answer["error"] and "1000 bytes" in answer["error"], answer


def test_the_server_serves_the_routes_and_the_shardit_category(comfy_server):
    """On a real server the pack registered the routes itself (plain and under /api); the template
    listing has the ShardDiT category: every installed video template the transform shards and
    this ComfyUI can run, each served sharded, with the installed template's picture."""
    import requests

    from sharddit.loaders.workflow import templates

    for path in ("/sharddit/workflow/shard", "/api/sharddit/workflow/shard"):
        answer = requests.post(comfy_server.url + path, data=b"nope", timeout=30)
        assert answer.status_code == 400 and "not JSON" in answer.json()["error"], (path, answer.text)
    listing = comfy_server._get("/api/workflow_templates")
    installed = templates.video_templates()
    print(f"[ShardDiT] installed video templates: {len(installed)}; ShardDiT category: "
          f"{len(listing.get('ShardDiT', []))}")
    if not installed:
        assert "ShardDiT" not in listing
        return
    names = listing["ShardDiT"]
    assert TEMPLATE in names and set(names) <= set(installed)
    known = set(comfy_server.object_info())
    for name in names:
        sharded = requests.get(f"{comfy_server.url}/api/workflow_templates/ShardDiT/{name}.json", timeout=30).json()
        assert SHARD_NODE in tpl.node_types(sharded) and tpl.node_types(sharded) <= known, name
    picture = requests.get(f"{comfy_server.url}/api/workflow_templates/ShardDiT/{TEMPLATE}.jpg", timeout=30)
    assert picture.status_code == 200 and picture.headers["Content-Type"].startswith("image/")
    assert picture.content == templates.template_thumbnail(TEMPLATE).read_bytes()
    missing = requests.get(f"{comfy_server.url}/api/workflow_templates/ShardDiT/video_nope.json", timeout=30)
    assert missing.status_code == 404
