"""Every collective a process posts, recorded, and the check that all processes' orders agree (pure torch).

``record_collectives(path, delay)`` wraps ``torch.distributed.broadcast`` and
``all_to_all_single`` in this process (the pack calls them as ``dist.<name>``): each post is
appended, in posting order, to a list (and as a JSON line to ``path``, for a member's rank actor:
``dist_toys`` starts it there when the node's ``SHARDDIT_TEST_RECORD_DIR`` is set), as ``{"op",
"group", "ranks", "bytes"}``; ``delay(op, group_ranks, count)`` (seconds) holds a post back first,
so a test can make one thread slow.

``order_faults(logs)``: what NCCL would not promise to run. The ``n``-th post on a process group
is one collective for every member (that is how communicators match); it must be the same
operation and size on each, and the processes' posting orders must fit one global order: the
graph "posted before, on some process" between collectives has no cycle.
"""
from __future__ import annotations

import json
import threading
import time

import torch.distributed as dist


def record_collectives(path=None, delay=None) -> list:
    originals = {"broadcast": dist.broadcast, "all_to_all_single": dist.all_to_all_single}
    log, lock, counts = Recorded(originals), threading.Lock(), {}

    def wrap(op, size_of):
        def posted(*args, **kwargs):
            group = kwargs.get("group") or dist.group.WORLD
            ranks = dist.get_process_group_ranks(group)
            key = (op, group.group_name)
            with lock:
                counts[key] = count = counts.get(key, 0) + 1
            if delay is not None:
                time.sleep(delay(op, ranks, count))
            with lock:
                entry = {"op": op, "group": group.group_name, "ranks": ranks, "bytes": size_of(args, kwargs)}
                log.append(entry)
                if path is not None:
                    with open(path, "a") as f:
                        f.write(json.dumps(entry) + "\n")
                return originals[op](*args, **kwargs)
        return posted

    dist.broadcast = wrap("broadcast", lambda a, k: a[0].numel() * a[0].element_size())
    dist.all_to_all_single = wrap("all_to_all_single", lambda a, k: a[1].numel() * a[1].element_size())
    return log


class Recorded(list):
    """The posts of this process; ``restore()`` puts torch.distributed's functions back."""

    def __init__(self, originals):
        super().__init__()
        self._originals = originals

    def restore(self) -> None:
        for name, fn in self._originals.items():
            setattr(dist, name, fn)


def read_log(path) -> list:
    try:
        with open(path) as f:
            return [json.loads(line) for line in f if line.strip()]
    except FileNotFoundError:
        return []


def order_faults(logs: dict) -> list[str]:
    """``logs``: process label -> its posts in order. Empty when NCCL could run them all."""
    faults, nodes, edges, members = [], {}, {}, {}
    for proc, entries in logs.items():
        seen, prev = {}, None
        for e in entries:
            n = seen[e["group"]] = seen.get(e["group"], -1) + 1
            node = (e["group"], n)
            what = (e["op"], e["bytes"] if e["op"] == "broadcast" else None)  # an all-to-all's splits differ
            if nodes.setdefault(node, what) != what:
                faults.append(f"{proc}: post {n} on group {e['group']} {e['ranks']} is {what}, another member's "
                              f"is {nodes[node]}")
            members.setdefault(node, set()).add(proc)
            edges.setdefault(node, set())
            if prev is not None:
                edges[prev].add(node)
            prev = node
    for node, procs in members.items():
        expected = {p for p, entries in logs.items() if any(e["group"] == node[0] for e in entries)}
        if procs != expected:
            faults.append(f"collective {node} posted by {sorted(procs)} only, not by {sorted(expected - procs)}")
    faults += [f"posting orders form a cycle: {' -> '.join(map(str, c))}" for c in _cycles(edges)[:1]]
    return faults


def _cycles(edges: dict) -> list:
    """One cycle of the graph, if any (depth-first search)."""
    state, stack = {}, []

    def visit(n):
        state[n] = 1
        stack.append(n)
        for m in sorted(edges.get(n, ())):
            if state.get(m) == 1:
                return stack[stack.index(m):] + [m]
            if m not in state:
                found = visit(m)
                if found:
                    return found
        stack.pop()
        state[n] = 2
        return None

    for n in sorted(edges):
        if n not in state:
            found = visit(n)
            if found:
                return [found]
    return []
