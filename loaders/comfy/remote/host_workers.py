"""The ComfyUI host's side of distributed `sequence` mode: its Ray cluster, and member ranks for a
shard state (``NAME/DEVICE`` entries of a ``devices`` string).

Member-key contract: each member is one device of a worker machine (``box2/cuda:1``), a Ray node
started by ``python <pack-dir> worker --join HEAD:6379 --name box2 --devices ...``; engine ranks map
to member keys, and ``devices=auto`` adds every member (``resolve_auto_devices``). The host joins
the cluster at ``SHARDDIT_RAY_ADDRESS`` as a Ray driver on the first prompt that needs it
(``parallel/cluster/host.cluster_host``), never on ComfyUI's web-server thread.
"""
from __future__ import annotations

import logging
import os

from ....parallel.distributed.config import WEIGHTS_ENV, dist_timeout, dist_weights, parse_addr
from ....parallel.distributed.members import choose_backend, choose_worker_weights, gpu_uuid, member_key, split_member
from ....parallel.distributed.ranks import attach_remote_ranks
from ....parallel.cluster.host import cluster_host
from ....parallel.placement.devices import DevicePlan
from ....parallel.cluster.settings import RAY_ADDRESS_ENV, ClusterError, check_auth, ray_address
from ....parallel.errors import InputError

__all__ = ["LEGACY_ENV", "PatchVersion", "attach_workers", "auto_members", "check_workers", "cluster_settings_note",
           "decide_worker_weights", "describe_workers", "get_cluster", "patch_versions", "resolve_auto_devices"]

log = logging.getLogger("sharddit")
LEGACY_ENV = ("SHARDDIT_DIST_ADDR", "SHARDDIT_DIST_SECRET", "SHARDDIT_DIST_SECRET_FILE", "SHARDDIT_DIST_PUBLIC")
"""Settings of the former lobby, which Ray replaced: named with the way forward when still set."""
_HOW = (f"set {RAY_ADDRESS_ENV}=HOST:6379 where ComfyUI runs (a Ray cluster whose worker machines ran `python "
        "<pack-dir> worker --join HOST:6379 --name NAME`; README: Several machines)")


def get_cluster(devices: str = ""):
    """The Ray cluster's host side (``parallel/cluster/host.ClusterHost``: members, their rank
    actors, one session); ValueError naming the fix when ``SHARDDIT_RAY_ADDRESS`` is unset. Call
    from the prompt's thread only: joining the cluster waits (bounded by SHARDDIT_DIST_TIMEOUT)."""
    host = cluster_host()
    if host is None:
        raise InputError(f"devices {devices!r} names worker devices, but {RAY_ADDRESS_ENV} is not set: "
                         + _HOW)
    return host


def _comfyui_version() -> str:
    """ComfyUI's version, for the notes on members' versions ('' when unknown)."""
    try:
        import comfyui_version

        return str(comfyui_version.__version__)
    except (ImportError, AttributeError):
        return ""


_VERSION_NOTES: set[str] = set()


def _note_versions(host, offers: dict) -> None:
    """Log once per member whose ShardDiT, torch or ComfyUI version differs from this host's
    (block classes may differ)."""
    mine = {**host.versions, "comfyui": _comfyui_version()}
    for member, offer in offers.items():
        diff = [f"{k} {v!r} (host {mine.get(k)!r})" for k, v in offer["versions"].items() if v != mine.get(k)]
        note = f"{member}: " + ", ".join(diff)
        if diff and note not in _VERSION_NOTES:
            _VERSION_NOTES.add(note)
            log.warning("[ShardDiT] member %s runs other versions than this host; results may differ", note)


def cluster_settings_note() -> None:
    """At the server's start: one line when the cluster's settings are refused (no token auth) or
    when the former lobby's settings are still set. Never raises (it runs from the extension entrypoint)."""
    legacy = [k for k in LEGACY_ENV if os.environ.get(k, "").strip()]
    if legacy:
        log.warning("[ShardDiT] %s: no longer used; several machines now run on Ray: %s", ", ".join(legacy), _HOW)
    try:
        if ray_address() is not None:
            check_auth(f"the ComfyUI host ({RAY_ADDRESS_ENV})")
            _check_settings()
    except Exception as e:  # noqa: BLE001 - an exception here would remove every ShardDiT node
        text = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        log.error("%s; several machines are off (this machine's devices work as usual)", text)


def describe_workers() -> str:
    """The cluster's members for the Plan node ('' when no cluster is set)."""
    if ray_address() is None:
        return ""
    try:
        return get_cluster().describe()
    except (ClusterError, ValueError) as e:
        return str(e)


def check_workers(devices: str, remote, contact: bool = True) -> None:
    """Every named member (``NAME/DEVICE``) is listed once and is in the cluster (ValueError naming
    the missing one, the members and the command that starts it). ``contact=False`` (a node's
    ``validate_inputs``, on ComfyUI's web-server thread): the listing and the settings only, the
    cluster is not asked."""
    if not remote:
        return
    members = [member_key(name, dev) for name, dev in remote]
    for m in dict.fromkeys(members):
        if members.count(m) > 1:
            raise InputError(f"devices {devices!r} lists the worker device {m!r} {members.count(m)} times: "
                             "a member serves one rank; list it once (start the worker with more devices, "
                             "--devices cuda:0,cuda:1, for more ranks on that machine)")
    _check_settings()
    if contact:
        get_cluster(devices).check_names(members)
    elif ray_address() is None:
        get_cluster(devices)  # the error that says what to set


def _check_settings() -> None:
    """The cluster's settings, read without contacting it: ValueError naming the variable, the
    value and the form (``SHARDDIT_DIST_TIMEOUT``, ``SHARDDIT_RAY_ADDRESS``)."""
    dist_timeout()
    address = ray_address()
    if address is not None and address != "auto":
        parse_addr(address, RAY_ADDRESS_ENV)


def attach_workers(engine, devices: str, remote, n_local: int, owners=None, version_of=None,
                   keep_all: bool = False, describe=None) -> None:
    """Ranks ``n_local...`` of ``engine`` run in the worker members ``remote`` ((name, device) pairs);
    ``owners``: block index -> engine rank (the plan's ranges); ``describe``: how the workers build
    the blocks (``worker_blocks.describer``)."""
    host = get_cluster(devices)
    offers = host.check_names([member_key(n, d) for n, d in remote])
    _note_versions(host, offers)
    local = {str(d): gpu_uuid(str(d)) for d in engine.devices[:n_local]}
    backend, why = choose_backend(local, offers)
    log.info("[ShardDiT] distributed backend %s: %s", backend, why)
    attach_remote_ranks(engine, host, {n_local + i: member_key(n, d) for i, (n, d) in enumerate(remote)},
                        {member_key(n, d): d for n, d in remote}, backend, owners, version_of, keep_all, describe)


def decide_worker_weights(devices: str, remote, plan, block_bytes, n_local: int) -> bool:
    """``distributed/members.choose_worker_weights`` for this plan and the joined workers' offers; logged."""
    members = [(member_key(n, d), d) for n, d in remote]
    offers = get_cluster(devices).check_names([m for m, _ in members])
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


def auto_members(devices: DevicePlan) -> tuple[str, ...]:
    """The members ``devices=auto`` would take now, in key order (() for other devices or when no
    cluster is set). Callers that cache per ``devices`` add it to their key."""
    if not devices.auto or devices.members or ray_address() is None:
        return ()
    return tuple(get_cluster().members())


def resolve_auto_devices(devices: DevicePlan, parallel: str, local_auto, blocks_only=lambda: "") -> DevicePlan:
    """``devices=auto`` on a host whose cluster has members: with ``parallel`` ``sequence`` or
    ``auto``, this machine's auto choice (``local_auto()``: an explicit ``DevicePlan`` such as
    ``cuda:0,cuda:1``) plus every joined member in key order (``cpu,w1/cpu``). With ``blocks``,
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
    chosen = local.with_members(split_member(m) for m in members)
    log.info("[ShardDiT] devices=auto with joined workers -> %r (this machine: %s; workers: %s)", chosen.text,
             local.text, ", ".join(members))
    return chosen
