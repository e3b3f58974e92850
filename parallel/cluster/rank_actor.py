"""The Ray actor a remote rank runs: one per member ``NAME/DEVICE``, pinned to that member's node.

Shipped to the worker nodes by value (``driver.rank_actor_class``): a worker runs ``ray start`` from
ComfyUI's Python, where the pack is a folder, not a package, so this imports only the standard
library, torch and Ray. It imports the pack from ``SHARDDIT_PACK_DIR`` and hands everything to
``rank_server.RankServer``.
"""
from __future__ import annotations

import importlib
import importlib.util
import os
import socket
import sys

PACK_DIR_ENV = "SHARDDIT_PACK_DIR"
"""Set by ``python <pack-dir> worker --ray`` for its node: where the pack lies on that machine."""
SETUP_ENV = "SHARDDIT_RANK_SETUP"
"""``module:function`` the rank calls once with its device before serving (the worker command sets
ComfyUI's: import it, register its block builders)."""
IMPORTS_ENV = "SHARDDIT_WORKER_IMPORTS"
"""Comma-separated modules a rank imports before serving (block families of other packs; tests' toys)."""


class RankWorker:
    """One remote rank. ``member`` is ``NAME/DEVICE``; ``device`` is numbered as the worker command's
    ``--devices`` numbered it (Ray hands this node no GPUs, so it leaves ``CUDA_VISIBLE_DEVICES`` as
    the worker command had it: ``node.py``)."""

    def __init__(self, member: str, device: str):
        self.member = member
        self.device = device
        self.rank = None
        """The pack's ``cluster.rank_server.RankServer``, made on the first session (``_server``)."""

    def where(self) -> dict:
        """Where this rank runs: Ray node id, host name, pid, device, ``CUDA_VISIBLE_DEVICES``."""
        import ray

        return {"member": self.member, "node_id": ray.get_runtime_context().get_node_id(),
                "host": socket.gethostname(), "pid": os.getpid(), "device": self.device,
                "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"), "threads": _torch_threads()}

    def _server(self):
        """The pack's RankServer, imported from this node's pack folder the first time (the pack
        under the name ``sharddit``, as ``python <pack-dir>`` imports it), after the node's setup."""
        if self.rank is None:
            pack = _import_pack()
            setup = os.environ.get(SETUP_ENV, "")
            comfyui = ""
            if setup:
                module, _, func = setup.partition(":")
                comfyui = getattr(importlib.import_module(module), func)(self.device) or ""
            for module in filter(None, (m.strip() for m in os.environ.get(IMPORTS_ENV, "").split(","))):
                importlib.import_module(module)
            self.rank = importlib.import_module(f"{pack}.parallel.cluster.rank_server").RankServer(
                self.member, self.device, comfyui)
        return self.rank

    def offer(self) -> dict:
        """This member's offer (device, free bytes, GPU, versions)."""
        return self._server().offer()

    def join_session(self, board, space: str, rank: int, world: int, timeout_s: float, backend: str,
                     group_keys: list) -> int:
        """Join a sampling session through the host's rendezvous actor ``board`` (``RankServer.join``)."""
        return self._server().join(board, space, rank, world, timeout_s, backend, group_keys)

    def command(self, payload: bytes) -> bytes:
        """One command of the session (``RankServer.command``): payload in, payload out."""
        return self._server().command(payload)

    def leave(self) -> bool:
        """Leave the session's group (the actor stays, for the next session)."""
        return self.rank.leave() if self.rank is not None else True

    def ping(self) -> str:
        return self.member

    def open_files(self) -> int:
        """This process's open files (-1 where ``/proc`` does not list them): gloo keeps a stranger's
        connections to its listeners open until the session ends (``host.ClusterHost``)."""
        try:
            return len(os.listdir("/proc/self/fd"))
        except OSError:
            return -1


def _import_pack() -> str:
    """The pack's package name in this process: ``sharddit``, imported by path from
    ``SHARDDIT_PACK_DIR`` unless already imported."""
    if "sharddit" not in sys.modules:
        pack_dir = os.environ.get(PACK_DIR_ENV, "")
        init = os.path.join(pack_dir, "__init__.py")
        if not pack_dir or not os.path.isfile(init):
            raise RuntimeError(f"[ShardDiT] this Ray node does not say where the ShardDiT pack is ({PACK_DIR_ENV}="
                               f"{pack_dir!r}): start it with `python <pack-dir> worker --ray --join ...`")
        spec = importlib.util.spec_from_file_location("sharddit", init, submodule_search_locations=[pack_dir])
        module = importlib.util.module_from_spec(spec)
        sys.modules["sharddit"] = module
        spec.loader.exec_module(module)
    return "sharddit"


def _torch_threads() -> int:
    """torch's intra-op threads here (Ray sets ``OMP_NUM_THREADS`` for its workers)."""
    import torch

    return torch.get_num_threads()


def free_bytes(device: str) -> int:
    """Free memory of ``device`` on this node (a Ray task's view, no actor, no pack import): the
    GPU's free bytes (numbered as the worker command's ``--devices``), or available RAM for cpu."""
    if device.startswith("cuda"):
        import torch

        return int(torch.cuda.mem_get_info(torch.device(device))[0])
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError):
        return 0
