"""Reaching a ShardDiT host's lobby from another process (pure: sockets and torch.distributed).

``connect_store(host, port, ...)`` is what ``worker --join`` uses (and what ``plan --workers`` can
use): it checks, in this order, and says what it found:

1. the host name resolves (``socket.getaddrinfo``): a failure is reported as such at once
   (``HostUnresolved``), not as a timeout, and torch never sees the name (its client warns about
   IPv6 every second while it retries a name that does not resolve);
2. something accepts TCP connections at the resolved address and port: probed with a plain socket
   every ``PROBE_S`` seconds (torch's client would retry silently and end in C++ frames); within
   ``PROGRESS_S`` it says that it is still waiting and for what, then every ``REPEAT_S``; after
   ``wait_s`` it gives up with ``HostUnreachable``;
3. only then the ``TCPStore`` client connects, which now answers at once; a listener that is not
   a ShardDiT lobby is named with the first line of torch's error (``HostUnreachable``).

``join_address(host, port)`` is the address workers should be told to join for a lobby that
listens on ``host:port`` (a wildcard such as ``0.0.0.0`` is no address another machine can join).
"""
from __future__ import annotations

import datetime
import math
import socket
import time

__all__ = ["PROBE_S", "PROGRESS_S", "REPEAT_S", "HostUnreachable", "HostUnresolved", "connect_store", "join_address",
           "resolve_host", "this_machine_addresses", "wait_for_port"]

PROBE_S = 1.0
PROGRESS_S = 2.0
REPEAT_S = 30.0
_WILDCARDS = ("0.0.0.0", "::", "*")


class HostUnresolved(ConnectionError):
    """The host name does not resolve (a typo, or no DNS entry for it on this machine)."""


class HostUnreachable(ConnectionError):
    """Nothing answered as a ShardDiT host at the address within the wait."""


def resolve_host(host: str, port: int) -> str:
    """The first address ``host`` resolves to (IPv4 first), for a TCP connection to ``port``;
    ``HostUnresolved`` naming the host and the resolver's reason."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError) as e:
        raise HostUnresolved(f"[ShardDiT] the host name {host!r} does not resolve ({e}); check the spelling, or give "
                             "the host's IP address (e.g. 192.168.1.10)") from None
    infos.sort(key=lambda i: i[0] != socket.AF_INET)
    return infos[0][4][0]


def this_machine_addresses() -> list[str]:
    """Non-loopback IPv4 addresses of this machine, best effort and without traffic: the host
    name's addresses and the one the default route would use (a UDP socket's local address after
    ``connect``, which sends nothing)."""
    found = []
    try:
        found += [i[4][0] for i in socket.getaddrinfo(socket.gethostname(), None, socket.AF_INET)]
    except OSError:
        pass
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect(("10.255.255.255", 1))
            found.append(s.getsockname()[0])
    except OSError:
        pass
    return [a for a in dict.fromkeys(found) if not a.startswith("127.") and a != "0.0.0.0"]


def join_address(host: str, port: int) -> str:
    """What a worker passes to ``--join`` for a lobby listening on ``host:port``: that address, or
    for a wildcard (``0.0.0.0``, ``::``) this machine's address as others reach it (named when
    known: ``192.168.1.10:29555``, else ``THIS_MACHINE_IP:29555``)."""
    if host not in _WILDCARDS:
        return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    found = this_machine_addresses()
    return f"{found[0]}:{port}" if len(found) == 1 else f"THIS_MACHINE_IP:{port}"


def wait_for_port(host: str, port: int, wait_s: float = math.inf, say=print, hint: str = "") -> str:
    """Resolve ``host``, then wait until ``host:port`` accepts a TCP connection; the resolved
    address. Says within ``PROGRESS_S`` that it is waiting and for what (with ``hint``: what should
    be running there), again every ``REPEAT_S``; ``HostUnreachable`` after ``wait_s``."""
    address = resolve_host(host, port)
    where = f"{host}:{port}" + (f" ({address})" if address != host else "")
    start = time.monotonic()
    next_say = start + PROGRESS_S
    while True:
        try:
            with socket.create_connection((address, port), timeout=PROBE_S):
                return address
        except OSError as e:
            reason = e.strerror or type(e).__name__
        now = time.monotonic()
        if now - start >= wait_s:
            raise HostUnreachable(f"[ShardDiT] nothing answered at {where} within {wait_s:g} s ({reason})"
                                  + (f"; {hint}" if hint else ""))
        if now >= next_say:
            waited = f"{now - start:.0f} s" if now - start >= 10 else "no answer yet"
            say(f"[ShardDiT] waiting for the host at {where} ({waited}: {reason}"
                + (f"; {hint}" if hint else "") + ")")
            next_say = now + REPEAT_S
        time.sleep(max(0.0, min(PROBE_S, start + wait_s - time.monotonic())))


def connect_store(host: str, port: int, timeout_s: float, wait_s: float = math.inf, say=print, hint: str = ""):
    """A ``TCPStore`` client of the lobby at ``host:port`` (see the module docstring):
    ``HostUnresolved`` / ``HostUnreachable`` with one clear line, never torch's C++ frames."""
    import torch.distributed as dist

    address = wait_for_port(host, port, wait_s, say, hint)
    try:
        return dist.TCPStore(address, port, None, False, datetime.timedelta(seconds=timeout_s),
                             use_libuv=False)
    except Exception as e:  # noqa: BLE001 - torch raises DistNetworkError/RuntimeError with C++ frames
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise HostUnreachable(f"[ShardDiT] {host}:{port} accepts connections but did not answer as a ShardDiT host "
                              f"({type(e).__name__}: {first})" + (f"; {hint}" if hint else "")) from None
