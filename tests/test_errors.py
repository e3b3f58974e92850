"""The one error type: every error the pack raises for a person is a ``ShardDiTError`` whose message
carries ``[ShardDiT]`` exactly once, added by the type; no message types it and no caller strips it."""
import ast
import pickle
from pathlib import Path

import pytest

from sharddit.parallel.errors import (
    PREFIX,
    InputError,
    InputTypeError,
    NotSupported,
    RunError,
    ShardDiTError,
    WaitTimeout,
    reason_of,
)

pytestmark = pytest.mark.no_blas

REPO = Path(__file__).resolve().parents[1]
KINDS = [(InputError, ValueError), (InputTypeError, TypeError), (RunError, RuntimeError),
         (NotSupported, NotImplementedError), (WaitTimeout, TimeoutError)]
SHIPPED_BY_VALUE = {"parallel/cluster/rank_actor.py", "parallel/cluster/rendezvous.py"}
"""Sent to Ray nodes as source (standard library only): they cannot import the pack's error type."""
TORCH_TYPED = {"DistStoreError"}
"""``RayStore`` (a ``torch.distributed.Store``) must raise torch's own error, which c10d catches by type."""


@pytest.mark.parametrize(("kind", "builtin"), KINDS)
def test_each_kind_is_the_pack_error_and_the_builtin_it_always_was(kind, builtin):
    err = kind("devices 'cuda:9' does not exist")
    assert isinstance(err, ShardDiTError) and isinstance(err, builtin)
    assert str(err) == "[ShardDiT] devices 'cuda:9' does not exist"
    assert err.reason == "devices 'cuda:9' does not exist"
    with pytest.raises(builtin, match=r"^\[ShardDiT\] devices"):
        raise err


def test_the_prefix_is_there_once_whatever_the_message_starts_with():
    once = InputError(f"{PREFIX}already prefixed")
    assert str(once) == "[ShardDiT] already prefixed"
    wrapped = RunError(f"--workers box2: {reason_of(once)}")
    assert str(wrapped) == "[ShardDiT] --workers box2: already prefixed"
    assert reason_of(ValueError("plain")) == "plain"


def test_a_pickled_copy_keeps_one_prefix():
    """Errors cross processes pickled (Ray actors, the rank threads' pool): the copy reads the same."""
    err = pickle.loads(pickle.dumps(WaitTimeout("rank 1 did not answer within 20 s")))
    assert type(err) is WaitTimeout and str(err) == "[ShardDiT] rank 1 did not answer within 20 s"


def test_the_pack_errors_of_each_room_are_pack_errors():
    from sharddit.parallel.cluster.settings import ClusterError, ClusterInsecure
    from sharddit.parallel.distributed.block_specs import BlockMismatch
    from sharddit.parallel.distributed.config import HostUnreachable, HostUnresolved
    from sharddit.parallel.distributed.exchange import DistPeerError
    from sharddit.parallel.distributed.members import DistWorkerError
    from sharddit.parallel.distributed.protocol import ProtocolError
    from sharddit.parallel.placement.plan_text import PlacementError
    from sharddit.parallel.sequence.threads import RankThreadError

    for cls in (ClusterError, ClusterInsecure, BlockMismatch, HostUnreachable, HostUnresolved, DistPeerError,
                DistWorkerError, ProtocolError, PlacementError, RankThreadError):
        assert issubclass(cls, ShardDiTError), cls
    assert str(HostUnresolved("the host name 'x' does not resolve")).startswith("[ShardDiT] the host")
    assert issubclass(HostUnresolved, ConnectionError) and issubclass(ClusterError, RuntimeError)


def _product_files():
    yield REPO / "__init__.py"
    for top in ("nodes", "loaders", "parallel"):
        yield from sorted((REPO / top).rglob("*.py"))


def hand_prefixed(source: str) -> list[tuple[int, str]]:
    """(line, callee) of every call to an error type whose message literal starts with ``[ShardDiT]``."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Call) or not node.args:
            continue
        callee = node.func.id if isinstance(node.func, ast.Name) else getattr(node.func, "attr", "")
        if not (callee.endswith(("Error", "Exception", "Exit", "Mismatch", "Unresolved", "Unreachable"))):
            continue
        first = node.args[0]
        while isinstance(first, ast.BinOp):
            first = first.left
        if isinstance(first, ast.JoinedStr) and first.values:
            first = first.values[0]
        if isinstance(first, ast.Constant) and isinstance(first.value, str) and first.value.startswith("[ShardDiT]"):
            found.append((node.lineno, callee))
    return found


def test_no_error_message_types_the_prefix_by_hand():
    hits = []
    for path in _product_files():
        rel = path.relative_to(REPO).as_posix()
        if rel in SHIPPED_BY_VALUE or rel == "parallel/errors.py":
            continue
        hits += [f"{rel}:{line} {callee}" for line, callee in hand_prefixed(path.read_text()) if callee not in TORCH_TYPED]
    assert not hits, "raise the pack's error type (parallel/errors.py), which adds '[ShardDiT] ' itself:\n" + \
        "\n".join(hits)


def test_the_hand_prefix_checker_catches():
    source = ('raise ValueError(f"[ShardDiT] devices {x!r}")\n'
              'err = RunError("[ShardDiT] " + why)\n'
              'raise InputError("devices")\n'
              'log.info("[ShardDiT] a log line is not an error")\n')
    assert hand_prefixed(source) == [(1, "ValueError"), (2, "RunError")]


BUILT_IN_KINDS = {"ValueError": "InputError", "TypeError": "InputTypeError", "RuntimeError": "RunError",
                  "NotImplementedError": "NotSupported", "TimeoutError": "WaitTimeout"}
"""A built-in error the pack raises, and the pack's kind that replaces it (the same built-in, with the prefix)."""
PLAIN_ALLOWED = {
    "parallel/cluster/rank_actor.py": "sent to Ray nodes as source (standard library only): it cannot import the "
                                      "pack's error type, so its one RuntimeError types the prefix by hand",
}
"""Product files that may still raise a built-in of ``BUILT_IN_KINDS``, each with its reason."""


def plain_builtin_errors(source: str) -> list[tuple[int, str]]:
    """(line, name) of every built-in error of ``BUILT_IN_KINDS`` made (``ValueError(...)``, raised or kept
    to raise later) or raised bare (``raise ValueError``): its message would lack the prefix."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in BUILT_IN_KINDS:
            found.append((node.lineno, node.func.id))
        elif isinstance(node, ast.Raise) and isinstance(node.exc, ast.Name) and node.exc.id in BUILT_IN_KINDS:
            found.append((node.lineno, node.exc.id))
    return sorted(found)


def test_no_product_code_raises_a_plain_built_in_error():
    """A plain ``raise ValueError(...)`` reads without ``[ShardDiT]``: product code raises the pack's kind
    (``InputError`` is still a ValueError, so ``except ValueError`` around a call behaves as it did)."""
    hits = []
    for path in _product_files():
        rel = path.relative_to(REPO).as_posix()
        if rel in PLAIN_ALLOWED or rel == "parallel/errors.py":
            continue
        hits += [f"{rel}:{line} {name} -> {BUILT_IN_KINDS[name]}" for line, name in plain_builtin_errors(path.read_text())]
    assert not hits, "raise the pack's kind (parallel/errors.py), which adds '[ShardDiT] ' itself:\n" + "\n".join(hits)


def test_the_plain_error_checker_catches():
    source = ('raise ValueError(f"devices {x!r}")\n'
              'bad = TypeError("not a string")\n'
              'raise RuntimeError\n'
              'raise InputError("devices")\n'
              'ok = isinstance(err, ValueError)\n'
              'raise WaitTimeout(f"rank 1: {TimeoutError.__name__}")\n')
    assert plain_builtin_errors(source) == [(1, "ValueError"), (2, "TypeError"), (3, "RuntimeError")]


def test_no_caller_strips_the_prefix_again():
    """A message put inside another uses ``reason`` / ``reason_of``, not string surgery on ``str(err)``."""
    hits = [f"{p.relative_to(REPO).as_posix()}:{n}" for p in _product_files()
            for n, line in enumerate(p.read_text().splitlines(), 1) if "removeprefix(" in line and "[ShardDiT]" in line]
    assert not hits, hits
