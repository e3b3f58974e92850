// ShardDiT: show the Placement Plan (ShardDiT) node's text table in the node, under its widgets.
// The node's picture comes through ComfyUI's own image preview; text needs a display of its own
// (the frontend shows text only for nodes that ship one, as core's Preview Any does).
// The server sends the table as `text` in the node's UI output (nodes/debug_nodes.py).
import { app } from "../../scripts/app.js";
import { ComfyWidgets } from "../../scripts/widgets.js";

const NODE = "ShardDiTPlan";
const WIDGET = "plan_text";
const TEXT_MIN_HEIGHT = 190; // px at 100 % zoom: about 13 lines of the table

function showPlanText(node, text) {
  let widget = node.widgets?.find((w) => w.name === WIDGET);
  if (!widget) {
    widget = ComfyWidgets.STRING(node, WIDGET, ["STRING", { multiline: true }], app).widget;
    widget.serialize = false; // shown only: never saved in the workflow nor sent to the server
    // room for the summary and the device rows; the picture under it takes the rest of the node
    if (widget.options) widget.options.getMinHeight = () => TEXT_MIN_HEIGHT;
    const el = widget.element ?? widget.inputEl;
    if (el) {
      el.readOnly = true;
      el.style.fontFamily = "monospace";
      el.style.fontSize = "11px";
      el.style.whiteSpace = "pre-wrap"; // table rows fit the node; longer sentences wrap, none is cut off
      el.style.overflow = "auto";
      el.dataset.sharddit = "plan-text";
    }
  }
  widget.value = text;
  node.setDirtyCanvas(true, true);
}

app.registerExtension({
  name: "ShardDiT.PlanText",
  async beforeRegisterNodeDef(nodeType, nodeData) {
    if (nodeData.name !== NODE) return;
    const onExecuted = nodeType.prototype.onExecuted;
    nodeType.prototype.onExecuted = function (message) {
      onExecuted?.apply(this, arguments);
      const text = message?.text;
      if (text?.length) showPlanText(this, Array.isArray(text) ? text.join("\n") : String(text));
    };
  },
});
