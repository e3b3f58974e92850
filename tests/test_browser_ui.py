"""ShardDiT in ComfyUI's real web UI (headless Chromium): what a user sees.

Needs COMFYUI_PATH, Debian's ``chromium`` at /usr/bin/chromium and the ``playwright`` package
(never ``playwright install``); skipped with the reason otherwise. Uses the session test server
(tiny models under the workflows' real file names, ``harness.fixtures.workflow_models``).
Screenshots go to the test's temp folder; their paths are printed (``pytest -s`` shows them).
``SHARDDIT_WRITE_THUMBNAILS=1`` also writes each workflow's screenshot as its template thumbnail
``workflows/<name>.jpg``.
"""
import os

import pytest

import workflow_tools as wt
from harness import browser

pytestmark = [pytest.mark.browser, pytest.mark.comfy]
if browser.skip_reason():
    pytestmark.append(pytest.mark.skip(reason=browser.skip_reason()))

UI_FILES = {name: ui for name, ui, _ in wt.workflow_pairs()}
SHARDDIT_DISPLAY_NAMES = {
    "Load Diffusion Model (ShardDiT)", "Load Text Encoder (ShardDiT)", "Load VAE (ShardDiT)",
    "Shard DiT Blocks (ShardDiT)", "KSampler (ShardDiT)", "VAE Decode Tiled (ShardDiT)", "Placement Plan (ShardDiT)"}
# Wan 2.1 on CPU: tiny models already sit under the real names; small size, 2 steps, two CPU shards.
WAN21_TINY = {"EmptyHunyuanLatentVideo": {"width": 64, "height": 64, "length": 5},
              "ShardDiTKSampler": {"steps": 2, "devices": "cpu,cpu"},
              "ShardDiTLoadDiffusionModel": {"devices": "cpu,cpu"},
              "ShardDiTVAEDecodeTiled": {"devices": "cpu,cpu"},
              "ShardDiTLoadTextEncoder": {"device": "cpu"}, "ShardDiTLoadVAE": {"device": "cpu"}}
GRAPH_TO_PROMPT = "async () => (await app.graphToPrompt()).output"


@pytest.fixture(scope="module")
def ui(comfy_server, workflow_models):
    # every model file of every workflow is on the server before the page first asks for the lists
    from playwright.sync_api import sync_playwright

    browser.prepare_server(comfy_server.url)
    with sync_playwright() as p:
        chromium = browser.launch(p)
        try:
            yield browser.open_ui(chromium, comfy_server.url)
        finally:
            chromium.close()


@pytest.fixture(autouse=True)
def no_page_errors(request):
    """After every test on the page: no uncaught error in ComfyUI's frontend (a broken node
    widget or extension often shows only there)."""
    yield
    if "ui" in request.fixturenames:
        errors = browser.take_page_errors(request.getfixturevalue("ui"))
        assert errors == [], f"uncaught errors in the page during {request.node.name}: {errors}"


@pytest.fixture(scope="module")
def shots(tmp_path_factory):
    return tmp_path_factory.mktemp("screenshots")


def _load(page, name):
    browser.drop_workflow(page, UI_FILES[name])
    return browser.graph_state(page)



@pytest.mark.parametrize("name", sorted(UI_FILES))
def test_dropped_workflow_loads_cleanly_and_fits_the_window(ui, shots, comfy_server, name):
    """No dialog or error notice on drop, our nodes with their values, sizes kept, nothing overlaps,
    everything in the window at the saved view, and the frontend queues exactly the API twin. A
    workflow needing a newer ComfyUI than this one (``min_comfyui``) is skipped with the reason."""
    mark = wt.min_comfyui(wt.load(UI_FILES[name]))
    missing = sorted({n["type"] for n in wt.load(UI_FILES[name])["nodes"]} - set(comfy_server.object_info())
                     - wt.FRONTEND_ONLY)
    if missing:
        pytest.skip(f"{name} needs ComfyUI >= {mark}: this one lacks {missing} (added after ComfyUI 0.3.64)")
    state = _load(ui, name)
    shot = browser.screenshot(ui, shots / f"{name}.png")
    assert browser.open_dialogs(ui) == [], "a dialog opened on drop (missing nodes or models?)"
    assert browser.error_notices(ui) == [], f"the frontend reports errors in the workflow: {shot}"
    twin = wt.strip_meta(wt.load(wt.API_DIR / f"{name}_api.json"))
    queued, twin = wt.comparable(wt.strip_meta(ui.evaluate(GRAPH_TO_PROMPT)), twin,
                                 wt.object_info_types(comfy_server.object_info()))
    differ = {k: (queued.get(k), twin.get(k)) for k in sorted(set(queued) | set(twin)) if queued.get(k) != twin.get(k)}
    assert not differ, f"the frontend queues another graph than the API twin (frontend, twin): {differ}"
    # every ShardDiT node is there, with its widgets and the file's values
    # ids as the file has them; newer frontends hand them back as strings
    saved = {str(n["id"]): n for n in wt.load(UI_FILES[name])["nodes"]}
    ours = wt.sharddit_schemas()
    for node in state["nodes"]:
        if node["type"] in ours:
            names = [w["name"] for w in node["widgets"] if w["serialize"]]
            expected = [n for i in ours[node["type"]].widgets
                        for n in ([i.name, "control_after_generate"] if i.control else [i.name])]
            assert names == expected, (node["type"], names)
            values = [w["value"] for w in node["widgets"] if w["serialize"]]
            assert values == saved[str(node["id"])]["widgets_values"], node["type"]
    assert {n["type"] for n in state["nodes"]} >= {n["type"] for n in saved.values()}
    # every node keeps its saved size: the frontend's own minimum is the rule the generator uses
    table = wt.node_table(ours)
    for node in state["nodes"]:
        if node["type"] in ours:
            assert node["min_size"][1] == wt.min_node_height(table[node["type"]]), (node["type"], node["min_size"])
        else:  # core nodes gain widgets in newer ComfyUI (0.29: CreateVideo's bit_depth): the saved height holds them
            assert node["min_size"][1] <= node["size"][1], (node["type"], node["min_size"], node["size"])
        assert node["size"] == saved[str(node["id"])]["size"], f"{node['title']!r} was resized on load: {node['size']}"
    # group titles fit their groups and no two title bars overlap (graph units: true at any zoom)
    groups = state["groups"]
    for g in groups:
        assert g["title_width"] <= g["bounding"][2], f"title {g['title']!r} wider than its group"
    titles = [[*g["bounding"][:3], g["title_height"]] for g in groups]
    for i, a in enumerate(titles):
        for j, b in enumerate(titles[i + 1:], i + 1):
            assert not browser.overlaps(a, b), f"titles {groups[i]['title']!r} and {groups[j]['title']!r} overlap"
    # no node overlaps another node or another group's title bar
    nodes = state["nodes"]
    for i, a in enumerate(nodes):
        for b in nodes[i + 1:]:
            assert not browser.overlaps(a["bounding"], b["bounding"]), f"nodes {a['title']!r} and {b['title']!r} overlap"
        for g, t in zip(groups, titles):
            assert not browser.overlaps(a["bounding"], t), f"node {a['title']!r} covers group title {g['title']!r}"
    # the saved view shows everything in the 1600x1000 window at a zoom that still draws text
    assert state["scale"] >= 0.6, state["scale"]
    cx, cy = state["canvas"][:2]
    minimap = ui.evaluate("""() => { const m = document.querySelector('.minimap-main-container');
        if (!m || m.offsetParent === null) return null; const r = m.getBoundingClientRect();
        return [r.x, r.y, r.width, r.height]; }""")
    screen = [browser.to_screen(state, box) for box in [g["bounding"] for g in groups] + [n["bounding"] for n in nodes]]
    for x, y, w, h in screen:
        assert x >= cx and y >= cy and x + w <= 1600 and y + h <= 1000, f"{[x, y, w, h]} off screen at the saved view: {shot}"
        assert minimap is None or not browser.overlaps([x, y, w, h], minimap), f"the minimap covers {[x, y, w, h]}: {shot}"
    if wt.version_tuple(mark) >= (0, 29):
        # made for the 0.29 frontend, whose bars float over the canvas: none covers a group title or
        # a node (a 0.3.64 workflow's view is made for frontend 1.27, whose canvas starts below them)
        points = [[x + dx * w, y + dy * h] for x, y, w, h in screen for dx in (0.02, 0.5, 0.98) for dy in (0.02, 0.98)]
        covered = browser.covered_by_chrome(ui, points)
        assert not covered, f"the frontend's bars cover the graph at {covered[:6]}: {shot}"
    if os.environ.get("SHARDDIT_WRITE_THUMBNAILS") == "1":
        browser.write_thumbnail(ui, screen, UI_FILES[name].with_suffix(".jpg"), shots)



def test_plan_node_shows_its_picture_and_table(ui, shots):
    """Un-mute the Plan node (select it, Ctrl+M) and run just it: the picture and the table appear in it."""
    state = _load(ui, "wan2.1_t2v_14B_2gpu")
    plan = next(n for n in state["nodes"] if n["type"] == "ShardDiTPlan")
    assert plan["mode"] == 2, "the Plan node ships muted"
    x, y, w, _ = browser.to_screen(state, plan["bounding"])
    ui.mouse.click(x + w / 2, y + 12)  # its title bar
    ui.keyboard.press("Control+m")
    ui.wait_for_function(f"() => app.graph.getNodeById({plan['id']}).mode === 0", timeout=5000)
    ui.evaluate("() => app.extensionManager.command.execute('Comfy.QueueSelectedOutputNodes')")
    ui.wait_for_function(f"""() => {{
        const n = app.graph.getNodeById({plan['id']});
        return n.imgs?.length && n.imgs[0].naturalWidth && n.widgets.some(w => w.name === 'plan_text' && w.value);
    }}""", timeout=180_000)
    node = next(n for n in browser.graph_state(ui)["nodes"] if n["id"] == plan["id"])
    (width, height), = node["images"]
    assert width == 600 and 200 < height < 500, node["images"]
    text = next(w["value"] for w in node["widgets"] if w["name"] == "plan_text")
    assert "Simulated forward (" in text and "Strategies (" in text and ("FITS" in text or "DOES NOT FIT" in text)
    assert not any(w["name"] == "plan_text" for w in node["widgets"] if w["serialize"]), "the table is saved"
    browser.focus_node(ui, plan["id"])
    box = ui.evaluate("""() => { const e = document.querySelector('[data-sharddit=plan-text]');
        return e && {scroll: e.scrollWidth, client: e.clientWidth, height: e.clientHeight}; }""")
    assert box and box["scroll"] <= box["client"], f"the plan table is cut off on the right: {box}"
    assert box["height"] >= 100, f"the plan table shows too few lines: {box}"
    ui.evaluate("() => app.canvas.deselectAll()")  # no selection toolbox over the group title
    ui.mouse.move(1590, 990)  # no tooltip over the picture
    browser.screenshot(ui, shots / "plan_node.png")
    ui.evaluate(f"() => app.graph.getNodeById({plan['id']}).mode = 2")


def test_wan21_workflow_runs_from_the_run_button(ui, shots):
    _load(ui, "wan2.1_t2v_14B_2gpu")
    ui.evaluate("""(changes) => {
      for (const n of app.graph.nodes) for (const [name, value] of Object.entries(changes[n.type] || {})) {
        const w = n.widgets.find(w => w.name === name);
        w.value = value; w.callback?.(value);
      }
    }""", WAN21_TINY)
    browser.run_until_video(ui)
    ui.wait_for_function("() => [...document.querySelectorAll('video')].some(v => v.src.includes('sharddit_wan2.1'))",
                         timeout=60_000)
    ui.wait_for_timeout(500)  # the preview resizes the node once the video's size is known
    state = browser.graph_state(ui)
    save = next(n for n in state["nodes"] if n["type"] == "SaveVideo")
    group = next(g for g in state["groups"] if g["title"].startswith("5 "))
    gx, gy, gw, gh = group["bounding"]
    x, y, w, h = save["bounding"]
    assert gx <= x and x + w <= gx + gw and gy <= y and y + h <= gy + gh, \
        f"the video preview pushed Save Video {save['bounding']} out of its group {group['bounding']}"
    browser.focus_node(ui, save["id"])
    browser.screenshot(ui, shots / "wan21_run.png")


def test_node_search_lists_the_seven_nodes(ui, shots):
    ui.keyboard.press("Escape")
    state = browser.graph_state(ui)
    free = _empty_spot(state)
    ui.mouse.click(*free)
    ui.mouse.dblclick(*free)
    search = ui.locator(browser.NODE_SEARCH_INPUT).first
    search.wait_for(timeout=10_000)
    search.click()
    search.press_sequentially("ShardDiT", delay=50)
    # The list is redrawn after every key: read it in one go, once it holds the seven names (reading
    # option i of a count taken earlier raced the redraw and timed out on a vanished option).
    found = ui.wait_for_function("""([names, input]) => {
        if (document.querySelector(input)?.value !== 'ShardDiT') return false;
        const texts = [...document.querySelectorAll('[role=option]')]
            .map(o => o.innerText.split('\\n')[0].replace(/\\u00a0/g, '').trim());
        return names.every(n => texts.includes(n)) && texts;
    }""", arg=[sorted(SHARDDIT_DISPLAY_NAMES), browser.NODE_SEARCH_INPUT], timeout=15_000).json_value()
    assert SHARDDIT_DISPLAY_NAMES <= set(found), found
    ui.locator("[role=option]", has_text="Load VAE").filter(has_text="ShardDiT").first.hover()
    ui.wait_for_selector(browser.NODE_PREVIEW, timeout=5000)
    preview = ui.locator(browser.NODE_PREVIEW).first.inner_text()
    assert "undefined" not in preview and "vae_name" in preview, preview
    browser.screenshot(ui, shots / "node_search.png")
    ui.keyboard.press("Escape")


def _empty_spot(state):
    """A point of the window over empty canvas (no node, no group)."""
    boxes = [browser.to_screen(state, b) for b in [g["bounding"] for g in state["groups"]]
             + [n["bounding"] for n in state["nodes"]]]
    for y in range(950, 150, -50):
        for x in range(150, 1300, 50):
            if not any(browser.overlaps([x - 5, y - 5, 10, 10], b) for b in boxes):
                return x, y
    raise AssertionError("no empty canvas to double-click")


def test_template_browser_offers_the_ui_workflows_with_thumbnails(ui, shots, comfy_server):
    """Templates -> Custom Nodes -> sharddit: every UI workflow, each card with its JPEG; no API twin."""
    everything = sorted(UI_FILES)
    assert sorted(comfy_server._get("/workflow_templates")["sharddit"]) == everything
    thumbs = {}
    ui.on("response", lambda r: "/workflow_templates/sharddit/" in r.url and thumbs.setdefault(r.url.split("/")[-1], r.status))
    ui.keyboard.press("Escape")
    ui.get_by_role("button", name="Templates").first.click()
    ui.get_by_text("sharddit", exact=True).first.click()
    names = everything
    ui.wait_for_function("(names) => names.every(n => document.querySelector('[role=dialog]')?.innerText.includes(n))",
                         arg=names, timeout=15_000)
    # a card fetches its picture when scrolled into view (the 1.27 dialog shows six, and drops those it
    # scrolls away from): wheel down the grid until every picture was fetched, then back up
    ui.mouse.move(950, 700)
    for _ in range(60):
        if all(f"{n}.jpg" in thumbs for n in names):
            break
        ui.mouse.wheel(0, 400)
        ui.wait_for_timeout(250)
    ui.mouse.wheel(0, -10_000)
    ui.wait_for_timeout(500)
    text = ui.evaluate("() => document.querySelector('[role=dialog]').innerText")
    browser.screenshot(ui, shots / "templates.png")
    ui.keyboard.press("Escape")
    assert "_api" not in text, "an API twin is offered as a template"
    assert {n: thumbs.get(f"{n}.jpg") for n in names} == {n: 200 for n in names}, thumbs
