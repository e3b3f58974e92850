"""The ComfyUI host's side of distributed `sequence` mode: its one lobby, and worker ranks for a
shard state (``NAME/DEVICE`` entries of a ``devices`` string).

Member-key contract: each worker process serves one device and joins the lobby as the member
``NAME/DEVICE`` (``box2/cuda:1``); engine ranks map to member keys, and ``devices=auto`` adds every
joined member (``resolve_auto_devices``).

The lobby starts with the server when ``SHARDDIT_DIST_ADDR`` is set (``start_lobby_if_configured``
from the extension entrypoint), so workers can join before the first prompt; without it nothing
listens and a worker device is a clear error. It opens only with the shared secret
(``SHARDDIT_DIST_SECRET`` or ``SHARDDIT_DIST_SECRET_FILE``): without one it logs how to make one and
stays closed, and every node keeps working with this machine's devices.
"""
from __future__ import annotations

import logging

from ...parallel.distributed.config import (
    ADDR_ENV,
    WEIGHTS_ENV,
    dist_addr,
    dist_timeout,
    dist_weights,
)
from ...parallel.distributed.entries import member_key
from ...parallel.distributed.host import choose_worker_weights
from ...parallel.distributed.lobby import Lobby
from ...parallel.distributed.ranks import attach_remote_ranks
from ...parallel.distributed.entries import choose_backend, gpu_uuid
from ...parallel.cluster.host import cluster_host
from ...parallel.cluster.settings import ClusterError, check_auth, ray_address

__all__ = ["PatchVersion", "attach_workers", "auto_members", "check_workers", "decide_worker_weights",
           "describe_workers", "get_lobby", "patch_versions", "resolve_auto_devices", "start_lobby_if_configured"]

log = logging.getLogger("sharddit")
_LOBBY: list[Lobby] = []


def get_lobby(devices: str = ""):
    """Where sessions with the workers come from: the Ray cluster when ``SHARDDIT_RAY_ADDRESS`` is
    set (``parallel/cluster/host.ClusterHost``: members, their rank actors, one session), else this
    host's lobby (``SHARDDIT_DIST_ADDR``). Call from the prompt's thread only: both may wait."""
    host = cluster_host()
    if host is not None:
        return host
    if not _LOBBY:
        addr = dist_addr()
        if addr is None:
            raise ValueError(f"[ShardDiT] devices {devices!r} names worker devices, but {ADDR_ENV} is not set where "
                             f"ComfyUI runs: start ComfyUI with {ADDR_ENV}=HOST:PORT (this machine's address on "
                             "the network the workers share) and start each worker with --join HOST:PORT")
        _LOBBY.append(Lobby(*addr, dist_timeout(), comfyui=_comfyui_version()))
    return _LOBBY[0]


def _comfyui_version() -> str:
    """ComfyUI's version for the lobby entry and offers ('' when unknown)."""
    try:
        import comfyui_version

        return str(comfyui_version.__version__)
    except (ImportError, AttributeError):
        return ""


_VERSION_NOTES: set[str] = set()


def _note_versions(lobby: Lobby, offers: dict) -> None:
    """Log once per member whose ShardDiT, torch or ComfyUI version differs from this host's (the
    protocol is the same, or the lobby would have skipped it): block classes may differ."""
    for member, offer in offers.items():
        diff = [f"{k} {v!r} (host {lobby.versions[k]!r})" for k, v in offer["versions"].items()
                if v != lobby.versions.get(k)]
        note = f"{member}: " + ", ".join(diff)
        if diff and note not in _VERSION_NOTES:
            _VERSION_NOTES.add(note)
            log.warning("[ShardDiT] worker %s runs other versions than this host; results may differ", note)


def start_lobby_if_configured() -> None:
    """Start listening for workers when ``SHARDDIT_DIST_ADDR`` is set. Called from the extension
    entrypoint, so it never raises: a bad setting (address, port, timeout) or an address that
    cannot be bound is one ``[ShardDiT]`` error line, distributed mode stays off, and every node
    works with this machine's devices (a prompt naming worker devices then gets the same message)."""
    try:
        if ray_address() is not None:  # joined at the first prompt that names a member; said now if refused
            check_auth("the ComfyUI host (SHARDDIT_RAY_ADDRESS)")
            if dist_addr() is not None:
                log.warning("[ShardDiT] both SHARDDIT_RAY_ADDRESS and %s are set: the Ray cluster is used, the "
                            "lobby is not started", ADDR_ENV)
            return
        if dist_addr() is not None:
            get_lobby()
    except Exception as e:  # noqa: BLE001 - an exception here would remove every ShardDiT node
        text = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        log.error("%s; distributed sequence mode is off (this machine's devices work as usual)", text)


def describe_workers() -> str:
    """The joined workers (or Ray members) for the Plan node ('' when this host accepts none)."""
    if ray_address() is not None:
        try:
            return get_lobby().describe()
        except (ClusterError, ValueError) as e:
            return str(e)
    return _LOBBY[0].describe() if _LOBBY else ""


def check_workers(devices: str, remote, contact: bool = True) -> None:
    """Every named member (``NAME/DEVICE``) is listed once and has joined (ValueError naming the
    missing one, the joined ones and the command that starts it). ``contact=False`` (a node's
    ``validate_inputs``, on ComfyUI's web-server thread): the listing only, no lobby or cluster
    is asked (a stranger holding it must not hold the web server)."""
    if not remote:
        return
    members = [member_key(name, dev) for name, dev in remote]
    for m in dict.fromkeys(members):
        if members.count(m) > 1:
            raise ValueError(f"[ShardDiT] devices {devices!r} lists the worker device {m!r} {members.count(m)} times: "
                             "a worker process serves one rank; list it once (start the worker with more devices, "
                             "--devices cuda:0,cuda:1, for more ranks on that machine)")
    if contact:
        get_lobby(devices).check_names(members)
    else:
        _check_settings(devices)


def _check_settings(devices: str) -> None:
    """The settings a worker device needs, read without contacting anyone: ValueError naming the
    variable and the fix (a bad value, or neither SHARDDIT_RAY_ADDRESS nor SHARDDIT_DIST_ADDR)."""
    dist_timeout()
    if ray_address() is None and dist_addr() is None:
        raise ValueError(f"[ShardDiT] devices {devices!r} names worker devices, but neither SHARDDIT_RAY_ADDRESS nor "
                         f"{ADDR_ENV} is set where ComfyUI runs: set SHARDDIT_RAY_ADDRESS=HOST:6379 (a Ray cluster "
                         "whose worker machines ran `python <pack-dir> worker --ray --join HOST:6379 --name NAME`), "
                         f"or {ADDR_ENV}=HOST:PORT and start each worker with --join HOST:PORT")


def attach_workers(engine, devices: str, remote, n_local: int, owners=None, version_of=None,
                   keep_all: bool = False, describe=None) -> None:
    """Ranks ``n_local...`` of ``engine`` run in the worker members ``remote`` ((name, device) pairs);
    ``owners``: block index -> engine rank (the plan's ranges); ``describe``: how the workers build
    the blocks (``worker_blocks.describer``)."""
    lobby = get_lobby(devices)
    offers = lobby.check_names([member_key(n, d) for n, d in remote])
    _note_versions(lobby, offers)
    local = {str(d): gpu_uuid(str(d)) for d in engine.devices[:n_local]}
    backend, why = choose_backend(local, offers)
    log.info("[ShardDiT] distributed backend %s: %s", backend, why)
    attach_remote_ranks(engine, lobby, {n_local + i: member_key(n, d) for i, (n, d) in enumerate(remote)},
                        {member_key(n, d): d for n, d in remote}, backend, owners, version_of, keep_all, describe)


def decide_worker_weights(devices: str, remote, plan, block_bytes, n_local: int) -> bool:
    """``distributed/host.choose_worker_weights`` for this plan and the joined workers' offers; logged."""
    members = [(member_key(n, d), d) for n, d in remote]
    offers = get_lobby(devices).check_names([m for m, _ in members])
    keep_all, why = choose_worker_weights(dist_weights(), members, plan.block_ranges[n_local:], block_bytes, offers)
    log.info("[ShardDiT] %s: %s", WEIGHTS_ENV, why)
    return keep_all


class PatchVersion:
    """Version of one block's weights as ComfyUI patches them: the block's weight patches (LoRA
    strengths and patch objects, held here so their ids stay unique) and the cast settings of the
    main patcher this sampling run loaded. Equal versions: the same weights."""

    __slots__ = ("hold", "key")

    def __init__(self, key: tuple, hold: list):
        self.key, self.hold = key, hold

    def __eq__(self, other) -> bool:
        return isinstance(other, PatchVersion) and self.key == other.key

    __hash__ = None


def patch_versions(runtime, block_keys: dict[int, str]):
    """``version_of(index, block)`` for ``distributed/ranks``: read from the main patcher ShardDiT loaded
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


def auto_members(devices: str) -> tuple[str, ...]:
    """The joined members ``devices=auto`` would take now, in key order (() for other devices or
    when this host has no lobby). Callers that cache per ``devices`` add it to their key."""
    if not isinstance(devices, str) or devices.strip().lower() != "auto":
        return ()
    if ray_address() is not None:
        return tuple(get_lobby().members())
    return tuple(sorted(_LOBBY[0].workers())) if _LOBBY else ()


def resolve_auto_devices(devices: str, parallel: str, local_auto, blocks_only=lambda: "") -> str:
    """``devices=auto`` on a host whose lobby has joined members: with ``parallel`` ``sequence`` or
    ``auto``, this machine's auto choice (``local_auto()``: an explicit device list such as
    ``"cuda:0,cuda:1"``) plus every joined member in key order (``"cpu,w1/cpu"``). With ``blocks``,
    or a model that runs in blocks mode only (``blocks_only()``: why, '' if not), the workers are left out
    (logged). Anything else, or no joined worker: ``devices`` unchanged."""
    members = auto_members(devices)
    if not members:
        return devices
    why = "" if parallel == "blocks" else blocks_only()
    if parallel == "blocks" or why:
        why = why or "worker devices run parallel=sequence only; set parallel to 'sequence' or 'auto' to use them"
        log.info("[ShardDiT] devices=auto with parallel=%s: joined worker(s) %s left out (%s)", parallel,
                 ", ".join(members), why)
        return devices
    local = local_auto()
    chosen = ",".join([local, *members])
    log.info("[ShardDiT] devices=auto with joined workers -> %r (this machine: %s; workers: %s)", chosen, local,
             ", ".join(members))
    return chosen
