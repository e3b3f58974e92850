"""The two contracts of `sequence` mode that have more than one implementation (pure).

``Exchange``: how the ranks of one batch group swap attention parts. Implemented by
``threads.ThreadExchange`` (every position a thread of this process) and by
``distributed.exchange.DistExchange`` (positions spread over processes, torch.distributed between
them). ``ulysses_attention`` is written against this contract only.

``RankRunner``: where the engine's ranks run one block. Implemented by ``local.LocalRanks`` (every
rank a thread of this process: the default) and by ``distributed.ranks.DistRanks`` (some ranks in
worker processes; it runs the others through a ``LocalRanks``). ``SequenceEngine`` calls it for
every rank and every batch group the same way and never asks which one it has.

Both are ``typing.Protocol`` classes, checked at runtime (``isinstance``) by
``tests/test_sequence_interfaces.py``, which also compares the method signatures.
"""
from __future__ import annotations

from typing import Protocol, runtime_checkable

import torch

__all__ = ["Exchange", "RankRunner"]


@runtime_checkable
class Exchange(Protocol):
    """All-to-all between the ``n`` positions (ranks, in token order) of one batch group.

    ``all_to_all(pos, parts, expect=None)`` is called once per round by the thread of every
    position this process holds: ``parts[j]`` (a tensor, a tuple/list of tensors or None, the
    same container kinds on every position) is what ``pos`` sends position ``j``. It returns,
    in position order, what every position sent ``pos``, in the sender's container type, on
    ``pos``'s device.

    Rules every implementation keeps:

    - rounds are matched by a per-position call count, so every position must make the same calls
      in the same order (Ulysses: q/k/v out, then the output back, per block); a position never
      waits for another to *read*, only for every position to *post* that round;
    - ``expect[j]`` (optional) describes what position ``j`` sends ``pos`` as ``(dtype, shape)`` per
      item, or None: an exchange that must size its receive buffers uses it instead of sending
      headers; one that does not need it ignores it. Parts are moved as they are (no cast, no
      reorder), so a split forward stays bit-identical to the unsplit one;
    - stream order: parts a thread posts are read by other threads on the CUDA stream the engine's
      worker threads share (``threads.RankThreads`` sets it), with no event in between, so a part
      must be posted after the kernels that write it are queued on that stream;
    - every wait is bounded (a timeout) and stops at once when the thread pool aborts
      (``threads.RanksAborted``); a failure names the position, or the remote peers.

    Counters, one entry per position (the engine reads them into ``SequenceStats``):
    """

    bytes_received: list[int]
    """Bytes of the parts every *other* position sent this one."""
    bytes_sent: list[int]
    """Bytes of this position's parts that left this process (0 for an in-process exchange)."""
    calls: list[int]
    """All-to-all rounds made."""

    def all_to_all(self, pos: int, parts: list, expect=None) -> list: ...


@runtime_checkable
class RankRunner(Protocol):
    """Where the ranks of one ``SequenceEngine`` run. Main-thread calls: ``begin_forward``,
    ``exchange``, ``end_forward``, ``close``; ``run_block`` and ``rows`` run on the calling rank's
    thread (``threads.RankThreads``)."""

    def begin_forward(self, groups: list) -> None:
        """A forward starts with these batch groups (open or reuse whatever the ranks need)."""

    def exchange(self, group, pool) -> Exchange | None:
        """The exchange the threads of ``group`` (more than one rank) share in this process;
        None when no rank of the group is a thread here."""

    def run_block(self, fwd, rank, index: int, block: torch.nn.Module, args: list, kwargs: dict,
                  stream_names: tuple, nxt) -> None:
        """Run block ``index`` for ``rank`` on its share of the arguments; keep its output rows
        in ``rank.streams`` (or wherever ``rows`` finds them); prefetch ``nxt`` when it can."""

    def rows(self, fwd, rank: int, name: str, pool) -> torch.Tensor:
        """Rank ``rank``'s rows of stream ``name`` (the engine gathers them on the home device)."""

    def end_forward(self, ok: bool) -> None:
        """The forward ended (``ok``: with no error; wait for what is still in flight)."""

    def close(self) -> None:
        """The model is released: drop what the ranks hold for it."""
