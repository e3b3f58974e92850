// ShardDiT: "Shard this workflow for several GPUs (ShardDiT)" and its inverse, as commands of the
// frontend (command list / keybinding panel), in the File menu and in the canvas context menu.
// The transform itself is the pack's Python code (loaders/workflow/shard_transform.py) behind
// POST /api/sharddit/workflow/shard|unshard (loaders/workflow/routes.py): this file only sends the
// open workflow (root graph with its subgraph definitions), loads the answer into the same tab as
// one undo step (Ctrl+Z gives the original back) and shows what changed in a toast.
import { app } from "../../scripts/app.js";
import { api } from "../../scripts/api.js";

const SHARD = { id: "ShardDiT.ShardWorkflow", label: "Shard this workflow for several GPUs (ShardDiT)",
  route: "/sharddit/workflow/shard", icon: "pi pi-server" };
const UNSHARD = { id: "ShardDiT.UnshardWorkflow", label: "Unshard this workflow (ShardDiT)",
  route: "/sharddit/workflow/unshard", icon: "pi pi-undo" };
const TOAST_LIFE = 6000; // ms

function toast(severity, detail) {
  const toasts = app.extensionManager?.toast;
  if (toasts?.add) toasts.add({ severity, summary: "ShardDiT", detail, life: TOAST_LIFE });
  else if (severity === "error") alert(`ShardDiT: ${detail}`);
  else console.log(`[ShardDiT] ${detail}`);
}

function rootGraph() {
  return app.rootGraph ?? app.graph; // rootGraph: frontends with subgraphs (its serialize() holds them)
}

function changeTracker() {
  return app.extensionManager?.workflow?.activeWorkflow?.changeTracker ?? null;
}

function capture(tracker) {
  if (typeof tracker?.captureCanvasState === "function") tracker.captureCanvasState();
  else tracker?.checkState?.();
}

// After a load the frontend still settles the graph while drawing it (a switch node's "*" sockets
// take the type of their links, a video node grows to its preview): wait until five frames in a row
// draw the same graph (at most 90 frames) so that the undo step holds the settled graph, not a
// half-drawn one followed by a second change.
async function settled(tracker) {
  app.canvas?.setDirty?.(true, true);
  let last = null;
  let same = 0;
  for (let i = 0; i < 90 && same < 5; i++) {
    await new Promise((done) => requestAnimationFrame(() => done()));
    const now = structuredClone(rootGraph().serialize());
    same = last && sameGraph(tracker, last, now) ? same + 1 : 0;
    last = now;
  }
}

// Load `graph` into the open tab as one change the tab's undo history holds. The frontend's own undo
// loads a state the same way (loadGraphData into its workflow, with the tracker told it is restoring,
// so that loading does not reset the history); then the tracker records the new graph as a change.
async function loadAsOneChange(graph) {
  const tracker = changeTracker();
  capture(tracker);
  // the graph as it is now is what Ctrl+Z gives back: the tracker's own state lags behind a change
  // it was not told of when it skips the capture (a change of the canvas still open, another
  // extension setting a widget)
  const before = tracker ? structuredClone(rootGraph().serialize()) : null;
  const restoring = tracker && "_restoringState" in tracker;
  if (restoring) tracker._restoringState = true;
  try {
    await app.loadGraphData(graph, false, false, tracker?.workflow ?? null, {
      showMissingModelsDialog: false, showMissingNodesDialog: false, checkForRerouteMigration: false,
      silentAssetErrors: true });
    await settled(tracker);
  } finally {
    if (restoring) tracker._restoringState = false;
  }
  capture(tracker);
  if (tracker && before && !sameGraph(tracker, tracker.undoQueue?.at(-1), before)) {
    // the tracker holds another state under Ctrl+Z (a lagging one, or none: a frontend that reset the
    // history while loading): put the original back on top
    tracker.undoQueue.push(before);
    tracker.activeState = structuredClone(rootGraph().serialize());
    if (tracker.redoQueue) tracker.redoQueue.length = 0;
    tracker.updateModified?.();
    tracker.squashState?.(); // as the tracker's own capture does: the drawing's last settling joins this step
  }
}

function sameGraph(tracker, a, b) {
  if (!a || !b) return false;
  const equal = tracker?.constructor?.graphEqual; // the frontend's own comparison, where it has one
  return typeof equal === "function" ? equal(a, b) : JSON.stringify(a) === JSON.stringify(b);
}

async function transform(command) {
  let answer;
  try {
    const response = await api.fetchApi(command.route, {
      method: "POST", headers: { "Content-Type": "application/json" },
      body: JSON.stringify({ workflow: rootGraph().serialize() }) });
    answer = await response.json().catch(() => ({ error: `the server answered ${response.status} without JSON` }));
    if (!response.ok) throw new Error(answer.error ?? `the server answered ${response.status}`);
  } catch (error) {
    toast("error", `${command.label} failed: ${error.message ?? error}`);
    return;
  }
  if (!answer.added?.length) {
    toast("info", answer.message || answer.reason || "nothing changed");
    return;
  }
  await loadAsOneChange(answer.workflow);
  toast("success", `${answer.message} (Ctrl+Z undoes it)`);
}

const commands = [SHARD, UNSHARD].map((c) => ({ id: c.id, label: c.label, icon: c.icon, function: () => transform(c) }));

function menuItems() {
  return [null, ...[SHARD, UNSHARD].map((c) => ({ content: c.label, callback: () => transform(c) }))];
}

const extension = {
  name: "ShardDiT.ShardWorkflow",
  commands,
  menuCommands: [{ path: ["File"], commands: [SHARD.id, UNSHARD.id] }],
};

if (typeof app.collectCanvasMenuItems === "function") {
  extension.getCanvasMenuItems = () => menuItems(); // frontends with the extension hook for it
} else {
  // older frontends build the canvas menu in LGraphCanvas.getCanvasMenuOptions only
  const LGraphCanvas = globalThis.LGraphCanvas ?? globalThis.LiteGraph?.LGraphCanvas;
  const original = LGraphCanvas?.prototype?.getCanvasMenuOptions;
  if (original) {
    LGraphCanvas.prototype.getCanvasMenuOptions = function () {
      return [...original.apply(this, arguments), ...menuItems()];
    };
  }
}

app.registerExtension(extension);
