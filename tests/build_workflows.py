"""Writes ``workflows/<name>.json`` (UI format) and ``workflows/api/<name>_api.json`` (API format).

``workflows/`` is the pack's template folder (ComfyUI lists its ``*.json`` in Templates → Custom
Nodes, with ``<name>.jpg`` as the card's thumbnail); the API twins live one level down so they are
not offered as templates (the frontend cannot open an API-format file as a workflow).

The committed JSON files are what users drag in; this script only keeps each UI/API pair
consistent. Run it after changing a graph or a ShardDiT node's inputs, then review the diff:

    python tests/build_workflows.py          # rewrite workflows/*.json (no ComfyUI needed)
    python tests/build_workflows.py --check  # exit 1 if the files differ

Widget order comes from the node tables in ``workflow_tools`` (core nodes: ``CORE_NODES``; ours:
``nodes/*.py`` read with ast, falling back to ``CONTRACT`` for a node not written yet). File
names, resolutions, frames, steps, cfg and shifts are the models' published settings; the graphs,
layouts and notes are the pack's own (tests/test_workflows_prose.py checks that no text of core's
installed templates appears in workflows/).

Each UI workflow carries ``extra.sharddit.min_comfyui``, the oldest ComfyUI it needs (the newest
``since`` of its core nodes in ``workflow_tools.CORE_NODES``, or later for a model family that
version lacks).
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from workflow_tools import (CORE_NODES, TITLE_H, WORKFLOWS_DIR, Input, NodeSpec,  # noqa: E402
                            display_name, min_node_height, node_box, sharddit_schemas, write_or_check)

# Inputs of ShardDiT nodes per DESIGN.md, used only for a node whose file does not define it yet.
CONTRACT = {n.node_id: n for n in [
    NodeSpec("ShardDiTLoadDiffusionModel", (
        Input("unet_name", "COMBO", folder="diffusion_models"), Input("weight_dtype", "COMBO"),
        Input("devices", "STRING", default="auto"), Input("reserve_vram_gb", "FLOAT", default=1.0)), (("MODEL", "MODEL"),)),
    NodeSpec("ShardDiTLoadTextEncoder", (
        Input("clip_name", "COMBO", folder="text_encoders"), Input("type", "COMBO"),
        Input("device", "STRING", default="auto")), (("CLIP", "CLIP"),)),
    NodeSpec("ShardDiTLoadVAE", (
        Input("vae_name", "COMBO", folder="vae"), Input("device", "STRING", default="auto")), (("VAE", "VAE"),)),
    NodeSpec("ShardDiTShardModel", (
        Input("model", "MODEL"), Input("devices", "STRING"), Input("reserve_vram_gb", "FLOAT")), (("MODEL", "MODEL"),)),
    NodeSpec("ShardDiTKSampler", (
        Input("model", "MODEL"), Input("seed", "INT", control=True), Input("steps", "INT"), Input("cfg", "FLOAT"),
        Input("sampler_name", "COMBO"), Input("scheduler", "COMBO"), Input("positive", "CONDITIONING"),
        Input("negative", "CONDITIONING"), Input("latent_image", "LATENT"), Input("denoise", "FLOAT"),
        Input("devices", "STRING")), (("LATENT", "LATENT"),)),
    NodeSpec("ShardDiTVAEDecodeTiled", (
        Input("samples", "LATENT"), Input("vae", "VAE"), Input("tile_size", "INT"), Input("overlap", "INT"),
        Input("temporal_size", "INT"), Input("temporal_overlap", "INT"), Input("tile_batch_size", "STRING"),
        Input("devices", "STRING")), (("IMAGE", "IMAGE"),)),
]}

PACK_CNR_ID = "sharddit"
FRONTEND_VERSION = "1.27.10"
GROUP_COLOR = "#3f789e"
GROUP_FONT = 24
# A group's top edge sits this far above its highest node's body: node title bar (30), the node's
# source badge drawn above it (24), the group's title bar (font 24 x 1.4 = 34) and a gap.
GROUP_TOP, GROUP_PAD = 96, 10
# Vertical gaps: between a node and the title bar of the node below it in its group, and between
# two groups. ``Graph._stack`` moves nodes down their column to keep them.
NODE_GAP, GROUP_GAP = 20, 20
TITLE_CHAR_W = 0.55 * GROUP_FONT   # Arial, mixed case: a safe upper bound per character
# The saved view shows the whole graph in a 1600 x 1000 window at a zoom where the frontend still
# draws text (it drops it below about 0.57); view offsets are relative to the canvas. The frontend
# of the workflow's oldest ComfyUI sets the window (x0, y0, x1, y1 inside the canvas, CSS pixels):
# - 0.3.64 (frontend 1.27): the canvas starts right of the side bar (64 px) and below the top bar
#   (78 px): 1536 x 922;
# - 0.29.0: the canvas fills the window; the tabs (to y 38), the side bar (to x 59), the breadcrumb
#   and the Run bar (to y 90) float over it, the minimap over its bottom-right corner (MINIMAP).
# - 0.33.0: as 0.29.0 (the same floating bars and minimap; checked by tests/test_browser_ui.py on it).
WINDOWS = {"0.3.64": (12, 12, 1524, 910), "0.29.0": (70, 96, 1590, 990), "0.33.0": (70, 96, 1590, 990)}
MINIMAP = {"0.29.0": (1335, 735, 1600, 1000), "0.33.0": (1335, 735, 1600, 1000)}
WINDOW = WINDOWS["0.3.64"]
MIN_SCALE, MAX_SCALE = 0.6, 0.8
# Columns of the pipeline (x) and the left column (note and Plan node).
LEFT_X, LEFT_W = -580, 540
HF = "https://huggingface.co"
URLS = {
    "wan2.1_t2v_14B_fp8_scaled.safetensors":
        f"{HF}/Comfy-Org/Wan_2.1_ComfyUI_repackaged/resolve/main/split_files/diffusion_models/wan2.1_t2v_14B_fp8_scaled.safetensors",
    "umt5_xxl_fp8_e4m3fn_scaled.safetensors":
        f"{HF}/Comfy-Org/Wan_2.1_ComfyUI_repackaged/resolve/main/split_files/text_encoders/umt5_xxl_fp8_e4m3fn_scaled.safetensors",
    "wan_2.1_vae.safetensors":
        f"{HF}/Comfy-Org/Wan_2.1_ComfyUI_repackaged/resolve/main/split_files/vae/wan_2.1_vae.safetensors",
    "ltxv-13b-0.9.7-dev.safetensors": f"{HF}/Lightricks/LTX-Video/resolve/main/ltxv-13b-0.9.7-dev.safetensors",
    "t5xxl_fp16.safetensors": f"{HF}/comfyanonymous/flux_text_encoders/resolve/main/t5xxl_fp16.safetensors",
    "hunyuan_video_t2v_720p_bf16.safetensors":
        f"{HF}/Comfy-Org/HunyuanVideo_repackaged/resolve/main/split_files/diffusion_models/hunyuan_video_t2v_720p_bf16.safetensors",
    "clip_l.safetensors": f"{HF}/comfyanonymous/flux_text_encoders/resolve/main/clip_l.safetensors",
    "llava_llama3_fp8_scaled.safetensors":
        f"{HF}/Comfy-Org/HunyuanVideo_repackaged/resolve/main/split_files/text_encoders/llava_llama3_fp8_scaled.safetensors",
    "hunyuan_video_vae_bf16.safetensors":
        f"{HF}/Comfy-Org/HunyuanVideo_repackaged/resolve/main/split_files/vae/hunyuan_video_vae_bf16.safetensors",
    "wan2.2_t2v_high_noise_14B_fp8_scaled.safetensors":
        f"{HF}/Comfy-Org/Wan_2.2_ComfyUI_Repackaged/resolve/main/split_files/diffusion_models/wan2.2_t2v_high_noise_14B_fp8_scaled.safetensors",
    "wan2.2_t2v_low_noise_14B_fp8_scaled.safetensors":
        f"{HF}/Comfy-Org/Wan_2.2_ComfyUI_Repackaged/resolve/main/split_files/diffusion_models/wan2.2_t2v_low_noise_14B_fp8_scaled.safetensors",
    "ltx-2.3-22b-dev-fp8.safetensors": f"{HF}/Lightricks/LTX-2.3-fp8/resolve/main/ltx-2.3-22b-dev-fp8.safetensors",
    "gemma_3_12B_it_fp4_mixed.safetensors":
        f"{HF}/Comfy-Org/ltx-2/resolve/main/split_files/text_encoders/gemma_3_12B_it_fp4_mixed.safetensors",
    "hunyuanvideo1.5_720p_t2v_fp16.safetensors":
        f"{HF}/Comfy-Org/HunyuanVideo_1.5_repackaged/resolve/main/split_files/diffusion_models/hunyuanvideo1.5_720p_t2v_fp16.safetensors",
    "qwen_2.5_vl_7b_fp8_scaled.safetensors":
        f"{HF}/Comfy-Org/HunyuanVideo_1.5_repackaged/resolve/main/split_files/text_encoders/qwen_2.5_vl_7b_fp8_scaled.safetensors",
    "byt5_small_glyphxl_fp16.safetensors":
        f"{HF}/Comfy-Org/HunyuanVideo_1.5_repackaged/resolve/main/split_files/text_encoders/byt5_small_glyphxl_fp16.safetensors",
    "hunyuanvideo15_vae_fp16.safetensors":
        f"{HF}/Comfy-Org/HunyuanVideo_1.5_repackaged/resolve/main/split_files/vae/hunyuanvideo15_vae_fp16.safetensors",
    "kandinsky5lite_t2v_sft_5s.safetensors":
        f"{HF}/kandinskylab/Kandinsky-5.0-T2V-Lite-sft-5s/resolve/main/model/kandinsky5lite_t2v_sft_5s.safetensors",
    # MiniMax H3 (ComfyUI 0.33): Comfy-Org's repackaged files
    "minimax_h3_fl2va_pruned_int8_convrot.safetensors":
        f"{HF}/Comfy-Org/MiniMax-H3/resolve/main/diffusion_models/minimax_h3_fl2va_pruned_int8_convrot.safetensors",
    "qwen3vl_32b_minimax_h3_nvfp4_awq.safetensors":
        f"{HF}/Comfy-Org/MiniMax-H3/resolve/main/text_encoders/qwen3vl_32b_minimax_h3_nvfp4_awq.safetensors",
    "minimax_h3_video_vae_fp16.safetensors":
        f"{HF}/Comfy-Org/MiniMax-H3/resolve/main/vae/minimax_h3_video_vae_fp16.safetensors",
    "minimax_h3_audio_vae_fp32.safetensors":
        f"{HF}/Comfy-Org/MiniMax-H3/resolve/main/vae/minimax_h3_audio_vae_fp32.safetensors",
}
# The pack's own negative prompt for the Wan graphs (and a shorter one for the others).
WAN_NEGATIVE = ("blurry, out of focus, overexposed, washed-out colours, flicker, frozen frame, captions, watermark, "
                "low quality, compression artefacts, malformed hands, extra fingers, distorted face, warped limbs, "
                "crowded background")
SHORT_NEGATIVE = "blurry, low quality, flicker, frozen frame, watermark, captions, distorted face, malformed hands"


def table() -> dict:
    return {**CORE_NODES, **CONTRACT, **sharddit_schemas()}


class Graph:
    """A workflow described once; ``ui()`` and ``api()`` render the two formats."""

    def __init__(self, name: str, uid: str, nodes_table: dict, min_comfyui: str = "0.3.64"):
        self.name = name
        self.uid = uid
        self.min_comfyui = min_comfyui
        self.table = nodes_table
        self.nodes = {}      # id -> dict(type, pos, size, widgets, title, models, control)
        self.links = []      # (link_id, src, src_slot, dst, input_name)
        self.groups = []     # (title, [node ids])

    def node(self, nid, type_, pos, size, title=None, models=(), control="fixed", mode=0, grows_to=None, **widgets):
        """``pos`` is where the node would like to be (``_stack`` may move it down); ``size`` is
        ``(width, None)`` for the height the frontend computes from the widgets, or ``(width, h)`` for a
        node shown taller (text boxes). ``grows_to``: the height a node reaches after a run (Save
        Video's preview), saved at its drawn height (0.33's frontend sets a node with a dynamic combo
        to that on load) with the room below it kept free in its group."""
        spec = self.table.get(type_)
        width, height = size
        if spec is not None:
            names = [i.name for i in spec.widgets]
            unknown = set(widgets) - set(names)
            missing = [i.name for i in spec.widgets if i.name not in widgets and not i.optional]
            if unknown or missing:
                raise ValueError(f"{self.name}: node {nid} {type_}: unknown widgets {sorted(unknown)}, missing {missing}")
            real = min_node_height(spec)
            if height is not None and height < real:
                raise ValueError(f"{self.name}: node {nid} {type_} is {height} px tall, but the frontend draws its "
                                 f"inputs and widgets in {real} px: give it (width, None) or a height >= {real}")
            height = real if height is None else height
        elif height is None:
            raise ValueError(f"{self.name}: node {nid} {type_}: no schema to compute its height from: give one")
        self.nodes[nid] = dict(type=type_, pos=list(pos), size=[width, height], widgets=widgets, title=title,
                               models=list(models), control=control, mode=mode,
                               room=max(0, (grows_to or 0) - height))
        return nid

    def _height(self, nid) -> int:
        """A node's height with the room it grows into (``grows_to``)."""
        return self.nodes[nid]["size"][1] + self.nodes[nid].get("room", 0)

    def note(self, nid, pos, size, text, type_="MarkdownNote"):
        self.nodes[nid] = dict(type=type_, pos=list(pos), size=list(size), widgets={"text": text}, title=None,
                               models=[], control=None, mode=0)

    def link(self, src, src_slot, dst, input_name):
        self.links.append((len(self.links) + 1, src, src_slot, dst, input_name))

    def group(self, title, ids):
        self.groups.append((title, list(ids)))

    # ------------------------------------------------------------------ rendering
    def _order(self) -> list:
        deps = {nid: {src for _, src, _, dst, _ in self.links if dst == nid} for nid in self.nodes}
        order, done = [], set()
        while len(order) < len(self.nodes):
            ready = sorted(n for n in self.nodes if n not in done and deps[n] <= done)
            if not ready:
                raise ValueError(f"{self.name}: cycle in graph")
            order.append(ready[0])
            done.add(ready[0])
        return order

    def _widgets_values(self, nid) -> list:
        node = self.nodes[nid]
        if node["type"] not in self.table:
            return [node["widgets"]["text"]]
        out = []
        for inp in self.table[node["type"]].widgets:
            if inp.name not in node["widgets"]:
                continue
            out.append(node["widgets"][inp.name])
            if inp.control:
                out.append(node["control"])
        return out

    def _group_of(self, nid):
        return next((title for title, ids in self.groups if nid in ids), None)

    def _stack(self) -> None:
        """Moves each node down (never up) until it clears every node above it in its column.

        Nodes are taken in the order of their wished-for ``y``; a node whose x range meets an
        already placed one goes below it: ``NODE_GAP`` under it within a group, a whole group
        title bar and ``GROUP_GAP`` under it when the two nodes are in different groups."""
        placed = []
        for nid in sorted(self.nodes, key=lambda n: (self.nodes[n]["pos"][1], self.nodes[n]["pos"][0])):
            node = self.nodes[nid]
            x, w = node["pos"][0], node["size"][0]
            for other in placed:
                o = self.nodes[other]
                if x >= o["pos"][0] + o["size"][0] + 2 * GROUP_PAD or o["pos"][0] >= x + w + 2 * GROUP_PAD:
                    continue
                same = self._group_of(nid) == self._group_of(other)
                gap = TITLE_H + NODE_GAP if same else GROUP_PAD + GROUP_GAP + GROUP_TOP
                node["pos"][1] = max(node["pos"][1], o["pos"][1] + self._height(other) + gap)
            placed.append(nid)

    def _check_overlaps(self) -> None:
        """No two nodes (title bars included) share a pixel; the rule the tests check too."""
        boxes = {nid: node_box(n, self.table) for nid, n in self.nodes.items()}
        ids = sorted(boxes)
        for i, a in enumerate(ids):
            for b in ids[i + 1:]:
                (ax, ay, aw, ah), (bx, by, bw, bh) = boxes[a], boxes[b]
                if ax < bx + bw and bx < ax + aw and ay < by + bh and by < ay + ah:
                    raise ValueError(f"{self.name}: nodes {a} {boxes[a]} and {b} {boxes[b]} overlap: move one")

    def ui(self) -> dict:
        self._stack()
        self._check_overlaps()
        order = self._order()
        nodes = []
        for nid in sorted(self.nodes):
            node = self.nodes[nid]
            spec = self.table.get(node["type"])
            entry = {"id": nid, "type": node["type"], "pos": node["pos"], "size": node["size"], "flags": {},
                     "order": order.index(nid), "mode": node["mode"]}
            if node["title"]:
                entry["title"] = node["title"]
            if spec is not None:
                inputs = []
                for inp in spec.sockets:
                    link = next((lid for lid, _, _, dst, name in self.links if dst == nid and name == inp.name), None)
                    if link is None and not inp.optional:
                        raise ValueError(f"{self.name}: node {nid} {node['type']}: input {inp.name!r} not linked")
                    inputs.append({"name": inp.name, "type": inp.type, "link": link})
                entry["inputs"] = inputs
                entry["outputs"] = [
                    {"name": name, "type": typ, "slot_index": slot,
                     "links": [lid for lid, src, s, _, _ in self.links if src == nid and s == slot]}
                    for slot, (name, typ) in enumerate(spec.outputs)]
                props = {"Node name for S&R": node["type"],
                         "cnr_id": PACK_CNR_ID if node["type"].startswith("ShardDiT") else "comfy-core"}
            else:
                entry["inputs"], entry["outputs"] = [], []
                props = {}
            if node["models"]:
                props["models"] = [{"name": n, "url": URLS[n], "directory": d} for d, n in node["models"]]
            entry["properties"] = props
            entry["widgets_values"] = self._widgets_values(nid)
            nodes.append(entry)
        links = []
        for lid, src, slot, dst, name in self.links:
            spec_dst = self.table[self.nodes[dst]["type"]]
            dst_slot = [i.name for i in spec_dst.sockets].index(name)
            typ = self.table[self.nodes[src]["type"]].outputs[slot][1]
            links.append([lid, src, slot, dst, dst_slot, typ])
        groups = self._groups()
        return {"id": self.uid, "revision": 0, "last_node_id": max(self.nodes), "last_link_id": len(self.links),
                "nodes": nodes, "links": links, "groups": groups, "config": {},
                "extra": {"ds": self._view(groups), "frontendVersion": FRONTEND_VERSION,
                          "sharddit": {"min_comfyui": self.min_comfyui}},
                "version": 0.4}

    def _groups(self) -> list:
        groups = []
        for gid, (title, ids) in enumerate(self.groups, start=1):
            xs = [self.nodes[i]["pos"][0] for i in ids]
            ys = [self.nodes[i]["pos"][1] for i in ids]
            x2 = [self.nodes[i]["pos"][0] + self.nodes[i]["size"][0] for i in ids]
            y2 = [self.nodes[i]["pos"][1] + self._height(i) for i in ids]
            x, y = min(xs) - GROUP_PAD, min(ys) - GROUP_TOP
            w = max(x2) + GROUP_PAD - x
            if len(title) * TITLE_CHAR_W + 8 > w:
                raise ValueError(f"{self.name}: group title {title!r} (~{len(title) * TITLE_CHAR_W:.0f} px) is wider "
                                 f"than its group ({w} px): shorten it")
            groups.append({"id": gid, "title": title, "bounding": [x, y, w, max(y2) + GROUP_PAD - y],
                           "color": GROUP_COLOR, "font_size": GROUP_FONT, "flags": {}})
        return groups

    def _view(self, groups) -> dict:
        """Zoom and offset that show every group and node inside the window of the workflow's
        frontend (``WINDOWS``, centred), clear of its minimap."""
        boxes = [g["bounding"] for g in groups] + [
            [n["pos"][0], n["pos"][1] - 54, n["size"][0], n["size"][1] + 54] for n in self.nodes.values()]
        x0, y0 = min(b[0] for b in boxes), min(b[1] for b in boxes)
        x1, y1 = max(b[0] + b[2] for b in boxes), max(b[1] + b[3] for b in boxes)
        wx0, wy0, wx1, wy1 = WINDOWS[self.min_comfyui]
        scale = min(MAX_SCALE, (wx1 - wx0) / (x1 - x0), (wy1 - wy0) / (y1 - y0))
        if scale < MIN_SCALE:
            raise ValueError(f"{self.name}: the graph ({x1 - x0}x{y1 - y0}) needs zoom {scale:.2f} to fit a 1600x1000 "
                             f"window; the frontend drops text below {MIN_SCALE}: make it smaller")
        scale = round(scale, 3)
        ox = (wx0 + (wx1 - wx0 - (x1 - x0) * scale) / 2) / scale - x0
        oy = (wy0 + (wy1 - wy0 - (y1 - y0) * scale) / 2) / scale - y0
        if self.min_comfyui in MINIMAP:
            mx0, my0, mx1, my1 = MINIMAP[self.min_comfyui]
            for bx, by, bw, bh in boxes:
                sx0, sy0, sx1, sy1 = ((bx + ox) * scale, (by + oy) * scale, (bx + bw + ox) * scale, (by + bh + oy) * scale)
                if sx0 < mx1 and mx0 < sx1 and sy0 < my1 and my0 < sy1:
                    raise ValueError(f"{self.name}: the box {[bx, by, bw, bh]} lies under the minimap at the saved view "
                                     f"({[round(v) for v in (sx0, sy0, sx1, sy1)]} on screen): make the right column shorter")
        return {"scale": scale, "offset": [round(ox, 1), round(oy, 1)]}

    def api(self) -> dict:
        out = {}
        for nid in sorted(self.nodes):
            node = self.nodes[nid]
            spec = self.table.get(node["type"])
            if spec is None or node["mode"] != 0:
                continue
            inputs = {}
            for inp in spec.inputs:
                if inp.name in node["widgets"]:
                    inputs[inp.name] = node["widgets"][inp.name]
                    continue
                link = next(((src, slot) for _, src, slot, dst, name in self.links
                             if dst == nid and name == inp.name), None)
                if link is not None:
                    inputs[inp.name] = [str(link[0]), link[1]]
            for name, source in spec.extra.get("api_also", {}).items():  # 0.33's SaveVideo "format.codec"
                if source in inputs:
                    inputs[name] = inputs[source]
            out[str(nid)] = {"inputs": inputs, "class_type": node["type"],
                             "_meta": {"title": node["title"] or display_name(spec)}}
        return out


# ----------------------------------------------------------------------------- notes
def files_note(title: str, files: list, extra: str = "") -> str:
    """Markdown: which files, where they go (a tree of ComfyUI/models)."""
    lines = [f"## {title} on 2 GPUs (ShardDiT)", "",
             "Every `devices`/`device` input is `auto`: ShardDiT reads the free VRAM of each GPU and places the "
             "text encoder, the DiT blocks (split over the GPUs) and the VAE. `python custom_nodes/sharddit plan` "
             "prints the plan before you download anything.", "",
             "The groups are numbered in the order the graph runs: ShardDiT's loaders place the models on your "
             "GPUs, the DiT's blocks run sharded over them, the decoder batches VAE tiles over them.", "",
             "**Model files**", ""]
    for folder, name in files:
        lines.append(f"- [{name}]({URLS[name]}) → `models/{folder}/`")
    lines += ["", "```", "ComfyUI/", "└── models/"]
    folders = sorted({f for f, _ in files})
    for i, folder in enumerate(folders):
        last = i == len(folders) - 1
        lines.append(f"    {'└' if last else '├'}── {folder}/")
        names = sorted(n for f, n in files if f == folder)
        for j, name in enumerate(names):
            lines.append(f"    {' ' if last else '│'}   {'└' if j == len(names) - 1 else '├'}── {name}")
    lines.append("```")
    if extra:
        lines += ["", extra]
    return "\n".join(lines)


def decode_nodes(g: Graph, first_id: int, x: int, samples_src, vae_src, fps, prefix, tile=(512, 64, 64, 8)):
    dec, vid, save = first_id, first_id + 1, first_id + 2
    g.node(dec, "ShardDiTVAEDecodeTiled", (x, 0), (360, None), tile_size=tile[0], overlap=tile[1],
           temporal_size=tile[2], temporal_overlap=tile[3], tile_batch_size="auto", devices="auto")
    g.link(*samples_src, dec, "samples")
    g.link(*vae_src, dec, "vae")
    # 102 px, not 0.3.64's 78: ComfyUI 0.29 adds CreateVideo's optional `bit_depth` widget (one more
    # 24 px row) and its frontend would grow the node over Save Video; a taller saved node is never shrunk.
    g.node(vid, "CreateVideo", (x, 300), (360, CREATE_VIDEO_H), fps=fps)
    g.link(dec, 0, vid, "images")
    g.node(save, "SaveVideo", (x, 430), (360, None), grows_to=470, filename_prefix=prefix, format="auto", codec="auto")
    g.link(vid, 0, save, "video")
    return dec, vid, save


CREATE_VIDEO_H = 102

PLAN_NOTE = ("**Will it fit?** Placement Plan (ShardDiT), below, is muted: select it, press Ctrl+M, then Run. "
             "It draws your GPUs and where the model goes (a dry run: no weights needed). Imagined GPUs: devices "
             "'cuda:0=16GiB,cuda:1=16GiB'.")


def custom_sampler(g: Graph, nid: int, pos, noise, guider, sampler, sigmas, latent):
    """Core's SamplerCustomAdvanced at ``pos``, fed by the (node, slot) sources given."""
    g.node(nid, "SamplerCustomAdvanced", pos, (320, None))
    for src, name in ((noise, "noise"), (guider, "guider"), (sampler, "sampler"), (sigmas, "sigmas"),
                      (latent, "latent_image")):
        g.link(src[0], src[1], nid, name)


def plan_node(g: Graph, nid: int, model: str, width: int, height: int, frames: int, dtype: str, cfg: float,
              batch="auto"):
    """A muted ShardDiTPlan below the files note, set to this workflow's model, video size and cfg."""
    g.node(nid, "ShardDiTPlan", (LEFT_X, 580), (LEFT_W, 780), title="Placement Plan (ShardDiT) - un-mute to check",
           mode=2, devices="auto", model=model, width=width, height=height, frames=frames, batch=batch,
           dtype=dtype, reserve_vram_gb=1.0, parallel="auto", cfg=cfg, gpu="", link_gbps=0.0)
    g.group("0 - Will it fit? (optional)", [nid])


def files_note_node(g: Graph, nid: int, text: str):
    g.note(nid, (LEFT_X, -60), (LEFT_W, 520), text)


# ----------------------------------------------------------------------------- graphs
def wan21_t2v(t) -> Graph:
    g = Graph("wan2.1_t2v_14B_2gpu", "5c1f0d2e-2a0b-4a5e-9a71-3f1c0b0e2101", t)
    files = [("diffusion_models", "wan2.1_t2v_14B_fp8_scaled.safetensors"),
             ("text_encoders", "umt5_xxl_fp8_e4m3fn_scaled.safetensors"), ("vae", "wan_2.1_vae.safetensors")]
    g.node(1, "ShardDiTLoadDiffusionModel", (0, 0), (400, None), models=[files[0]],
           unet_name=files[0][1], weight_dtype="default", devices="auto", reserve_vram_gb=1.0,
           parallel="auto")
    g.node(2, "ShardDiTLoadTextEncoder", (0, 180), (400, None), models=[files[1]],
           clip_name=files[1][1], type="wan", device="auto")
    g.node(3, "ShardDiTLoadVAE", (0, 340), (400, None), models=[files[2]], vae_name=files[2][1], device="auto")
    g.node(4, "EmptyHunyuanLatentVideo", (0, 550), (400, None), width=832, height=480, length=81, batch_size=1)
    g.node(5, "CLIPTextEncode", (440, 0), (400, 180), title="Positive prompt",
           text="A red fox trotting through fresh snow in a winter forest at sunrise, breath steaming, "
                "tracking shot, cinematic lighting, highly detailed fur")
    g.node(6, "CLIPTextEncode", (440, 230), (400, 180), title="Negative prompt", text=WAN_NEGATIVE)
    g.link(2, 0, 5, "clip")
    g.link(2, 0, 6, "clip")
    g.node(7, "ModelSamplingSD3", (880, 0), (330, None), shift=8.0)
    g.link(1, 0, 7, "model")
    g.node(8, "ShardDiTKSampler", (880, 110), (330, None), seed=42, steps=30, cfg=6.0, sampler_name="uni_pc",
           scheduler="simple", denoise=1.0, devices="auto", parallel="auto")
    g.link(7, 0, 8, "model")
    g.link(5, 0, 8, "positive")
    g.link(6, 0, 8, "negative")
    g.link(4, 0, 8, "latent_image")
    decode_nodes(g, 9, 1250, (8, 0), (3, 0), 16.0, "video/sharddit_wan2.1_t2v_14B")
    files_note_node(g, 12, files_note("Wan 2.1 T2V 14B, 832×480, 81 frames", files, WAN21_NOTE + "\n\n" + PLAN_NOTE))
    plan_node(g, 13, "wan2.1-t2v-14b", 832, 480, 81, "fp8", 6.0)
    g.group("1 - Load models (ShardDiT)", [1, 2, 3])
    g.group("2 - Video size", [4])
    g.group("3 - Prompt", [5, 6])
    g.group("4 - Sample", [7, 8])
    g.group("5 - Decode and save", [9, 10, 11])
    return g


def ltxv_t2v(t) -> Graph:
    g = Graph("ltxv_13b_t2v_2gpu", "5c1f0d2e-2a0b-4a5e-9a71-3f1c0b0e2303", t)
    files = [("checkpoints", "ltxv-13b-0.9.7-dev.safetensors"), ("text_encoders", "t5xxl_fp16.safetensors")]
    g.node(1, "CheckpointLoaderSimple", (0, 0), (400, None), title="LTX-Video 13B (DiT + VAE)", models=[files[0]],
           ckpt_name=files[0][1])
    g.node(2, "ShardDiTShardModel", (0, 150), (400, None), devices="auto", reserve_vram_gb=1.0, parallel="auto")
    g.link(1, 0, 2, "model")
    g.node(3, "ShardDiTLoadTextEncoder", (0, 310), (400, None), models=[files[1]],
           clip_name=files[1][1], type="ltxv", device="auto")
    g.node(4, "EmptyLTXVLatentVideo", (0, 540), (400, None), width=768, height=512, length=97, batch_size=1)
    g.node(5, "CLIPTextEncode", (440, 0), (400, 200), title="Positive prompt",
           text="A woman in a yellow raincoat walks along a wet city street at night. Neon signs reflect in the "
                "puddles around her boots and rain falls through the light of the street lamps. The camera "
                "follows her from the side at walking pace, her face lit in soft pink and blue light. The scene "
                "is realistic, cinematic, with shallow depth of field.")
    g.node(6, "CLIPTextEncode", (440, 250), (400, 160), title="Negative prompt",
           text="low quality, worst quality, deformed, distorted, disfigured, motion smear, motion artifacts, "
                "fused fingers, bad anatomy, weird hand, ugly")
    g.link(3, 0, 5, "clip")
    g.link(3, 0, 6, "clip")
    g.node(7, "LTXVConditioning", (440, 460), (300, None), frame_rate=25.0)
    g.link(5, 0, 7, "positive")
    g.link(6, 0, 7, "negative")
    g.node(8, "LTXVScheduler", (880, 0), (320, None), steps=30, max_shift=2.05, base_shift=0.95, stretch=True,
           terminal=0.1)
    g.link(4, 0, 8, "latent")
    g.node(9, "KSamplerSelect", (880, 210), (320, None), sampler_name="euler")
    g.node(10, "SamplerCustom", (880, 320), (320, None), add_noise=True, noise_seed=42, cfg=3.0)
    g.link(2, 0, 10, "model")
    g.link(7, 0, 10, "positive")
    g.link(7, 1, 10, "negative")
    g.link(9, 0, 10, "sampler")
    g.link(8, 0, 10, "sigmas")
    g.link(4, 0, 10, "latent_image")
    decode_nodes(g, 11, 1240, (10, 0), (1, 2), 24.0, "video/sharddit_ltxv_13b_t2v")
    files_note_node(g, 14, files_note(
        "LTX-Video 13B T2V, 768×512, 97 frames", files,
        "The LTX-Video checkpoint holds the DiT and the VAE: core's Load Checkpoint reads it from "
        "`models/checkpoints/`, **Shard DiT Blocks (ShardDiT)** spreads its blocks over the GPUs. Its "
        "VAE feeds the tiled decode. LTX-Video needs long, descriptive prompts.\n\n" + LTXV_NOTE + "\n\n" + PLAN_NOTE))
    plan_node(g, 15, "ltxv-13b", 768, 512, 97, "bf16", 3.0)
    g.group("1 - Load models (ShardDiT)", [1, 2, 3])
    g.group("2 - Video size", [4])
    g.group("3 - Prompt", [5, 6, 7])
    g.group("4 - Sample", [8, 9, 10])
    g.group("5 - Decode and save", [11, 12, 13])
    return g


def hunyuan_t2v(t) -> Graph:
    g = Graph("hunyuan_video_t2v_2gpu", "5c1f0d2e-2a0b-4a5e-9a71-3f1c0b0e2404", t)
    files = [("diffusion_models", "hunyuan_video_t2v_720p_bf16.safetensors"),
             ("text_encoders", "clip_l.safetensors"), ("text_encoders", "llava_llama3_fp8_scaled.safetensors"),
             ("vae", "hunyuan_video_vae_bf16.safetensors")]
    g.node(1, "ShardDiTLoadDiffusionModel", (0, 0), (400, None), models=[files[0]],
           unet_name=files[0][1], weight_dtype="default", devices="auto", reserve_vram_gb=1.0,
           parallel="auto")
    g.node(2, "DualCLIPLoader", (0, 180), (400, None), models=[files[1], files[2]],
           clip_name1=files[1][1], clip_name2=files[2][1], type="hunyuan_video", device="default")
    g.node(3, "ShardDiTLoadVAE", (0, 360), (400, None), models=[files[3]], vae_name=files[3][1], device="auto")
    g.node(4, "EmptyHunyuanLatentVideo", (0, 560), (400, None), width=848, height=480, length=73, batch_size=1)
    g.node(5, "CLIPTextEncode", (440, 0), (400, 180), title="Prompt",
           text="anime style, a girl with long silver hair and a red scarf running along a snowy mountain ridge "
                "at dusk, the camera tracking beside her, snow blowing in the wind, vivid colours")
    g.link(2, 0, 5, "clip")
    g.node(6, "FluxGuidance", (440, 230), (320, None), guidance=6.0)
    g.link(5, 0, 6, "conditioning")
    g.node(7, "ModelSamplingSD3", (880, 0), (320, None), shift=7.0)
    g.link(1, 0, 7, "model")
    g.node(8, "RandomNoise", (880, 110), (320, None), noise_seed=42)
    g.node(9, "BasicGuider", (880, 240), (320, None))
    g.link(7, 0, 9, "model")
    g.link(6, 0, 9, "conditioning")
    g.node(10, "KSamplerSelect", (880, 340), (320, None), sampler_name="euler")
    g.node(11, "BasicScheduler", (880, 450), (320, None), scheduler="simple", steps=20, denoise=1.0)
    g.link(1, 0, 11, "model")
    custom_sampler(g, 12, (880, 610), noise=(8, 0), guider=(9, 0), sampler=(10, 0), sigmas=(11, 0), latent=(4, 0))
    decode_nodes(g, 13, 1240, (12, 0), (3, 0), 24.0, "video/sharddit_hunyuan_video_t2v", tile=(256, 64, 64, 8))
    files_note_node(g, 16, files_note(
        "HunyuanVideo T2V 720p model, 848×480, 73 frames", files,
        "HunyuanVideo's two text encoders load through core's DualCLIPLoader (ShardDiT's text encoder "
        "loader takes one file). Guidance is distilled: FluxGuidance 6, no negative prompt.\n\n" + HY_NOTE + "\n\n"
        + PLAN_NOTE))
    plan_node(g, 17, "hunyuanvideo-13b", 848, 480, 73, "bf16", 1.0, batch="1")
    g.group("1 - Load models (ShardDiT)", [1, 2, 3])
    g.group("2 - Video size", [4])
    g.group("3 - Prompt", [5, 6])
    g.group("4 - Sample", [7, 8, 9, 10, 11, 12])
    g.group("5 - Decode and save", [13, 14, 15])
    return g


# VRAM per GPU and the mode `auto` picks: `plan` on ComfyUI 0.29.0 (workflows/README.md has the commands).
WAN21_NOTE = (
    "**VRAM per GPU** (`plan`, two 16 GiB cards, fp8): cuda:0 6.8 GiB weights + 2.7 activations + 0.7 "
    "prefetch, cuda:1 6.5 + 2.7 + 0.7; one 16 GiB card is short (18.6 GiB). `parallel` `auto` picks "
    "**sequence** (cond and uncond each on its own GPU: 1.99× one GPU predicted).")
LTXV_NOTE = (
    "**VRAM per GPU** (`plan`, two 16 GiB cards, bf16): cuda:0 12.3 GiB weights + 0.6 activations + 1.0 "
    "prefetch, cuda:1 12.0 + 0.5 + 1.0; one card is short (25.2 GiB). `parallel` `auto` picks **sequence** "
    "(1.53× one GPU predicted; streaming the weights bounds it).")
HY_NOTE = (
    "**VRAM per GPU** (`plan`, two 24 GiB cards, bf16, batch 1): cuda:0 12.1 GiB weights + 1.8 activations "
    "+ 1.8 prefetch, cuda:1 11.8 + 1.8 + 1.3; one 24 GiB card is short (26.2 GiB). `parallel` `auto` picks "
    "**sequence** (the video's tokens split over the GPUs: 1.70× one GPU predicted).")


def graphs() -> list:
    """Every workflow's builder: the three above and the 2026 families' (``workflow_graphs_2026``)."""
    from workflow_graphs_2026 import GRAPHS_2026

    return [wan21_t2v, ltxv_t2v, hunyuan_t2v, *GRAPHS_2026]


def dumps(obj) -> str:
    return json.dumps(obj, indent=2, ensure_ascii=False) + "\n"


def render_all(out_dir: Path = WORKFLOWS_DIR) -> dict:
    """``{path: text}`` of every workflow file."""
    t = table()
    files = {}
    for build in graphs():
        g = build(t)
        files[out_dir / f"{g.name}.json"] = dumps(g.ui())
        files[out_dir / "api" / f"{g.name}_api.json"] = dumps(g.api())
    return files


def main(argv) -> int:
    return write_or_check(render_all(), argv, "workflows")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
