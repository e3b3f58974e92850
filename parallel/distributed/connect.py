"""Reaching a machine's port before a slower client tries it (pure: sockets only).

``wait_for_port(host, port, ...)`` is what ``worker --join`` and the host's Ray driver use before
Ray's own client (which waits silently, then prints a traceback): it checks, in this order, and
says what it found:

1. the host name resolves (``socket.getaddrinfo``): a failure is reported as such at once
   (``HostUnresolved``), not as a timeout;
2. something accepts TCP connections at the resolved address and port: probed with a plain socket
   every ``PROBE_S`` seconds; within ``PROGRESS_S`` it says that it is still waiting and for what,
   then every ``REPEAT_S``; after ``wait_s`` it gives up with ``HostUnreachable``.
"""
from __future__ import annotations

import math
import socket
import time

__all__ = ["PROBE_S", "PROGRESS_S", "REPEAT_S", "HostUnreachable", "HostUnresolved", "resolve_host", "wait_for_port"]

PROBE_S = 1.0
PROGRESS_S = 2.0
REPEAT_S = 30.0


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
