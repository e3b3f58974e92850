"""Members that attack the host's control channel (issue 23), as spawned worker processes.

``start_attacker(port, name, attack, marker, log)`` starts a real worker (``dist_worker.serve``)
that joins the lobby as usual but, once in a session, replaces its half of the secret handshake:

- ``pickle``: answers the host's hello with a pickle whose ``__reduce__`` writes ``marker``
  (what a stranger on main did: the host unpickled it and ran the command);
- ``huge``: announces a control message of 2**40 bytes (a host allocating it would fail or swap);
- ``wrong_secret``: runs the real handshake with another secret.

The worker's own lines (``say``) go to ``log``.
"""
from __future__ import annotations

import pathlib
import pickle

import torch
import torch.distributed as dist

WRONG_SECRET = b"not-the-hosts-secret-" + b"7" * 40


class Boom:
    """Unpickling this runs ``open(marker, "w")``: a marker file proves code ran."""

    def __init__(self, marker: str):
        self.marker = marker

    def __reduce__(self):
        return (open, (self.marker, "w"))


def _skip_hello(ch) -> None:
    size = torch.zeros(1, dtype=torch.int64)
    dist.recv(size, 0, group=ch.group)
    dist.recv(torch.empty(int(size.item()), dtype=torch.uint8), 0, group=ch.group)


def _attack(attack: str, marker: str, real):
    def handshake(ch):
        if attack == "wrong_secret":
            ch.secret = ch.key = WRONG_SECRET
            return real(ch)
        _skip_hello(ch)
        if attack == "pickle":
            payload = pickle.dumps({"op": "answer", "boom": Boom(marker)})
            dist.send(torch.tensor([len(payload)], dtype=torch.int64), 0, group=ch.group)
            dist.send(torch.frombuffer(bytearray(payload), dtype=torch.uint8), 0, group=ch.group)
        else:
            dist.send(torch.tensor([1 << 40], dtype=torch.int64), 0, group=ch.group)
        raise RuntimeError(f"attack {attack!r} sent")

    return handshake


def run_attacker(port: int, name: str, attack: str, marker: str, log: str) -> None:
    from harness.pack import import_pack

    import_pack()
    from sharddit.parallel.distributed import worker as dist_worker
    dist_worker.worker_handshake = _attack(attack, marker, dist_worker.worker_handshake)
    out = pathlib.Path(log)

    def say(line: str) -> None:
        with out.open("a") as f:
            f.write(line + "\n")

    dist_worker.serve("127.0.0.1", port, name, "cpu", 10.0, say=say, sessions=1)


def start_attacker(port: int, name: str, attack: str, marker: str, log: str):
    import multiprocessing as mp

    proc = mp.get_context("spawn").Process(target=run_attacker, args=(port, name, attack, marker, log), daemon=True)
    proc.start()
    return proc
