"""The shared secret that authenticates the members of a distributed session (pure).

Anyone who can reach ``SHARDDIT_DIST_ADDR`` can write to the host's TCPStore and open sockets to
it: torch.distributed has no authorization of its own (PyTorch's SECURITY.md). Every offer,
invite and control message therefore carries an HMAC-SHA256 keyed by a secret that the host and
its workers read from the environment; what does not verify is ignored.

- ``SHARDDIT_DIST_SECRET``: the secret itself, at least ``MIN_SECRET_CHARS`` characters
  (``python <pack-dir> worker --new-secret`` prints a fresh one: 64 hex digits, 256 bits).
- ``SHARDDIT_DIST_SECRET_FILE``: a file holding it (first line), readable and writable by its
  owner only (mode 0600 or stricter), so the secret stays out of ``ps`` and shell history.

The secret authenticates; it does not encrypt. Weights and activations travel in clear: the
network must be private (a LAN you own, WireGuard or another VPN).
"""
from __future__ import annotations

import hashlib
import hmac
import os
import secrets
import stat

__all__ = ["FILE_ENV", "MIN_SECRET_CHARS", "SECRET_ENV", "dist_secret", "new_secret", "sign", "verify"]

SECRET_ENV = "SHARDDIT_DIST_SECRET"
FILE_ENV = "SHARDDIT_DIST_SECRET_FILE"
MIN_SECRET_CHARS = 32
"""Shorter secrets are refused: 32 hex digits are 128 bits, past any online guessing."""

HOW_TO_MAKE = (f"make one with `python <pack-dir> worker --new-secret` and give the same value to the "
               f"host and every worker as {SECRET_ENV} (or in a file only you can read, named by {FILE_ENV})")


def new_secret() -> str:
    """A fresh secret: 64 hex digits (256 bits) from the OS's random source."""
    return secrets.token_hex(32)


def dist_secret() -> bytes | None:
    """The secret from ``SHARDDIT_DIST_SECRET`` or the file ``SHARDDIT_DIST_SECRET_FILE`` names;
    None when neither is set. ValueError naming the variable and the fix when it is too short, both
    are set, or the file is missing, empty or readable by others."""
    text = os.environ.get(SECRET_ENV, "")
    path = os.environ.get(FILE_ENV, "").strip()
    if text and path:
        raise ValueError(f"[ShardDiT] both {SECRET_ENV} and {FILE_ENV} are set; keep one")
    if path:
        text = _read_secret_file(path)
        where = f"{FILE_ENV}={path!r}"
    else:
        where = SECRET_ENV
    text = text.strip()
    if not text:
        return None
    if len(text) < MIN_SECRET_CHARS:
        raise ValueError(f"[ShardDiT] {where} holds {len(text)} characters, fewer than {MIN_SECRET_CHARS}; "
                         + HOW_TO_MAKE)
    return text.encode("utf-8")


def _read_secret_file(path: str) -> str:
    try:
        info = os.stat(path)
        if os.name == "posix" and info.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
            raise ValueError(f"[ShardDiT] {FILE_ENV}={path!r} is readable by others (mode "
                             f"{stat.S_IMODE(info.st_mode):o}); run `chmod 600 {path}`")
        with open(path, encoding="utf-8") as f:
            text = f.readline()
    except OSError as e:
        raise ValueError(f"[ShardDiT] {FILE_ENV}={path!r} cannot be read ({e.strerror}); " + HOW_TO_MAKE) from None
    if not text.strip():
        raise ValueError(f"[ShardDiT] {FILE_ENV}={path!r} is empty; " + HOW_TO_MAKE)
    return text


def _message(parts) -> bytes:
    # each part length-prefixed, so ("ab", "c") and ("a", "bc") sign differently
    out = bytearray()
    for part in parts:
        data = part if isinstance(part, (bytes, bytearray)) else str(part).encode("utf-8")
        out += len(data).to_bytes(8, "big") + data
    return bytes(out)


def sign(key: bytes, *parts) -> str:
    """HMAC-SHA256 of ``parts`` (bytes or anything ``str`` turns into text) under ``key``, as hex."""
    return hmac.new(key, _message(parts), hashlib.sha256).hexdigest()


def verify(key: bytes, mac, *parts) -> bool:
    """Whether ``mac`` is ``sign(key, *parts)``; compared in constant time; False for a non-string."""
    return isinstance(mac, str) and hmac.compare_digest(mac, sign(key, *parts))
