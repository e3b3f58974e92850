"""Room on the canvas for an inserted node: what moves down, which groups grow.

A UI node covers ``[x, y - TITLE_H, w, h + TITLE_H]`` (its ``pos`` is the top of its body, the
title bar sits above). Inserting a box under an anchor node pushes down everything below the
anchor that shares columns with what moves (a fixed point: a wide node pushed down pushes the
nodes under it in its own columns too), groups included; a group that holds the anchor grows to
keep the new node inside. Relative positions among moved items are unchanged, so nothing that did
not overlap before overlaps after.
"""
from __future__ import annotations

import copy

TITLE_H = 30          # the title bar above a node's pos
GAP = 20              # between the anchor's bottom and the inserted node's title bar
GROUP_PAD = 10        # a grown group's margin under the inserted node


def xy(node: dict) -> tuple:
    pos = node.get("pos") or [0, 0]
    return (pos["0"], pos["1"]) if isinstance(pos, dict) else (pos[0], pos[1])


def set_xy(node: dict, x, y) -> None:
    if isinstance(node.get("pos"), dict):
        node["pos"] = {"0": x, "1": y}
    else:
        node["pos"] = [x, y]


def node_box(node: dict) -> tuple:
    """``(x, top, w, h)`` the node covers, title bar included."""
    x, y = xy(node)
    size = node.get("size") or [200, 60]
    w, h = (size["0"], size["1"]) if isinstance(size, dict) else (size[0], size[1])
    return (x, y - TITLE_H, w, h + TITLE_H)


def group_box(group: dict) -> tuple:
    return tuple(group.get("bounding") or (0, 0, 0, 0))


def _x_overlap(a: tuple, b: tuple) -> bool:
    return a[0] < b[0] + b[2] and b[0] < a[0] + a[2]


def _inside(box: tuple, group: tuple) -> bool:
    """A node belongs to a group when its centre lies in the group's rectangle."""
    cx, cy = box[0] + box[2] / 2, box[1] + box[3] / 2
    return group[0] <= cx <= group[0] + group[2] and group[1] <= cy <= group[1] + group[3]


def make_room(graph: dict, anchor: dict, new_box: tuple) -> dict:
    """Move what lies under ``anchor`` so that ``new_box`` (under the anchor) overlaps nothing;
    grow the groups that hold the anchor. Returns what was done (``moved`` node ids, ``groups``
    moved and ``grown`` by index, ``dy``) so that ``undo_room`` can put everything back."""
    a = node_box(anchor)
    top = a[1]   # "below": starting lower than the anchor's top (a node tucked under its bottom edge moves too)
    nodes = [n for n in graph["nodes"] if n is not anchor]
    groups = list(enumerate(graph.get("groups") or []))
    below = [("n", n["id"], node_box(n)) for n in nodes if node_box(n)[1] > top]
    below += [("g", i, group_box(g)) for i, g in groups if group_box(g)[1] > top]
    moving = {(k, i) for k, i, box in below if _x_overlap(box, new_box)}
    changed = True
    while changed:   # the fixed point: whatever sits under a moving item in its columns moves too
        changed = False
        for k, i, box in below:
            if (k, i) in moving:
                continue
            if any(_x_overlap(box, mb) and box[1] >= mb[1] for mk, mi, mb in below if (mk, mi) in moving):
                moving.add((k, i))
                changed = True
        for k, i, box in below:   # the nodes of a moving group go with it
            if k == "g" and (k, i) in moving:
                for n in nodes:
                    if ("n", n["id"]) not in moving and _inside(node_box(n), box) and node_box(n)[1] > top:
                        moving.add(("n", n["id"]))
                        changed = True
    tops = [box[1] for k, i, box in below if (k, i) in moving]
    need = new_box[1] + new_box[3] + GAP
    dy = max(0, need - min(tops)) if tops else 0
    # the original values are kept (not dy): putting them back is exact, floats included
    record = {"dy": dy, "nodes": {}, "groups": {}}
    if dy:
        for n in nodes:
            if ("n", n["id"]) in moving:
                x, y = xy(n)
                record["nodes"][str(n["id"])] = copy.deepcopy(n["pos"])
                set_xy(n, x, y + dy)
        for i, g in groups:
            if ("g", i) in moving:
                b = list(group_box(g))
                record["groups"][str(i)] = copy.deepcopy(g["bounding"])
                g["bounding"] = [b[0], b[1] + dy, b[2], b[3]]
    for i, g in groups:   # a group holding the anchor keeps the new node inside
        b = group_box(g)
        if ("g", i) not in moving and _inside(a, b):
            grow = new_box[1] + new_box[3] + GROUP_PAD - (b[1] + b[3])
            if grow > 0:
                record["groups"][str(i)] = copy.deepcopy(g["bounding"])
                g["bounding"] = [b[0], b[1], b[2], b[3] + grow]
    return record


def undo_room(graph: dict, record: dict) -> None:
    """Put back what ``make_room`` moved or grew (nodes by id, groups by index, where still there)."""
    saved = record.get("nodes") or {}
    for n in graph["nodes"]:
        if str(n["id"]) in saved:
            n["pos"] = copy.deepcopy(saved[str(n["id"])])
    groups = graph.get("groups") or []
    for i, bounding in (record.get("groups") or {}).items():
        if int(i) < len(groups):
            groups[int(i)]["bounding"] = copy.deepcopy(bounding)
