"""Host syncs of the distributed exchange, counted on CPU (pure torch).

``ulysses_rank_as_gpu`` runs ``dist_procs.ulysses_rank`` (one rank of a gloo group, Ulysses
attention through ``DistExchange``) with the rank's tensors taken for GPU tensors by the wire
(``wire._on_gpu``), so the gloo path stages them as it would on a GPU. It counts, and writes
beside the rank's result (``<out>.syncs.json``): ``host_sync`` calls (the path's one host wait),
host buffers asked for and whether page-locked, and every call inside ``all_to_all`` that would
copy to the host or read a tensor there on a GPU (``Tensor.to``, ``cpu``, ``item``, ``tolist``).
"""
from __future__ import annotations

import json
import threading

import torch

from harness import dist_procs
from sharddit.parallel.distributed import wire
from sharddit.parallel.distributed.exchange import DistExchange

_READS = ("to", "cpu", "item", "tolist")


class _Event:
    def synchronize(self):
        pass


def _counted(real, name: str, reads: dict, inside):
    def read(self, *args, **kwargs):
        if getattr(inside, "on", False):
            reads[name] = reads.get(name, 0) + 1
        return real(self, *args, **kwargs)
    return read


def ulysses_rank_as_gpu(rank, world, port, tokens, heads, head_dim, out_path):
    counts = {"host_sync": 0, "buffers": [], "reads": {}, "calls": 0}
    inside = threading.local()
    wire._on_gpu = lambda device: True
    wire._record = lambda device: _Event()
    real_buffer, real_sync = wire._host_buffer, wire.host_sync

    def host_buffer(nbytes, pinned):
        counts["buffers"].append(bool(pinned))
        return real_buffer(nbytes, False)  # no page-locking without CUDA

    def host_sync(event):
        counts["host_sync"] += 1
        real_sync(event)

    wire._host_buffer, wire.host_sync = host_buffer, host_sync
    for name in _READS:
        setattr(torch.Tensor, name, _counted(getattr(torch.Tensor, name), name, counts["reads"], inside))
    real_all_to_all = DistExchange.all_to_all

    def all_to_all(self, pos, parts, expect=None):
        counts["calls"] += 1
        inside.on = True
        try:
            return real_all_to_all(self, pos, parts, expect)
        finally:
            inside.on = False

    DistExchange.all_to_all = all_to_all
    dist_procs.ulysses_rank(rank, world, port, tokens, heads, head_dim, out_path)
    with open(f"{out_path}.syncs.json", "w") as f:
        json.dump(counts, f)
