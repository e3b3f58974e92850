"""``LocalRanks``: the ``RankRunner`` of ranks that are threads of this process (pure).

Every rank of a ``SequenceEngine`` is a thread (``threads.RankThreads``) unless
``distributed.ranks.attach_remote_ranks`` puts some in worker processes; then ``DistRanks`` runs
those and hands the others to a ``LocalRanks``. A local rank runs a block from its ``BlockStream``
(the owner's weights, or a streamed copy), prefetches the next block once the current one's
kernels are queued, and keeps its output rows in ``rank.streams``.
"""
from __future__ import annotations

import torch

from .rank_block import run_rank_block
from .threads import ThreadExchange

__all__ = ["LocalRanks"]


class LocalRanks:
    """Every rank a thread of this process (the engine's default ``RankRunner``)."""

    def __init__(self, devices):
        self.devices = tuple(torch.device(d) for d in devices)
        self.chunks: int | None = None
        """Head chunks of the pipelined Ulysses exchange (``ThreadExchange.chunks``; None: its default,
        pipelined on GPU ranks only)."""
        self.exchange_ops = None
        self.places: tuple | None = None
        """Tests: the ops (``record.RecordingOps``) and the place of each rank the exchanges use
        (None: ``TorchOps`` on each rank's device)."""

    def begin_forward(self, groups: list) -> None:
        pass

    def exchange(self, group, pool) -> ThreadExchange | None:
        places = None if self.places is None else [self.places[r] for r in group.ranks]
        return ThreadExchange([self.devices[r] for r in group.ranks], pool, self.exchange_ops, places, self.chunks)

    def run_block(self, fwd, rank, index: int, block: torch.nn.Module, args: list, kwargs: dict,
                  stream_names: tuple, nxt) -> None:
        module = rank.stream.module_for(index, block)
        rows = run_rank_block(module, args, kwargs, rank.attentions, stream_names, index)
        rank.stream.done_with(module, index)
        if nxt is not None:  # after block g's kernels are queued: the copy of g+1 overlaps them
            rank.stream.prefetch(*nxt)
        rank.streams.update(rows)
        rank.blocks_run += 1

    def rows(self, fwd, rank: int, name: str, pool) -> torch.Tensor:
        return fwd.ranks[rank].streams[name]

    def end_forward(self, ok: bool) -> None:
        pass

    def close(self) -> None:
        pass
