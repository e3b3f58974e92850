"""The host side of distributed `sequence` mode, whatever carries its sessions (pure PyTorch):
the error a lost member raises, leaving and resetting a session's process groups, and whether the
members have room for their share of the weights (``SHARDDIT_DIST_WEIGHTS``). Sessions themselves
come from the Ray cluster (``parallel/cluster/session.RaySession``).
"""
from __future__ import annotations

import logging

import torch.distributed as dist

from ..cost.workers import compute_worker_needs
from ..units import format_gib
from .members import check_member

__all__ = ["DistWorkerError", "check_member", "check_worker_room", "choose_worker_weights", "end_process_group",
           "offer_free", "reset_after_failed_init"]

log = logging.getLogger("sharddit")


class DistWorkerError(RuntimeError):
    """A member failed, died or stayed silent; the message names it and what it was doing."""


def reset_after_failed_init() -> None:
    """Undo what a failed ``init_process_group`` left behind. It has already counted the default
    group, so the next session would name its groups differently from a fresh worker's and the two
    would wait for each other's keys (found by the server test: a worker killed while joining,
    then no session could open). ``destroy_process_group`` resets the count, but only once a
    group exists; torch keeps the counter in ``distributed_c10d._world`` (private)."""
    if dist.is_initialized():
        dist.destroy_process_group()
        return
    from torch.distributed import distributed_c10d

    world = getattr(distributed_c10d, "_world", None)
    if world is not None and hasattr(world, "group_count"):
        world.group_count = 0


def end_process_group(abort: bool) -> None:
    """Leave the session's process group; ``abort`` (a failed NCCL session) first aborts its
    communicators, so collectives still posted for a dead member cannot hang this process or let
    NCCL's watchdog take it down (ComfyUI keeps running)."""
    from torch.distributed import distributed_c10d

    if abort and hasattr(distributed_c10d, "_abort_process_group"):
        try:
            distributed_c10d._abort_process_group()
        except Exception as e:  # noqa: BLE001 - destroy below still resets the group
            log.warning("[ShardDiT] aborting the session's NCCL groups: %s", e)
    try:
        if dist.is_initialized():
            dist.destroy_process_group()
    except Exception as e:  # noqa: BLE001
        log.warning("[ShardDiT] closing the session's process group: %s", e)


def offer_free(offer: dict, device: str) -> int | None:
    """Free bytes a worker's offer states for ``device`` (None: not stated)."""
    if "free" in offer and offer.get("device", device) == device:
        return int(offer["free"])
    free = offer.get("devices", {}).get(device)
    return int(free) if free is not None else None


def check_worker_room(needs: dict[str, tuple[int, str]], offers: dict[str, dict], devices: dict[str, str]) -> None:
    """Every worker has room for its share: ``needs[name] = (bytes, what)``, the offers it joined
    with. ValueError naming each worker short of memory, the GiB missing and the fix; before any
    weight moves. A device whose offer states no free memory is not checked."""
    short = []
    for name, (need, what) in needs.items():
        free = offer_free(offers.get(name, {}), devices[name])
        if free and free < need:
            short.append(f"{name} ({devices[name]}): needs {format_gib(need, 2)} GiB ({what}), has "
                         f"{format_gib(free, 2)} GiB free: {format_gib(need - free, 2)} GiB missing")
    if short:
        raise ValueError("[ShardDiT] not enough memory on worker devices: " + "; ".join(short)
                         + ". Add worker devices (each takes an equal share), free memory there, or use fewer "
                         "blocks per device (more devices in the devices string)")


def choose_worker_weights(mode: str, remote, ranges, block_bytes, offers: dict[str, dict]) -> tuple[bool, str]:
    """(keep_all, why): whether every worker keeps every block, for ``SHARDDIT_DIST_WEIGHTS``
    ``mode`` (``cost/workers.compute_worker_needs``: the one rule ``plan`` shows too), checked
    against the free memory the joined workers offer: ValueError naming the GiB missing per
    worker when the chosen mode does not fit."""
    workers = [(name, dev, offer_free(offers.get(name, {}), dev)) for name, dev in remote]
    keep_all, why, needs = compute_worker_needs(mode, workers, [(r.start, r.stop) for r in ranges], block_bytes)
    check_worker_room({n.name: (n.need_bytes, n.what) for n in needs}, offers, dict(remote))
    return keep_all, why
