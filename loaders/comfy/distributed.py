"""The ComfyUI host's side of distributed `sequence` mode: its one lobby, and worker ranks for a
shard state (``NAME/dev`` entries of a ``devices`` string).

The lobby starts with the server when ``SHARDDIT_DIST_ADDR`` is set (``start_lobby_if_configured``
from the extension entrypoint), so workers can join before the first prompt; without it nothing
listens and a worker device is a clear error.
"""
from __future__ import annotations

import logging

from ...parallel.dist_config import ADDR_ENV, dist_addr, dist_timeout
from ...parallel.dist_host import Lobby
from ...parallel.dist_ranks import attach_remote_ranks

__all__ = ["attach_workers", "check_workers", "describe_workers", "get_lobby", "start_lobby_if_configured"]

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


def attach_workers(engine, devices: str, remote, n_local: int) -> None:
    """Ranks ``n_local...`` of ``engine`` run in the workers ``remote`` ((name, device) pairs)."""
    lobby = get_lobby(devices)
    every = [str(d) for d in engine.devices[:n_local]] + [d for _, d in remote]
    backend = "nccl" if all(d.startswith("cuda") for d in every) else "gloo"
    attach_remote_ranks(engine, lobby, {n_local + i: name for i, (name, _) in enumerate(remote)},
                        {name: dev for name, dev in remote}, backend)
