"""Settings of distributed `sequence` mode, read from one place each (pure).

- ``SHARDDIT_DIST_TIMEOUT``: seconds a member may stay silent in a forward (block reply, attention
  exchange) or take to join a session before the host gives up with an error naming it (60; 1 to
  3600).
- ``SHARDDIT_DIST_WEIGHTS``: what a member keeps. ``share``: only the blocks its rank owns (an
  equal share), the others arrive from their owners every step; ``all``: every block, sent once,
  nothing streams per step (needs room for the whole DiT on every member); ``auto`` (default):
  ``all`` when every member's free memory holds every block, else ``share``.

The cluster itself (``SHARDDIT_RAY_ADDRESS``) is ``parallel/cluster/settings``. A bad value is a
ValueError naming the variable, the value and the form.
"""
from __future__ import annotations

import math
import os

__all__ = [
    "ADDR_FORM",
    "DEFAULT_PORT",
    "DEFAULT_TIMEOUT_S",
    "TIMEOUT_ENV",
    "TIMEOUT_RANGE_S",
    "WEIGHTS_ENV",
    "WEIGHTS_MODES",
    "dist_timeout",
    "dist_weights",
    "parse_addr",
]

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


def parse_addr(text: str, what: str) -> tuple[str, int]:
    """``"HOST:PORT"`` (or ``"HOST"``: port 6379; ``"[::1]:PORT"`` for IPv6) -> (host, port);
    ValueError naming ``what``, the text and the form."""
    text = (text or "").strip()
    host, _, port = text.rpartition(":") if ":" in text else (text, "", str(DEFAULT_PORT))
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    ok = host and not any(c.isspace() for c in host) and port.isascii() and port.isdigit()
    if not ok or not 0 < int(port) < 65536:
        raise ValueError(f"[ShardDiT] {what}={text!r} is not {ADDR_FORM}")
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
        raise ValueError(f"[ShardDiT] {TIMEOUT_ENV}={text!r} is not a number of seconds from {low:g} to {high:g} "
                         f"(e.g. {DEFAULT_TIMEOUT_S:g}, the default when unset)")
    return value


def dist_weights() -> str:
    """``SHARDDIT_DIST_WEIGHTS``: ``auto`` (default), ``share`` or ``all``."""
    text = os.environ.get(WEIGHTS_ENV, "").strip().lower() or "auto"
    if text not in WEIGHTS_MODES:
        raise ValueError(f"[ShardDiT] {WEIGHTS_ENV}={text!r} must be one of {', '.join(WEIGHTS_MODES)} "
                         "(share: each member keeps its share; all: every block on every member)")
    return text
