"""Child processes for ``DistExchange`` with several positions in one process (pure torch, gloo on
127.0.0.1). Run with ``multiprocessing`` spawn, like ``dist_procs``."""
from __future__ import annotations

import datetime
import os
import signal
import threading
import time

import torch
import torch.distributed as dist

from harness import dist_procs
from harness.pack import import_pack

import_pack()

from sharddit.parallel.distributed.exchange import DistExchange
from sharddit.parallel.sequence.split import plan_groups, rank_slices
from sharddit.parallel.sequence.ulysses import ulysses_attention
from sharddit.parallel.sequence.threads import RankThreads


def peer_labels(group_ranks):
    return [f"position {p} (rank {r})" for p, r in enumerate(group_ranks)]


def multi_rank(rank, group_ranks, port, tokens, heads, head_dim, out_path, timeout_s, fate=None):
    """One process of a gloo group holding the positions ``p`` with ``group_ranks[p] == rank``, one
    thread each: Ulysses attention on their token rows through one ``DistExchange``. ``fate``:
    ``"kill"``: the process kills itself (SIGKILL) once the group exists, before any exchange;
    ``"silent"``: it then sleeps through three timeouts and leaves without a word."""
    world = len(set(group_ranks))
    timeout = datetime.timedelta(seconds=timeout_s)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                            timeout=timeout)
    try:
        group = dist.new_group(list(range(world)), timeout=timeout)  # as dist_host does
        if fate == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        if fate == "silent":
            time.sleep(3 * timeout_s)
            os._exit(0)
        local = [p for p, r in enumerate(group_ranks) if r == rank]
        q, k, v = dist_procs.attention_inputs(1, tokens, heads, head_dim)
        slices = rank_slices(plan_groups(1, len(group_ranks)), tokens)
        pool = RankThreads(["cpu"] * len(local), timeout_s=timeout_s)
        ex = DistExchange(group, group_ranks, dict.fromkeys(local, "cpu"), peer_labels(group_ranks), timeout_s,
                          pool=pool)
        outs, errors, elapsed = {}, {}, {}

        def attend(p):
            t0, t1 = slices[p].tokens
            start = time.monotonic()
            try:
                outs[p] = ulysses_attention(ex, slices[p], tokens, dist_procs.sdpa,
                                            (q[:, t0:t1], k[:, t0:t1], v[:, t0:t1], heads), {})
            except Exception as e:  # noqa: BLE001 - the test reads what each thread raised
                errors[p] = (type(e).__name__, str(e))
            elapsed[p] = time.monotonic() - start

        # Plain threads (not pool.submit) so every thread's own error is kept; the pool only
        # stands for the engine's (its abort would stop the waits).
        threads = [threading.Thread(target=attend, args=(p,)) for p in local]
        for t in threads:
            t.start()
        for t in threads:
            t.join(4 * timeout_s)
        pool.close()
        torch.save({"out": outs, "errors": errors, "elapsed": elapsed,
                    "bytes_received": {p: ex.bytes_received[p] for p in local},
                    "bytes_sent": {p: ex.bytes_sent[p] for p in local},
                    "calls": {p: ex.calls[p] for p in local}}, out_path)
    finally:
        dist.destroy_process_group()
