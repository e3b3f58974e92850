"""The sessions' rendezvous actor: every key of a session's torch.distributed rendezvous lives in
this small Ray actor on the host's node, so rendezvous traffic travels only over Ray's
token-authenticated calls and no port of ours listens (``group.RayStore`` reaches it).

``RendezvousBoard`` is an async actor: a blocking ``get`` / ``wait`` awaits a condition, bounded by
its timeout, without holding up other calls. Each session writes under a fresh space, dropped when
it closes or fails to form (a late write is refused). Shipped to the host's node by value
(``driver.start_board``): it imports only the standard library.
"""
from __future__ import annotations

import asyncio

__all__ = ["RendezvousBoard"]


class RendezvousBoard:
    """Key spaces of sessions' rendezvous (``space`` -> ``{key: bytes}``). Async actor: every method
    runs on the actor's event loop, so a waiting ``get`` leaves the others free."""

    def __init__(self):
        self.spaces: dict[str, dict[str, bytes]] = {}
        self._changed: asyncio.Condition | None = None

    def _cond(self) -> asyncio.Condition:
        if self._changed is None:
            self._changed = asyncio.Condition()
        return self._changed

    def _space(self, space: str) -> dict[str, bytes]:
        if space not in self.spaces:
            raise LookupError(f"[ShardDiT] the rendezvous space {space[:8]}... is closed (its session formed, "
                              "failed or ended)")
        return self.spaces[space]

    async def _changed_now(self) -> None:
        async with self._cond():
            self._cond().notify_all()

    async def _until(self, ready, timeout_s: float) -> bool:
        """Wait until ``ready()`` (True) or ``timeout_s`` passed (False)."""
        cond = self._cond()
        async with cond:
            try:
                await asyncio.wait_for(cond.wait_for(ready), timeout=max(0.0, timeout_s))
                return True
            except asyncio.TimeoutError:
                return False

    async def ping(self) -> bool:
        return True

    async def open(self, space: str) -> None:
        self.spaces.setdefault(space, {})

    async def close(self, space: str) -> bool:
        """Drop ``space`` and its keys; its waiters return at once."""
        found = self.spaces.pop(space, None) is not None
        await self._changed_now()
        return found

    async def open_spaces(self) -> list[str]:
        return sorted(self.spaces)

    async def items(self, space: str) -> dict[str, bytes]:
        """Every key of ``space`` and its value (for tests and diagnosis)."""
        return dict(self._space(space))

    async def set(self, space: str, key: str, value: bytes) -> None:
        self._space(space)[key] = bytes(value)
        await self._changed_now()

    async def get(self, space: str, key: str, timeout_s: float) -> bytes | None:
        """``key``'s value once set, None when it is not within ``timeout_s``."""
        if not await self._until(lambda: space not in self.spaces or key in self.spaces[space], timeout_s):
            return None
        return self._space(space)[key]

    async def add(self, space: str, key: str, amount: int) -> int:
        values = self._space(space)
        total = int(values.get(key, b"0")) + int(amount)
        values[key] = str(total).encode()
        await self._changed_now()
        return total

    async def compare_set(self, space: str, key: str, expected: bytes, desired: bytes) -> bytes:
        """c10d's compare-and-set: set ``desired`` when ``key`` holds ``expected`` (or is unset and
        ``expected`` is empty); returns the value it holds afterwards (``expected`` when unset)."""
        values = self._space(space)
        if key not in values:
            if expected:
                return bytes(expected)
        elif values[key] != bytes(expected):
            return values[key]
        values[key] = bytes(desired)
        await self._changed_now()
        return values[key]

    async def wait(self, space: str, keys: list[str], timeout_s: float) -> bool:
        """Whether every one of ``keys`` is set within ``timeout_s``."""
        return await self._until(lambda: space not in self.spaces or all(k in self.spaces[space] for k in keys),
                                 timeout_s) and all(k in self._space(space) for k in keys)

    async def check(self, space: str, keys: list[str]) -> bool:
        values = self._space(space)
        return all(k in values for k in keys)

    async def delete_key(self, space: str, key: str) -> bool:
        found = self._space(space).pop(key, None) is not None
        await self._changed_now()
        return found

    async def num_keys(self, space: str) -> int:
        return len(self._space(space))
