"""``DistExchange``: the all-to-all of ``seq_workers.ThreadExchange`` across processes (pure PyTorch).

Same call as the in-process exchange, ``all_to_all(pos, parts) -> list`` (what every position
sent this one, in position order, on this rank's device), but the positions of a batch group live
in different processes: one ``all_to_all_single`` of fixed-size headers (dtypes, shapes), then one
of the raw bytes (``dist_wire``), on the group's own process group (gloo on CPU, NCCL between
GPUs). Bytes are sent as they are, so a split forward stays bit-identical to the local one.

A failure (a peer died, or did not answer within the group's timeout) raises ``DistPeerError``
naming every remote peer of the group, so the user learns which worker to look at.
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from .dist_wire import HEADER, pack_parts, part_sizes, unpack_parts

__all__ = ["DistExchange", "DistPeerError"]


class DistPeerError(RuntimeError):
    """A torch.distributed operation with remote ranks failed or timed out."""


class DistExchange:
    """All-to-all between the positions of one batch group, one position per process.

    ``group``: the torch.distributed group of the group's processes; ``group_ranks[p]``: the
    global rank of position ``p``; ``peers[p]``: a label for position ``p`` in errors
    (``"worker w1 (rank 1, cpu)"``).
    """

    def __init__(self, group, group_ranks: list[int], device, peers: list[str], timeout_s: float, backend: str = "gloo"):
        self.group = group
        self.device = torch.device(device)
        self.wire = torch.device("cpu") if backend == "gloo" else self.device
        """Where the bytes travel from: gloo sends host memory (a GPU rank stages through it), NCCL
        sends from the GPU."""
        self.peers = list(peers)
        self.timeout_s = timeout_s
        ordered = sorted(group_ranks)  # torch numbers a group's ranks in ascending global order
        self.order = [group_ranks.index(r) for r in ordered]  # group rank g -> position
        self.bytes_received = [0] * len(group_ranks)
        self.bytes_sent = [0] * len(group_ranks)
        self.calls = [0] * len(group_ranks)
        self._seq = 0

    def all_to_all(self, pos: int, parts: list):
        n = len(self.order)
        assert len(parts) == n, f"{len(parts)} parts for {n} positions"
        call = self._seq
        self._seq += 1
        try:
            header, data, sizes = pack_parts(parts, self.order, self.wire)
            header_in = torch.empty(n, HEADER, dtype=torch.int64, device=self.wire)
            dist.all_to_all_single(header_in, header, group=self.group)
            in_sizes = part_sizes(header_in)
            data_in = torch.empty(sum(in_sizes), dtype=torch.uint8, device=self.wire)
            dist.all_to_all_single(data_in, data, output_split_sizes=in_sizes, input_split_sizes=sizes,
                                   group=self.group)
        except Exception as e:
            others = [p for i, p in enumerate(self.peers) if i != pos]
            raise DistPeerError(f"[ShardDiT] attention exchange {call} with {', '.join(others)} failed "
                                f"(dead, or silent for {self.timeout_s:.0f} s): {type(e).__name__}: "
                                f"{str(e).splitlines()[0] if str(e) else ''}") from e
        got = unpack_parts(header_in, data_in, self.device)
        mine = [None] * n
        for g, j in enumerate(self.order):
            mine[j] = got[g]
            if j != pos:
                self.bytes_received[pos] += in_sizes[g]
                self.bytes_sent[pos] += sizes[g]
        self.calls[pos] += 1
        return [_restore(parts_j, m) for parts_j, m in zip(parts, mine, strict=True)]


def _restore(template, items: tuple):
    """Received items in the container type the sender used (a lone tensor stays a tensor)."""
    if isinstance(template, torch.Tensor):
        return items[0]
    if template is None:
        return None
    return type(template)(items) if not hasattr(template, "_fields") else type(template)(*items)
