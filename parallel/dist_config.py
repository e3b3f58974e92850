"""Settings of distributed `sequence` mode, read from one place each (pure).

- ``SHARDDIT_DIST_ADDR`` (host): ``HOST:PORT`` the ComfyUI host listens on for workers, e.g.
  ``192.168.1.10:29555``; only that interface. Unset: the host accepts no worker and nothing
  listens. Workers give the same address with ``--join HOST:PORT``.
- ``SHARDDIT_DIST_TIMEOUT``: seconds a worker may stay silent in a forward (block reply, attention
  exchange) or take to join a session before the host gives up with an error naming it (60).
- ``SHARDDIT_DIST_WEIGHTS``: what a worker keeps. ``share``: only the blocks its rank owns (an
  equal share), the others arrive from their owners every step; ``all``: every block, sent once,
  nothing streams per step (needs room for the whole DiT on every worker); ``auto`` (default):
  ``all`` when every worker's free memory holds every block, else ``share``.
"""
from __future__ import annotations

import os

__all__ = ["ADDR_ENV", "DEFAULT_PORT", "DEFAULT_TIMEOUT_S", "TIMEOUT_ENV", "WEIGHTS_ENV", "WEIGHTS_MODES", "dist_addr",
           "dist_timeout", "dist_weights", "parse_addr"]

ADDR_ENV = "SHARDDIT_DIST_ADDR"
TIMEOUT_ENV = "SHARDDIT_DIST_TIMEOUT"
WEIGHTS_ENV = "SHARDDIT_DIST_WEIGHTS"
WEIGHTS_MODES = ("auto", "share", "all")
DEFAULT_PORT = 29555
DEFAULT_TIMEOUT_S = 60.0


def parse_addr(text: str, what: str = ADDR_ENV) -> tuple[str, int]:
    """``"HOST:PORT"`` (or ``"HOST"``: port 29555) -> (host, port); ValueError naming the text."""
    text = (text or "").strip()
    host, _, port = text.rpartition(":") if ":" in text else (text, "", str(DEFAULT_PORT))
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"[ShardDiT] {what}={text!r} is not HOST:PORT (e.g. 192.168.1.10:{DEFAULT_PORT})")
    return host, int(port)


def dist_addr() -> tuple[str, int] | None:
    """The host's listen address from ``SHARDDIT_DIST_ADDR``; None when unset (no workers)."""
    text = os.environ.get(ADDR_ENV, "").strip()
    return parse_addr(text) if text else None


def dist_timeout() -> float:
    text = os.environ.get(TIMEOUT_ENV, "").strip()
    if not text:
        return DEFAULT_TIMEOUT_S
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if value <= 0:
        raise ValueError(f"[ShardDiT] {TIMEOUT_ENV}={text!r} must be a positive number of seconds")
    return value


def dist_weights() -> str:
    """``SHARDDIT_DIST_WEIGHTS``: ``auto`` (default), ``share`` or ``all``."""
    text = os.environ.get(WEIGHTS_ENV, "").strip().lower() or "auto"
    if text not in WEIGHTS_MODES:
        raise ValueError(f"[ShardDiT] {WEIGHTS_ENV}={text!r} must be one of {', '.join(WEIGHTS_MODES)} "
                         "(share: each worker keeps its share; all: every block on every worker)")
    return text
