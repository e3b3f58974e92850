"""The ComfyUI host's side of distributed `sequence` mode: its one lobby, and worker ranks for a
shard state (``NAME/dev`` entries of a ``devices`` string).

The lobby starts with the server when ``SHARDDIT_DIST_ADDR`` is set (``start_lobby_if_configured``
from the extension entrypoint), so workers can join before the first prompt; without it nothing
listens and a worker device is a clear error.
"""
from __future__ import annotations

import logging

from ...parallel.dist_config import ADDR_ENV, WEIGHTS_ENV, dist_addr, dist_timeout, dist_weights
from ...parallel.dist_host import Lobby, choose_worker_weights
from ...parallel.dist_ranks import attach_remote_ranks

__all__ = ["PatchVersion", "attach_workers", "check_workers", "decide_worker_weights", "describe_workers", "get_lobby",
           "patch_versions", "start_lobby_if_configured"]

log = logging.getLogger("sharddit")
_LOBBY: list[Lobby] = []


def get_lobby(devices: str = "") -> Lobby:
    if not _LOBBY:
        addr = dist_addr()
        if addr is None:
            raise ValueError(f"[ShardDiT] devices {devices!r} names worker devices, but {ADDR_ENV} is not set where "
                             f"ComfyUI runs: start ComfyUI with {ADDR_ENV}=HOST:PORT (this machine's address on "
                             "the network the workers share) and start each worker with --join HOST:PORT")
        _LOBBY.append(Lobby(*addr, dist_timeout()))
    return _LOBBY[0]


def start_lobby_if_configured() -> None:
    if dist_addr() is None:
        return
    try:
        get_lobby()
    except (OSError, ValueError) as e:
        log.error("%s", e)


def describe_workers() -> str:
    """The joined workers for the Plan node ('' when this host accepts none)."""
    return _LOBBY[0].describe() if _LOBBY else ""


def check_workers(devices: str, remote) -> None:
    """Every named worker has joined (ValueError naming the missing one and the joined ones)."""
    if remote:
        get_lobby(devices).check_names([name for name, _ in remote])


def attach_workers(engine, devices: str, remote, n_local: int, owners=None, version_of=None,
                   keep_all: bool = False) -> None:
    """Ranks ``n_local...`` of ``engine`` run in the workers ``remote`` ((name, device) pairs);
    ``owners``: block index -> engine rank (the plan's ranges)."""
    lobby = get_lobby(devices)
    every = [str(d) for d in engine.devices[:n_local]] + [d for _, d in remote]
    backend = "nccl" if all(d.startswith("cuda") for d in every) else "gloo"
    attach_remote_ranks(engine, lobby, {n_local + i: name for i, (name, _) in enumerate(remote)},
                        {name: dev for name, dev in remote}, backend, owners, version_of, keep_all)


def decide_worker_weights(devices: str, remote, plan, block_bytes, n_local: int) -> bool:
    """``dist_host.choose_worker_weights`` for this plan and the joined workers' offers; logged."""
    keep_all, why = choose_worker_weights(dist_weights(), remote, plan.block_ranges[n_local:], block_bytes,
                                          get_lobby(devices).workers())
    log.info("[ShardDiT] %s: %s", WEIGHTS_ENV, why)
    return keep_all


class PatchVersion:
    """Version of one block's weights as ComfyUI patches them: the block's weight patches (LoRA
    strengths and patch objects, held here so their ids stay unique) and the cast settings of the
    main patcher this sampling run loaded. Equal versions: the same weights."""

    __slots__ = ("key", "hold")

    def __init__(self, key: tuple, hold: list):
        self.key, self.hold = key, hold

    def __eq__(self, other) -> bool:
        return isinstance(other, PatchVersion) and self.key == other.key

    __hash__ = None


def patch_versions(runtime, block_keys: dict[int, str]):
    """``version_of(index, block)`` for ``dist_ranks``: read from the main patcher ShardDiT loaded
    (``runtime.loaded_main``), computed once per patch state (``patches_uuid``), not per step."""
    cache: dict = {}

    def version_of(index: int, block) -> PatchVersion:
        main = runtime.loaded_main() if runtime.loaded_main is not None else None
        if main is None:
            return PatchVersion(("unpatched", id(block)), [])
        state = (id(main), main.patches_uuid, bool(main.force_cast_weights))
        if cache.get("state") != state:
            cache.clear()
            cache["state"] = state
            by_block: dict[str, list] = {}
            for key, patches in main.patches.items():
                head, _, rest = key.partition(".")
                path, _, tail = rest.partition(".")
                i = tail.partition(".")[0]
                by_block.setdefault(f"{head}.{path}.{i}.", []).append((key, patches))
            cache["blocks"] = by_block
        entries = sorted(cache["blocks"].get(block_keys[index], []), key=lambda e: e[0])
        key = tuple((k, tuple((p[0], id(p[1]), p[2], repr(p[3]), id(p[4])) for p in patches)) for k, patches in entries)
        return PatchVersion((state[2], key), [p for _, patches in entries for p in patches])

    return version_of
