"""The pack's one error type (pure; imports nothing of the pack).

Every error ShardDiT raises for a person to read is a ``ShardDiTError``: its message names the value
and the fix, and carries the ``[ShardDiT]`` prefix exactly once, added here, so no message types it
and no caller strips it again (``reason`` is the message without it). Each kind below also derives
from the built-in error it has always been (a ``ValueError`` for bad input, a ``RuntimeError`` for a
failure while running, ...), so ``except ValueError`` around a call behaves as it did.
"""
from __future__ import annotations

__all__ = ["PREFIX", "InputError", "InputTypeError", "NotSupported", "RunError", "ShardDiTError", "WaitTimeout", "reason_of"]

PREFIX = "[ShardDiT] "


class ShardDiTError(Exception):
    """Base of every error of the pack. ``ShardDiTError("x")`` reads ``[ShardDiT] x``; a message that
    already starts with the prefix (a pickled copy, a message that wraps another's) keeps one."""

    def __init__(self, message: object = "", *args: object) -> None:
        text = str(message)
        super().__init__(text if text.startswith(PREFIX) else PREFIX + text, *args)

    @property
    def reason(self) -> str:
        """The message without the prefix, for a caller that puts it inside a message of its own."""
        return str(self.args[0]).removeprefix(PREFIX) if self.args else ""


def reason_of(err: BaseException) -> str:
    """``err``'s message without the pack's prefix, whatever its type (for wrapping in another message)."""
    return err.reason if isinstance(err, ShardDiTError) else str(err)


class InputError(ShardDiTError, ValueError):
    """Something given (a node input, a flag, a file, a setting) cannot be used; the message says the fix."""


class InputTypeError(ShardDiTError, TypeError):
    """Something given has the wrong type."""


class RunError(ShardDiTError, RuntimeError):
    """A failure while running (a rank, a worker, the cluster), said with its cause."""


class NotSupported(ShardDiTError, NotImplementedError):
    """A model feature the current mode cannot run; the message names the mode that can."""


class WaitTimeout(ShardDiTError, TimeoutError):
    """A bounded wait ran out (``SHARDDIT_DIST_TIMEOUT``, a rank's timeout)."""
