"""The ``torch.distributed.Store`` of a session's rendezvous on Ray (``rendezvous.RendezvousBoard``).

Each process of a session (the host, each member's rank server) hands a ``RayStore`` to
``init_process_group``; gloo's and NCCL's rendezvous calls go through it. Every call is one Ray
call to the board (token-authenticated: no port of ours listens), every wait bounded by
``timeout_s``; a failure or timeout is ``DistStoreError``. (c10d lets Python subclass ``Store``:
gloo calls ``set``, ``get`` and ``wait``, NCCL ``set`` / ``get`` for its unique ids; the rest are
here for ``new_group`` and c10d's helpers.)
"""
from __future__ import annotations

import datetime

import torch.distributed as dist

__all__ = ["RayStore"]

_CALL_SLACK_S = 5.0
"""How much longer than the board's own wait a caller waits for the board's answer."""


class RayStore(dist.Store):
    """The session's store in one process: every call goes to ``board`` (a ``RendezvousBoard``
    handle) under ``space``; a blocking ``get`` / ``wait`` waits at most ``timeout_s``."""

    def __init__(self, ray, board, space: str, timeout_s: float):
        super().__init__()
        self.ray, self.board, self.space, self.timeout_s = ray, board, space, float(timeout_s)
        self.set_timeout(datetime.timedelta(seconds=self.timeout_s))

    def _call(self, method: str, *args, waits_s: float = 0.0):
        ref = getattr(self.board, method).remote(self.space, *args)
        try:
            return self.ray.get(ref, timeout=waits_s + _CALL_SLACK_S)
        except Exception as err:  # noqa: BLE001 - GetTimeoutError, the board gone (its node), a closed space
            raise dist.DistStoreError(f"[ShardDiT] the session's rendezvous on Ray failed in {method} "
                                      f"({type(err).__name__}: {(str(err).splitlines() or [''])[-1][:200]})") from None

    def _wait_s(self, timeout) -> float:
        if timeout is None:
            return self.timeout_s
        seconds = timeout.total_seconds() if isinstance(timeout, datetime.timedelta) else float(timeout)
        return self.timeout_s if seconds <= 0 else min(seconds, self.timeout_s)

    def set(self, key: str, value) -> None:
        self._call("set", key, bytes(value))

    def get(self, key: str) -> bytes:
        value = self._call("get", key, self.timeout_s, waits_s=self.timeout_s)
        if value is None:
            raise dist.DistStoreError(f"[ShardDiT] the session's rendezvous: key {key!r} was not set within "
                                      f"{self.timeout_s:g} s (a member did not join)")
        return value

    def add(self, key: str, amount: int) -> int:
        return self._call("add", key, int(amount))

    def compare_set(self, key: str, expected, desired) -> bytes:
        return self._call("compare_set", key, bytes(expected), bytes(desired))

    def wait(self, keys, timeout=None) -> None:
        wait_s = self._wait_s(timeout)
        if not self._call("wait", list(keys), wait_s, waits_s=wait_s):
            raise dist.DistStoreError(f"[ShardDiT] the session's rendezvous: keys {list(keys)!r} were not set "
                                      f"within {wait_s:g} s (a member did not join)")

    def check(self, keys) -> bool:
        return self._call("check", list(keys))

    def delete_key(self, key: str) -> bool:
        return self._call("delete_key", key)

    def num_keys(self) -> int:
        return self._call("num_keys")
