"""``plan --workers HOST:PORT``: the joined workers' offers, read from the host's lobby before
anything is simulated (so an absent host never follows a printed plan).

Contacting a host fails in three ways, each said as itself, within seconds, and without c10d's
log lines (``TCPStore`` writes every failed try with its C++ frames straight to file descriptor 2):
the name does not resolve (``resolve_host``); nothing listens there or the address does not answer
(a plain socket connect, ``_reach``); something listens but no ShardDiT lobby answers (the store
client, its log held back). A wait longer than ``NOTICE_S`` is announced with what it waits for.
"""
from __future__ import annotations

import os
import socket
import stat
import sys
import tempfile
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass

from ...parallel.distributed.config import parse_addr

__all__ = ["CONNECT_TIMEOUT_S", "NOTICE_S", "RAY_PREFIX", "LobbyView", "read_cluster", "read_lobby", "resolve_host",
           "workers_address"]

RAY_PREFIX = "ray:"
"""``plan --workers ray:HOST:PORT``: the members of the Ray cluster at HOST:PORT (its GCS port)."""

CONNECT_TIMEOUT_S = 10.0
"""How long ``plan`` waits for a host's lobby in all (resolving, connecting, the store's answer)."""
NOTICE_S = 2.0
"""After this long, ``plan`` says that it is still waiting and for what."""


@dataclass(frozen=True)
class LobbyView:
    host: str
    port: int
    offers: dict
    """Member ``NAME/DEVICE`` -> offer, as ``distributed/host.read_workers`` gives them."""
    text: str
    """The joined workers as ``distributed/host.describe_workers`` lists them."""


def resolve_host(host: str, port: int, what: str) -> list:
    """``socket.getaddrinfo`` of ``host``; a name that does not resolve is a ValueError that says so
    (not a connection timeout), naming the option ``what`` and the fix.

    One function on purpose: ``worker --join`` needs the same rule; the two can share one helper."""
    try:
        return socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError) as e:
        why = getattr(e, "strerror", None) or str(e)
        raise ValueError(f"[ShardDiT] {what} {host}:{port}: the host name {host!r} does not resolve ({why}): check "
                         f"its spelling, or give the host's IP address (what its SHARDDIT_DIST_ADDR says)") from None


def workers_address(text: str) -> tuple[bool, str]:
    """``--workers`` -> (on Ray, ``HOST:PORT``), checked (ValueError naming the value and the fix)."""
    on_ray = text.startswith(RAY_PREFIX)
    addr = text[len(RAY_PREFIX):] if on_ray else text
    parse_addr(addr, "--workers")
    return on_ray, addr


def read_cluster(addr: str, timeout_s: float = CONNECT_TIMEOUT_S) -> LobbyView:
    """The members' offers and their description from the Ray cluster at ``addr`` (``--workers
    ray:HOST:PORT``): this process joins it as a Ray driver (its token needed, as the host's),
    within ``timeout_s``; ValueError naming the address and why otherwise."""
    from ...parallel.cluster.driver import connect, list_members, probe_free
    from ...parallel.cluster.host import describe_members
    from ...parallel.cluster.settings import ClusterError

    host, port = parse_addr(addr, "--workers")
    try:
        ray = connect(addr, timeout_s)
        offers = probe_free(ray, list_members(ray), timeout_s)
        return LobbyView(host, port, offers, describe_members(addr, offers))
    except ClusterError as e:
        raise ValueError(f"[ShardDiT] --workers {RAY_PREFIX}{addr}: {str(e).removeprefix('[ShardDiT] ')}") from None


def read_lobby(addr: str, timeout_s: float = CONNECT_TIMEOUT_S) -> LobbyView:
    """The offers and the workers' description from the lobby at ``addr`` (``--workers``);
    ValueError naming the address, what failed and the fix."""
    host, port = parse_addr(addr, "--workers")
    from ...parallel.distributed.lobby import require_secret

    require_secret(None, f"--workers {addr} (reading the host's signed lobby)")
    deadline = time.monotonic() + timeout_s
    stage = [f"resolving the name {host!r}"]
    with _notice_after(NOTICE_S, lambda: (f"[ShardDiT] still waiting for the ShardDiT host at {host}:{port} "
                                          f"(--workers): {stage[0]}; giving up after {timeout_s:g} s")):
        infos = resolve_host(host, port, "--workers")
        stage[0] = "connecting (is ComfyUI running there, and the port open in its firewall?)"
        _reach(infos, host, port, deadline)
        stage[0] = "its port is open; waiting for the ShardDiT lobby to answer"
        offers, text = _read_offers(host, port, deadline, {str(info[4][0]).removeprefix("::ffff:") for info in infos})
    return LobbyView(host, port, offers, text)


def _reach(infos: list, host: str, port: int, deadline: float) -> None:
    """A plain TCP connect to one of ``infos``: refused at once when nothing listens (the store
    client would retry until its timeout), a timeout when nothing answers."""
    errors = []
    for family, kind, proto, _, sockaddr in infos:
        with socket.socket(family, kind, proto) as sock:
            sock.settimeout(max(0.1, deadline - time.monotonic()))
            try:
                sock.connect(sockaddr)
                return
            except ConnectionRefusedError:
                errors.append("connection refused: nothing listens on that port")
            except (TimeoutError, socket.timeout):
                errors.append("no answer to the connection")
            except OSError as e:
                errors.append(e.strerror or str(e))
    raise ValueError(f"[ShardDiT] --workers {host}:{port}: {'; '.join(dict.fromkeys(errors))}. Is ComfyUI running "
                     f"there with SHARDDIT_DIST_ADDR={host}:{port}, and that port open in its firewall?")


def _read_offers(host: str, port: int, deadline: float, peers: set) -> tuple[dict, str]:
    """The offers through the store client, in a thread given until ``deadline``. Against a port
    that accepts but never answers, torch 2.14.1's client waits past its own timeout (seen here:
    still waiting after 300 s with a 5 s timeout): its connection is then shut down (``_unstick``)
    so that the thread ends with an error here, not later in the middle of the process's exit."""
    from ...parallel.distributed.lobby import describe_workers, read_workers
    from ...parallel.distributed.worker import connect

    box: dict = {}

    def read() -> None:
        try:
            store = connect(host, port, max(1.0, deadline - time.monotonic()), wait_s=0, say=lambda _: None)
            box["result"] = read_workers(store), describe_workers(store, host, port)
        except Exception as e:  # noqa: BLE001 - reported below, in one line
            box["error"] = e

    with _cpp_log_held_back():
        reader = threading.Thread(target=read, name="sharddit-plan-lobby", daemon=True)
        reader.start()
        reader.join(max(0.0, deadline - time.monotonic()) + 1.0)
        late = reader.is_alive()
        if late:
            _unstick(peers, port)
            reader.join(5.0)
    if "result" in box:
        return box["result"]
    error = None if late else box.get("error")
    from ...parallel.distributed.entries import BadEntry

    if isinstance(error, BadEntry):  # a ShardDiT lobby answered; its signed entry does not verify here
        raise ValueError(f"[ShardDiT] --workers {host}:{port}: the host's lobby entry: {error}; give this machine "
                         "the host's SHARDDIT_DIST_SECRET and the same ShardDiT version")
    root = error.__cause__ or error if error is not None else None  # connect() wraps the store's own error
    why = f"({(str(root).strip().splitlines() or [type(root).__name__])[0]})" if root is not None else \
        "in time: it accepts connections and says nothing"
    raise ValueError(f"[ShardDiT] --workers {host}:{port}: something listens there, but no ShardDiT lobby answered "
                     f"{why}. Give the address in the host's SHARDDIT_DIST_ADDR (not another service's port), and "
                     "check that ComfyUI there logged '[ShardDiT] workers can join'")


def _unstick(peers: set, port: int) -> None:
    """Shut down this process's TCP connections to ``peers`` (addresses) at ``port``: a store
    client blocked in ``recv`` on one gets end-of-stream and raises. Linux (``/proc``); elsewhere
    the blocked thread is left behind (a daemon: the process still exits)."""
    try:
        fds = [int(fd) for fd in os.listdir("/proc/self/fd")]
    except OSError:
        return
    for fd in fds:
        try:
            if not stat.S_ISSOCK(os.fstat(fd).st_mode):
                continue
            sock = socket.socket(fileno=os.dup(fd))
        except OSError:
            continue
        with sock:
            try:
                peer = sock.getpeername()
                if isinstance(peer, tuple) and peer[1] == port and peer[0].removeprefix("::ffff:") in peers:
                    sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


@contextmanager
def _cpp_log_held_back():
    """File descriptor 2 goes to a scratch file while the store client runs: c10d logs each failed
    try with its C++ frames there; the caller reports the failure in one line instead."""
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with tempfile.TemporaryFile() as scratch:
            os.dup2(scratch.fileno(), 2)
            try:
                yield
            finally:
                os.dup2(saved, 2)
    finally:
        os.close(saved)


@contextmanager
def _notice_after(seconds: float, message):
    """Write ``message()`` to this process's stderr once, if the block still runs after ``seconds``.
    Written to a copy of descriptor 2 taken now, so that it shows while the store's log is held back."""
    out = os.dup(2)
    timer = threading.Timer(seconds, lambda: os.write(out, (message() + "\n").encode()))
    timer.daemon = True
    timer.start()
    try:
        yield
    finally:
        timer.cancel()
        timer.join()
        os.close(out)
