"""Settings and addresses of distributed `sequence` mode, read from one place each (pure).

- ``SHARDDIT_DIST_TIMEOUT``: seconds a member may stay silent in a forward or take to join a
  session before the host gives up naming it (60; 1 to 3600).
- ``SHARDDIT_DIST_WEIGHTS``: what a member keeps. ``share``: only its rank's blocks, the others
  arrive from their owners every step; ``all``: every block, sent once (needs room for the whole
  DiT on every member); ``auto`` (default): ``all`` when every member's free memory holds it.

A bad value is a ValueError naming the variable, the value and the form. ``wait_for_port`` is what
``worker --join`` and the host's Ray driver run before Ray's own client (which waits silently, then
prints a traceback): a name that does not resolve is said at once (``HostUnresolved``), not as a
timeout; then it says within ``PROGRESS_S`` what it waits for, and gives up after ``wait_s``.
"""
from __future__ import annotations

import math
import os
import socket
import time
from ..errors import InputError, ShardDiTError

__all__ = ["ADDR_FORM", "DEFAULT_PORT", "DEFAULT_TIMEOUT_S", "PROBE_S", "PROGRESS_S", "REPEAT_S", "TIMEOUT_ENV",
           "TIMEOUT_RANGE_S", "WEIGHTS_ENV", "WEIGHTS_MODES", "HostUnreachable", "HostUnresolved", "dist_timeout",
           "dist_weights", "parse_addr", "resolve_host", "wait_for_port"]

TIMEOUT_ENV = "SHARDDIT_DIST_TIMEOUT"
WEIGHTS_ENV = "SHARDDIT_DIST_WEIGHTS"
WEIGHTS_MODES = ("auto", "share", "all")
DEFAULT_PORT = 6379
"""Ray's GCS port, when an address gives none."""
DEFAULT_TIMEOUT_S = 60.0
ADDR_FORM = f"HOST:PORT with a port 1-65535, e.g. 192.168.1.10:{DEFAULT_PORT}"
TIMEOUT_RANGE_S = (1.0, 3600.0)
"""Seconds ``SHARDDIT_DIST_TIMEOUT`` may be: below 1 s no gloo session opens; above an hour a dead
member would hold the host for longer than anyone waits."""
PROBE_S = 1.0
PROGRESS_S = 2.0
REPEAT_S = 30.0


def parse_addr(text: str, what: str) -> tuple[str, int]:
    """``"HOST:PORT"`` (or ``"HOST"``: port 6379; ``"[::1]:PORT"`` for IPv6) -> (host, port);
    ValueError naming ``what``, the text and the form."""
    text = (text or "").strip()
    host, _, port = text.rpartition(":") if ":" in text else (text, "", str(DEFAULT_PORT))
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    ok = host and not any(c.isspace() for c in host) and port.isascii() and port.isdigit()
    if not ok or not 0 < int(port) < 65536:
        raise InputError(f"{what}={text!r} is not {ADDR_FORM}")
    return host, int(port)


def dist_timeout() -> float:
    """``SHARDDIT_DIST_TIMEOUT`` in seconds (60 when unset); ValueError naming the value and the
    range (``TIMEOUT_RANGE_S``) for anything else: nan, inf, 0, 1e-9 or words."""
    text = os.environ.get(TIMEOUT_ENV, "").strip()
    if not text:
        return DEFAULT_TIMEOUT_S
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    low, high = TIMEOUT_RANGE_S
    if not math.isfinite(value) or not low <= value <= high:
        raise InputError(f"{TIMEOUT_ENV}={text!r} is not a number of seconds from {low:g} to {high:g} "
                         f"(e.g. {DEFAULT_TIMEOUT_S:g}, the default when unset)")
    return value


def dist_weights() -> str:
    """``SHARDDIT_DIST_WEIGHTS``: ``auto`` (default), ``share`` or ``all``."""
    text = os.environ.get(WEIGHTS_ENV, "").strip().lower() or "auto"
    if text not in WEIGHTS_MODES:
        raise InputError(f"{WEIGHTS_ENV}={text!r} must be one of {', '.join(WEIGHTS_MODES)} "
                         "(share: each member keeps its share; all: every block on every member)")
    return text


class HostUnresolved(ShardDiTError, ConnectionError):
    """The host name does not resolve (a typo, or no DNS entry for it on this machine)."""


class HostUnreachable(ShardDiTError, ConnectionError):
    """Nothing answered as a ShardDiT host at the address within the wait."""


def resolve_host(host: str, port: int) -> str:
    """The first address ``host`` resolves to (IPv4 first), for a TCP connection to ``port``;
    ``HostUnresolved`` naming the host and the resolver's reason."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError) as e:
        raise HostUnresolved(f"the host name {host!r} does not resolve ({e}); check the spelling, or give "
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
            raise HostUnreachable(f"nothing answered at {where} within {wait_s:g} s ({reason})"
                                  + (f"; {hint}" if hint else ""))
        if now >= next_say:
            waited = f"{now - start:.0f} s" if now - start >= 10 else "no answer yet"
            say(f"[ShardDiT] waiting for the host at {where} ({waited}: {reason}"
                + (f"; {hint}" if hint else "") + ")")
            next_say = now + REPEAT_S
        time.sleep(max(0.0, min(PROBE_S, start + wait_s - time.monotonic())))
