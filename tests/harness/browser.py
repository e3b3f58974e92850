"""ComfyUI's real web UI in headless Chromium (Debian's ``chromium`` driven by ``playwright``).

Never downloads a browser: ``launch`` uses the system one (``CHROMIUM``). What a user does is
done as a user does it: a workflow is *dropped* on the canvas (a ``drop`` event carrying a
``DataTransfer`` with the file), the Run button is clicked, node search opens on a double-click.
The graph is read back through ``window.app`` (nodes, groups, widgets, outputs).
"""
from __future__ import annotations

import os
import shutil
from pathlib import Path

import requests

CHROMIUM = os.environ.get("SHARDDIT_CHROMIUM", "/usr/bin/chromium")
WINDOW = {"width": 1600, "height": 1000}
# Node search's text box and its hover preview: the frontend of ComfyUI 0.3.64 (1.27) first, then the
# search dialog of newer ones (1.47: role=search, the preview card's test id). Whichever is on the page.
NODE_SEARCH_INPUT = ".comfy-vue-node-search-container input, [role=search] input[role=combobox]"
NODE_PREVIEW = "._sb_node_preview, [data-testid=node-preview-card]"


def skip_reason() -> str | None:
    """Why the browser tests cannot run here (None when they can)."""
    if not os.environ.get("COMFYUI_PATH"):
        return "needs ComfyUI: set COMFYUI_PATH (see tests/README.md)"
    if not (Path(CHROMIUM).is_file() or shutil.which(CHROMIUM)):
        return f"needs Chromium at {CHROMIUM} (Debian: apt-get install chromium)"
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "needs the playwright Python package (pip install playwright; never 'playwright install')"
    return None


# Settings a returning user has. TutorialCompleted: no first-run template dialog over the canvas.
# The two canvas settings hold the values the default "legacy" navigation mode writes: the frontend of
# ComfyUI 0.3.64 (1.27) writes them from that mode's onChange while registering it, before they are
# registered, and throws "Cannot read properties of undefined (reading 'id')" on a fresh profile
# (settingStore onChange <- addSetting); a saved value equal to the written one skips the write.
RETURNING_USER = {"Comfy.TutorialCompleted": True, "Comfy.Canvas.LeftMouseClickBehavior": "panning",
                  "Comfy.Canvas.MouseWheelScroll": "zoom"}


def prepare_server(url: str) -> None:
    """The settings of a returning user (``RETURNING_USER``)."""
    for key, value in RETURNING_USER.items():
        requests.post(f"{url}/api/settings/{key}", json=value, timeout=10).raise_for_status()


def launch(playwright):
    return playwright.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])


KNOWN_FRONTEND_ERRORS = (
    # ComfyUI's own frontend (comfyui-frontend-package as ComfyUI 0.3.64 pins it), at page load:
    # registering the core setting Comfy.Canvas.NavigationMode runs its onChange, which sets
    # Comfy.Canvas.LeftMouseClickBehavior before that setting is registered, and the store reads
    # ``setting.id`` of undefined. Thrown by the frontend's bundle before any node of this pack
    # exists on the page; recognised by its message and the frame it comes from.
    ("Cannot read properties of undefined (reading 'id')", "at Proxy.addSetting "),
)


def _is_known(err) -> bool:
    stack = getattr(err, "stack", "") or ""
    return any(message == str(err) and frame in stack for message, frame in KNOWN_FRONTEND_ERRORS)


def _on_page_error(page, err) -> None:
    (page.known_errors if _is_known(err) else page.errors).append(_error_text(err))


def _error_text(err) -> str:
    """The message and the first frames of its stack (which script threw: ours under
    /extensions/sharddit/, or the frontend's own)."""
    frames = [line.strip() for line in (getattr(err, "stack", "") or "").splitlines()[1:4]]
    return " | ".join([str(err), *frames])


def take_page_errors(page) -> list[str]:
    """The uncaught page errors since the last call (``pageerror`` events), and clear the list:
    tests assert it empty after each step, so an exception the UI only logs still fails them."""
    errors, page.errors[:] = list(page.errors), []
    return errors


def run_button(page):
    """The Run (queue) button. Newer frontends give it a test id, and a second control labelled Run
    (the queue-mode menu) sits next to it; older ones have one button named Run."""
    by_id = page.locator("[data-testid=queue-button]")
    return by_id.first if by_id.count() else page.get_by_role("button", name="Run", exact=True)


def open_ui(browser, url: str, timeout_ms: int = 120_000):
    """A page with ComfyUI loaded (app and canvas ready); uncaught errors collected on ``page.errors``
    (read them with ``take_page_errors``), but for the frontend's own ``KNOWN_FRONTEND_ERRORS``
    (kept apart on ``page.known_errors``)."""
    page = browser.new_page(viewport=WINDOW)
    page.errors, page.known_errors = [], []
    page.on("pageerror", lambda err: _on_page_error(page, err))
    page.goto(url)
    page.wait_for_function("() => window.app?.graph && window.app.canvas && window.app.vueAppReady !== false",
                           timeout=timeout_ms)
    page.wait_for_selector("#graph-canvas", timeout=timeout_ms)
    page.wait_for_timeout(1000)
    return page


_DROP = """([text, name]) => {
  const dt = new DataTransfer();
  dt.items.add(new File([text], name, {type: "application/json"}));
  const canvas = document.querySelector("#graph-canvas");
  for (const type of ["dragenter", "dragover", "drop"])
    canvas.dispatchEvent(new DragEvent(type, {dataTransfer: dt, bubbles: true, cancelable: true}));
}"""


def drop_workflow(page, path: Path, timeout_ms: int = 30_000) -> None:
    """Drag the file onto the canvas as a user would; wait until its nodes are in the graph."""
    text = Path(path).read_text(encoding="utf-8")
    expected = len(__import__("json").loads(text)["nodes"])
    page.evaluate(_DROP, [text, Path(path).name])
    page.wait_for_function(f"() => window.app.graph.nodes.length === {expected}", timeout=timeout_ms)
    page.wait_for_timeout(1500)  # dialogs (missing nodes / models) open asynchronously


def open_dialogs(page) -> list:
    """Text of every visible dialog (missing nodes, missing models, errors)."""
    return page.evaluate("""() => Array.from(document.querySelectorAll('.p-dialog, [role=dialog]'))
        .filter(e => e.offsetParent !== null).map(e => e.innerText.slice(0, 500))""")


def error_notices(page) -> list:
    """Text of visible toasts and alerts, and any "N errors found" notice: the 0.29 frontend
    reports a workflow's missing models this way (a toast and red nodes), not in a dialog."""
    return page.evaluate("""() => {
      const shown = Array.from(document.querySelectorAll('.p-toast-message, [role=alert]'))
        .filter(e => e.offsetParent !== null).map(e => e.innerText.slice(0, 300));
      const found = document.body.innerText.match(/\\b\\d+ errors? found\\b[^\\n]*/g) || [];
      return [...shown, ...found];
    }""")


GRAPH_STATE = """() => {
  const ctx = document.createElement("canvas").getContext("2d");
  const rect = document.querySelector("#graph-canvas").getBoundingClientRect();
  const ds = app.canvas.ds;
  return {
    scale: ds.scale, offset: Array.from(ds.offset), canvas: [rect.x, rect.y, rect.width, rect.height],
    nodes: app.graph.nodes.map(n => ({
      id: n.id, type: n.type, title: n.title, mode: n.mode, pos: Array.from(n.pos), size: Array.from(n.size),
      min_size: Array.from(n.computeSize()),
      bounding: Array.from(n.getBounding ? n.getBounding() : n.boundingRect),
      widgets: (n.widgets || []).map(w => ({name: w.name, value: w.value, serialize: w.serialize !== false})),
      images: (n.imgs || []).map(i => [i.naturalWidth, i.naturalHeight]),
    })),
    groups: app.graph.groups.map(g => {
      ctx.font = `${g.font_size}px Arial`;
      return {title: g.title, bounding: Array.from(g._bounding || g.bounding), title_height: g.titleHeight,
              title_width: ctx.measureText(g.title).width + 4};
    }),
  };
}"""


def graph_state(page) -> dict:
    return page.evaluate(GRAPH_STATE)


def overlaps(a, b) -> bool:
    ax, ay, aw, ah = a
    bx, by, bw, bh = b
    return ax < bx + bw and bx < ax + aw and ay < by + bh and by < ay + ah


def to_screen(state: dict, box) -> list:
    """A graph-space box ``[x, y, w, h]`` in CSS pixels at the current view."""
    s, (ox, oy) = state["scale"], state["offset"]
    cx, cy = state["canvas"][:2]
    return [cx + (box[0] + ox) * s, cy + (box[1] + oy) * s, box[2] * s, box[3] * s]


def screenshot(page, path: Path) -> Path:
    page.screenshot(path=str(path))
    print(f"[ShardDiT] screenshot: {path}")
    return path


def focus_node(page, node_id: int, margin: int = 40) -> None:
    """Zoom and pan so the node fills the window at a readable scale (at most 100 %)."""
    page.evaluate("""([id, margin]) => {
      const n = app.graph.getNodeById(id);
      const [x, y, w, h] = n.getBounding ? Array.from(n.getBounding()) : n.boundingRect;
      const r = document.querySelector("#graph-canvas").getBoundingClientRect();
      const ds = app.canvas.ds;
      ds.scale = Math.min(1, (r.width - 2 * margin - 80) / w, (r.height - 2 * margin - 100) / h);
      ds.offset[0] = (80 + margin) / ds.scale - x;
      ds.offset[1] = (100 + margin) / ds.scale - y;
      app.canvas.setDirty(true, true);
    }""", [node_id, margin])
    page.wait_for_timeout(500)


# The frontend's own bars that float over the canvas (0.29: the canvas fills the window under them).
CHROME = (".workflow-tabs-container, .side-tool-bar-container, .actionbar-container, .subgraph-breadcrumb, "
          ".minimap-main-container")


def covered_by_chrome(page, points) -> list:
    """The ``[x, y]`` screen points (of ``points``) where a bar of the frontend (``CHROME``) lies
    over the canvas."""
    return page.evaluate("""([points, chrome]) => points.filter(([x, y]) => {
        const e = document.elementFromPoint(x, y); return e !== null && e.closest(chrome) !== null; })""",
                         [points, CHROME])


def write_thumbnail(page, screen, jpg: Path, shots: Path) -> None:
    """The graph alone (no minimap, no toolbars) as the template card's JPEG."""
    from PIL import Image

    x0, y0 = max(0, min(b[0] for b in screen) - 8), max(0, min(b[1] for b in screen) - 8)
    x1 = min(WINDOW["width"], max(b[0] + b[2] for b in screen) + 8)
    y1 = min(WINDOW["height"], max(b[1] + b[3] for b in screen) + 8)
    hide = ".minimap-main-container, .p-buttongroup, [class*=graph-canvas-menu], .selection-toolbox, " + CHROME
    page.evaluate(f"""() => {{ document.querySelectorAll('{hide}').forEach(e => e.style.visibility = 'hidden');
        app.canvas.show_info = false; app.canvas.setDirty(true, true); }}""")  # no canvas info in the corner
    page.wait_for_timeout(300)
    png = shots / f"{jpg.stem}_thumb.png"
    page.screenshot(path=str(png), clip={"x": x0, "y": y0, "width": x1 - x0, "height": y1 - y0})
    page.evaluate(f"""() => {{ document.querySelectorAll('{hide}').forEach(e => e.style.visibility = '');
        app.canvas.show_info = true; app.canvas.setDirty(true, true); }}""")
    with Image.open(png) as im:
        im.thumbnail((800, 500), Image.LANCZOS)
        im.convert("RGB").save(jpg, quality=85)
    print(f"[ShardDiT] thumbnail: {jpg}")


# The graph that holds the Shard nodes: the top level, or the subgraph opened as its icon opens it.
_OPEN_SHARD_GRAPH = """() => {
  const inner = (g) => g.nodes.find(n => n.type === 'ShardDiTShardModel');
  if (!inner(app.graph)) {
    const host = app.graph.nodes.find(n => n.subgraph && inner(n.subgraph));
    app.canvas.openSubgraph(host.subgraph, host);
  }
}"""
# After the subgraph's own saved view is applied: the first Shard node and its neighbours at 80 %.
_SHOW_SHARD = """() => {
  const g = app.canvas.graph, s = g.nodes.find(n => n.type === 'ShardDiTShardModel');
  const [x, y, w, h] = Array.from(s.getBounding());
  const ds = app.canvas.ds;
  ds.scale = 0.8; ds.offset[0] = 800 / 0.8 - (x + w / 2); ds.offset[1] = 500 / 0.8 - (y + h / 2);
  app.canvas.setDirty(true, true);
  return g.nodes.map(n => ({id: n.id, type: n.type, title: n.title, bounding: Array.from(n.getBounding()),
                            widgets: (n.widgets || []).filter(w => w.serialize !== false).map(w => w.value)}));
}"""


def shard_graph_nodes(page, shot: Path) -> list:
    """Open the graph holding the ShardDiT Shard nodes, screenshot them at 80 %, go back to the top
    level; its nodes as ``{id, type, title, bounding, widgets (serialized values)}``."""
    try:
        page.evaluate(_OPEN_SHARD_GRAPH)
        page.wait_for_timeout(1000)   # the subgraph's own saved view is applied first
        nodes = page.evaluate(_SHOW_SHARD)
        page.wait_for_timeout(500)
        screenshot(page, shot)
    finally:
        page.evaluate("() => app.canvas.graph !== app.graph && app.canvas.setGraph(app.graph)")
    return nodes


def run_until_video(ui) -> None:
    """Press Run and wait until Save Video has its .mp4, or until a node fails: then fail at once
    with the server's message (not after a 10-minute timeout)."""
    ui.evaluate("""() => { window.__shardditError = null;
      app.api.addEventListener('execution_error', e => { window.__shardditError = e.detail; }); }""")
    run_button(ui).click()
    ui.wait_for_function("""() => {
      const save = app.graph.nodes.find(n => n.type === 'SaveVideo');
      const out = app.nodeOutputStore?.getNodeOutputs?.(save) ?? app.nodeOutputs?.[save.id];
      return window.__shardditError || out?.images?.some(i => i.filename.endsWith('.mp4'));
    }""", timeout=600_000)
    error = ui.evaluate("() => window.__shardditError")
    assert error is None, f"{error['node_type']} failed: {error['exception_type']}: {error['exception_message']}"
