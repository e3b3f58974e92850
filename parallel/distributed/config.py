"""Settings of distributed `sequence` mode, read from one place each (pure).

- ``SHARDDIT_DIST_ADDR`` (host): ``HOST:PORT`` the ComfyUI host listens on for workers, e.g.
  ``192.168.1.10:29555``; only that interface. Unset: the host accepts no worker and nothing
  listens. Workers give the same address with ``--join HOST:PORT``.
  The address must be private (loopback, RFC 1918, link-local, IPv6 ULA, the 100.64/10 range VPNs
  such as Tailscale use): a wildcard (``0.0.0.0``, ``::``) or a public address is refused unless
  ``SHARDDIT_DIST_PUBLIC=1`` says the user accepts that strangers can reach the lobby (the secret
  still keeps them out; nothing is encrypted).
- ``SHARDDIT_DIST_TIMEOUT``: seconds a worker may stay silent in a forward (block reply, attention
  exchange) or take to join a session before the host gives up with an error naming it (60; 1 to
  3600).
- ``SHARDDIT_DIST_WEIGHTS``: what a worker keeps. ``share``: only the blocks its rank owns (an
  equal share), the others arrive from their owners every step; ``all``: every block, sent once,
  nothing streams per step (needs room for the whole DiT on every worker); ``auto`` (default):
  ``all`` when every worker's free memory holds every block, else ``share``.

A bad value is a ValueError naming the variable, the value and the form; the ComfyUI host logs it
once and keeps distributed mode off (``loaders/comfy/distributed.start_lobby_if_configured``).
"""
from __future__ import annotations

import ipaddress
import math
import os
import socket

__all__ = [
    "ADDR_ENV",
    "ADDR_FORM",
    "DEFAULT_PORT",
    "DEFAULT_TIMEOUT_S",
    "PUBLIC_ENV",
    "TIMEOUT_ENV",
    "TIMEOUT_RANGE_S",
    "WEIGHTS_ENV",
    "WEIGHTS_MODES",
    "check_listen_address",
    "dist_addr",
    "dist_timeout",
    "dist_weights",
    "parse_addr",
]

ADDR_ENV = "SHARDDIT_DIST_ADDR"
PUBLIC_ENV = "SHARDDIT_DIST_PUBLIC"
TIMEOUT_ENV = "SHARDDIT_DIST_TIMEOUT"
WEIGHTS_ENV = "SHARDDIT_DIST_WEIGHTS"
WEIGHTS_MODES = ("auto", "share", "all")
DEFAULT_PORT = 29555
DEFAULT_TIMEOUT_S = 60.0


ADDR_FORM = f"HOST:PORT with a port 1-65535, e.g. 192.168.1.10:{DEFAULT_PORT}"
TIMEOUT_RANGE_S = (1.0, 3600.0)
"""Seconds ``SHARDDIT_DIST_TIMEOUT`` may be: below 1 s no gloo session opens; above an hour a dead
worker, or a stranger holding a session, would hold the host for longer than anyone waits."""


def parse_addr(text: str, what: str = ADDR_ENV) -> tuple[str, int]:
    """``"HOST:PORT"`` (or ``"HOST"``: port 29555; ``"[::1]:PORT"`` for IPv6) -> (host, port);
    ValueError naming ``what``, the text and the form."""
    text = (text or "").strip()
    host, _, port = text.rpartition(":") if ":" in text else (text, "", str(DEFAULT_PORT))
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    ok = host and not any(c.isspace() for c in host) and port.isascii() and port.isdigit()
    if not ok or not 0 < int(port) < 65536:
        raise ValueError(f"[ShardDiT] {what}={text!r} is not {ADDR_FORM}")
    return host, int(port)


def dist_addr() -> tuple[str, int] | None:
    """The host's listen address from ``SHARDDIT_DIST_ADDR``; None when unset (no workers);
    ValueError naming the variable, the value and the form when it is not ``HOST:PORT``."""
    text = os.environ.get(ADDR_ENV, "").strip()
    if not text:
        return None
    host, port = parse_addr(text)
    check_listen_address(host, os.environ.get(PUBLIC_ENV, "").strip() == "1")
    return host, port


_VPN_RANGE = ipaddress.ip_network("100.64.0.0/10")  # carrier-grade NAT space: Tailscale and other VPNs


def _is_private(address: str) -> bool:
    ip = ipaddress.ip_address(address.split("%")[0])
    if getattr(ip, "ipv4_mapped", None):
        ip = ip.ipv4_mapped
    if ip.is_unspecified:
        return False
    return ip.is_loopback or ip.is_private or ip.is_link_local or (ip.version == 4 and ip in _VPN_RANGE)


def check_listen_address(host: str, public_ok: bool = False) -> None:
    """ValueError naming ``SHARDDIT_DIST_ADDR`` and the fix when ``host`` is a wildcard or resolves
    to a public address, unless ``public_ok`` (``SHARDDIT_DIST_PUBLIC=1``). A name that does not
    resolve is left to the bind, which names it."""
    if public_ok:
        return
    try:
        addresses = {i[4][0] for i in socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)}
    except (socket.gaierror, UnicodeError):
        return
    public = sorted(a for a in addresses if not _is_private(a))
    if public:
        wildcard = any(ipaddress.ip_address(a.split("%")[0]).is_unspecified for a in public)
        what = "every interface" if wildcard else f"the public address {public[0]}"
        raise ValueError(f"[ShardDiT] {ADDR_ENV}={host!r} listens on {what}: anyone on those networks could reach the "
                         "lobby, and weights and activations travel unencrypted. Give this machine's address on a "
                         "private network or VPN (e.g. 192.168.1.10, or its WireGuard address), or set "
                         f"{PUBLIC_ENV}=1 to accept strangers knocking (the shared secret still keeps them out)")


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
        raise ValueError(f"[ShardDiT] {TIMEOUT_ENV}={text!r} is not a number of seconds from {low:g} to {high:g} "
                         f"(e.g. {DEFAULT_TIMEOUT_S:g}, the default when unset)")
    return value


def dist_weights() -> str:
    """``SHARDDIT_DIST_WEIGHTS``: ``auto`` (default), ``share`` or ``all``."""
    text = os.environ.get(WEIGHTS_ENV, "").strip().lower() or "auto"
    if text not in WEIGHTS_MODES:
        raise ValueError(f"[ShardDiT] {WEIGHTS_ENV}={text!r} must be one of {', '.join(WEIGHTS_MODES)} "
                         "(share: each worker keeps its share; all: every block on every worker)")
    return text
