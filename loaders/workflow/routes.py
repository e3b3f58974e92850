"""The pack's HTTP routes inside a ComfyUI server (aiohttp), registered once by ``register()`` from
the pack's ``__init__.py``. ComfyUI serves every route of
``PromptServer.instance.routes`` under ``/api`` too.

- ``POST /sharddit/workflow/shard`` and ``POST /sharddit/workflow/unshard``: body
  ``{"workflow": {...}}`` (UI or API format), answer ``{"workflow", "added", "already", "reason",
  "message"}`` from ``shard.shard_workflow`` / ``unshard_workflow`` — the web command
  (``web/shard_command.js``) has no copy of the transform. Bad input (not JSON, not a workflow, over
  ``MAX_BODY``) gets 400 and a message naming it. JSON only (nothing unpickled), nothing kept.
- The template browser (``template_category``): a middleware rewrites core's
  ``GET /workflow_templates`` answer (the pack's workflows this ComfyUI cannot load left out, the
  ShardDiT category added); ``GET /workflow_templates/ShardDiT/<name>.json`` builds the sharded
  template from the installed file, ``<name>.jpg`` answers the installed template's own picture.
"""
from __future__ import annotations

import asyncio
import json
import logging
import sys

from aiohttp import web

from . import templates
from .comfy_nodes import node_io_from_mappings
from .shard_transform import shard_workflow, unshard_workflow
from .graph import WorkflowError
from .template_category import CATEGORY, filter_listing, sharded_template

__all__ = ["MAX_BODY", "attach", "register"]

MAX_BODY = 32 * 1024 * 1024   # bytes; the largest core template is under 1 MiB
PREFIX = "/sharddit/workflow"
LISTING_PATHS = ("/workflow_templates", "/api/workflow_templates")
PICTURE_TYPES = {".webp": "image/webp", ".jpg": "image/jpeg", ".jpeg": "image/jpeg", ".png": "image/png"}
MARK = "_sharddit_routes"     # set on the server once our routes are in
log = logging.getLogger(__name__)


class BadRequest(Exception):
    """A request we answer with 400 and this message."""


def _node_classes() -> dict:
    """The node classes of the running ComfyUI (its ``nodes.py``; {} outside a ComfyUI process)."""
    comfy_nodes = sys.modules.get("nodes")
    return getattr(comfy_nodes, "NODE_CLASS_MAPPINGS", None) or {}


def _change(change) -> dict:
    return {"graph": change.graph, "loader_id": change.loader_id, "loader_type": change.loader_type,
            "label": change.label, "shard_id": change.shard_id}


async def _read_workflow(request: web.Request) -> dict:
    size = request.content_length
    if size is not None and size > MAX_BODY:
        raise BadRequest(f"workflow too large: {size} bytes, the limit is {MAX_BODY} bytes ({MAX_BODY >> 20} MiB)")
    body = bytearray()   # read to the end (read(n) gives what has arrived), bounded without a length too
    while chunk := await request.content.read(1 << 20):
        body += chunk
        if len(body) > MAX_BODY:
            raise BadRequest(f"workflow too large: over {MAX_BODY} bytes ({MAX_BODY >> 20} MiB)")
    try:
        data = json.loads(bytes(body))
    except RecursionError:
        raise BadRequest("the body nests JSON deeper than Python reads; send the workflow as ComfyUI saves it") from None
    except (ValueError, UnicodeDecodeError) as e:
        raise BadRequest(f"the body is not JSON ({e}); send {{\"workflow\": <the workflow as ComfyUI saves it>}}")
    if not isinstance(data, dict) or not isinstance(data.get("workflow"), dict):
        found = f"keys {sorted(data)[:6]}" if isinstance(data, dict) else type(data).__name__
        raise BadRequest(f"expected {{\"workflow\": {{...}}}}, got {found}")
    return data["workflow"]


def _transform_handler(transform, takes_node_io: bool):
    async def handler(request: web.Request) -> web.Response:
        try:
            workflow = await _read_workflow(request)
            args = (workflow, node_io_from_mappings(_node_classes())) if takes_node_io else (workflow,)
            # off the event loop: a large workflow must not hold up ComfyUI's other requests
            result = await asyncio.get_running_loop().run_in_executor(None, transform, *args)
        except (BadRequest, WorkflowError) as e:
            log.warning("[ShardDiT] %s: 400: %s", request.path, e)
            return web.json_response({"error": str(e)}, status=400)
        except (KeyError, IndexError, TypeError, AttributeError, ValueError, RecursionError) as e:
            # a workflow whose parts are not what ComfyUI writes (a link to nowhere, a node without an id)
            log.warning("[ShardDiT] %s: cannot read the workflow: %r", request.path, e)
            return web.json_response({"error": f"the workflow cannot be read: {type(e).__name__}: {e} "
                                               "(save it again from ComfyUI and retry)"}, status=400)
        return web.json_response({"workflow": result.workflow, "format": result.format,
                                  "added": [_change(c) for c in result.added],
                                  "already": [_change(c) for c in result.already],
                                  "reason": result.reason, "message": result.message})
    return handler


async def _category_file(request: web.Request) -> web.StreamResponse:
    """``<name>.json``: the sharded template; ``<name>.jpg``: the installed template's picture."""
    file = request.match_info["file"]
    name, _, suffix = file.rpartition(".")
    if suffix == "json":
        classes = _node_classes()
        workflow = sharded_template(name, classes, node_io_from_mappings(classes))
        if workflow is not None:
            return web.json_response(workflow)
    elif suffix == "jpg" and name in templates.video_templates():
        picture = templates.template_thumbnail(name)
        if picture is not None:
            # the frontend asks for .jpg for every custom-node card; the browser reads the real type
            kind = PICTURE_TYPES.get(picture.suffix.lower(), "application/octet-stream")
            return web.FileResponse(picture, headers={"Content-Type": kind})
    raise web.HTTPNotFound(text=f"[ShardDiT] no sharded template {file!r}")


@web.middleware
async def _listing_middleware(request: web.Request, handler):
    response = await handler(request)
    if request.method != "GET" or request.path not in LISTING_PATHS or response.status != 200:
        return response
    try:
        listing = json.loads(response.body)
    except (AttributeError, TypeError, ValueError):
        return response   # not the JSON answer core gives: leave it
    classes = _node_classes()
    return web.json_response(filter_listing(listing, classes, node_io_from_mappings(classes)))


def attach(app: web.Application, routes: web.RouteTableDef) -> None:
    """Add the routes to ``routes`` (ComfyUI adds them to its app, and under /api) and the listing
    middleware to ``app`` (before the app starts: aiohttp freezes its middlewares then)."""
    routes.post(f"{PREFIX}/shard")(_transform_handler(shard_workflow, True))
    routes.post(f"{PREFIX}/unshard")(_transform_handler(unshard_workflow, False))
    routes.get(f"/workflow_templates/{CATEGORY}/{{file}}")(_category_file)
    app.middlewares.append(_listing_middleware)


def register() -> bool:
    """Attach to the running ComfyUI server once; False outside a server (tests that load ComfyUI
    in-process, tools) or when already attached."""
    server_module = sys.modules.get("server")   # ComfyUI's main.py imports it before loading packs
    instance = getattr(getattr(server_module, "PromptServer", None), "instance", None)
    if instance is None or getattr(instance, MARK, False):
        return False
    if instance.app.frozen:
        log.warning("[ShardDiT] the web server already started: the shard routes and the template category "
                    "are not available (restart ComfyUI)")
        return False
    attach(instance.app, instance.routes)
    setattr(instance, MARK, True)
    log.info("[ShardDiT] routes: POST /api%s/shard, /api%s/unshard; template category %r", PREFIX, PREFIX, CATEGORY)
    return True
