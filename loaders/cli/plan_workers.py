"""``plan --workers [ray:]HOST:PORT``: the members of the Ray cluster at HOST:PORT (its head's GCS
port) and their free memory, read before anything is simulated (so an absent cluster never
follows a printed plan). This process joins the cluster as a Ray driver (the cluster's token
needed, as the host's) and asks each member's node with one small task (no rank actor: a running
host's actors hold the members), all within ``CONNECT_TIMEOUT_S``.
"""
from __future__ import annotations

import sys
from dataclasses import dataclass

from ...parallel.distributed.config import parse_addr
from ...parallel.errors import InputError

__all__ = ["CONNECT_TIMEOUT_S", "RAY_PREFIX", "WorkersView", "read_cluster", "read_workers", "workers_address"]

CONNECT_TIMEOUT_S = 10.0
"""How long ``plan`` waits for the cluster in all (its port, Ray's answer, the members' reports)."""
RAY_PREFIX = "ray:"
"""Accepted before ``HOST:PORT`` (``ray:192.168.1.10:6379``); the address is a Ray head's either way."""


@dataclass(frozen=True)
class WorkersView:
    host: str
    port: int
    offers: dict
    """Member ``NAME/DEVICE`` -> ``{"device", "free"}``."""
    text: str
    """The members as the Plan node lists them."""


def workers_address(text: str) -> str:
    """``--workers`` -> ``HOST:PORT``, checked (ValueError naming the value and the fix)."""
    addr = text[len(RAY_PREFIX):] if text.startswith(RAY_PREFIX) else text
    host, port = parse_addr(addr, "--workers")
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def read_workers(addr: str | None, workers: tuple) -> tuple[tuple, WorkersView | None]:
    """(worker devices, the cluster's members): without ``addr`` (no ``--workers``) the devices as
    given and no members; else the members read from the cluster, and each worker device without a
    stated free memory takes it from its member's report (``NAME/DEVICE``, or any device of NAME)."""
    from ...parallel.distributed.members import offer_free

    if addr is None:
        return workers, None
    members = read_cluster(addr)
    out = []
    for name, dev, free in workers:
        offer = members.offers.get(f"{name}/{dev}", members.offers.get(name))
        if offer is None and free is None:  # a member not in the cluster: InputError naming the members
            at = f"{members.host}:{members.port}"
            raise InputError(f"no member {name}/{dev} in the Ray cluster at {at} (members: "
                             f"{', '.join(sorted(members.offers)) or 'none yet'}); start it with: python <pack-dir> "
                             f"worker --join {at} --name {name}, or give its free memory as {name}/{dev}=24GiB")
        stated = offer_free(offer, dev) if offer is not None else None
        out.append((name, dev, free if free is not None else stated or None))  # 0: not stated, as the runtime
    return tuple(out), members


def read_cluster(addr: str, timeout_s: float = CONNECT_TIMEOUT_S) -> WorkersView:
    """The members' free memory and their description from the Ray cluster at ``addr``;
    ValueError naming the address and why otherwise."""
    from ...parallel.cluster.driver import connect, probe_free
    from ...parallel.cluster.host import describe_members
    from ...parallel.cluster.settings import ClusterError, ClusterInsecure
    from ...parallel.distributed.config import HostUnreachable, HostUnresolved, wait_for_port

    host, port = parse_addr(addr, "--workers")
    try:  # a plain socket first: said within seconds, and without Ray or its token
        wait_for_port(host, port, timeout_s, say=lambda m: print(m, file=sys.stderr, flush=True),
                      hint=f"is `ray start --head --port {port}` running there?")
    except (HostUnreachable, HostUnresolved) as e:
        raise InputError(f"--workers {addr}: {e.reason}") from None
    try:
        ray = connect(addr, timeout_s)
        offers = probe_free(ray, timeout_s)
        return WorkersView(host, port, offers, describe_members(addr, offers))
    except (ClusterError, ClusterInsecure) as e:
        raise InputError(f"--workers {addr}: {e.reason}") from None
