"""Byte units and the one GiB formatter of the pack (pure; imports nothing of the pack).

Every message that states memory says GiB (2**30 bytes) with this formatter, so figures in errors,
logs and the Plan node's text read alike. At the top of ``parallel/`` because placement, cost and
distributed code all print memory; ``loaders/`` imports it too.
"""
from __future__ import annotations

__all__ = ["GiB", "MiB", "format_gib"]

GiB = 1 << 30
MiB = 1 << 20


def format_gib(n_bytes: float, digits: int = 1) -> str:
    """``n_bytes`` in GiB with ``digits`` decimals, no unit (``"12.3"``)."""
    return f"{n_bytes / GiB:.{digits}f}"
