"""Byte-exact tensor parts over a torch.distributed process group (pure PyTorch): the Ulysses
exchanges' transport (the host's commands travel as ``protocol`` payloads in Ray calls instead).

*Parts* are what one rank sends each other rank in an all-to-all (a tuple of tensors, ``None``
allowed), sent as their raw bytes only (``pack_parts``). Both sides know what they exchange
(``expect``: the dtype and shape of every item each source sends, which Ulysses attention knows from
the token and head ranges they share), so the split sizes follow from ``expect``, no header travels
and no host sync waits for one; ``unpack_expected`` rebuilds the parts bit for bit and refuses a
byte count other than the expected one. Nothing a peer sends chooses a size here.

**Host syncs.** Gloo sends host memory: parts sent from a GPU are copied, without blocking, into
one page-locked buffer, and the host waits once per source GPU (``host_sync``, the one wait of this
path) before gloo reads them; received bytes go through a page-locked buffer to each device without
blocking. So under gloo an all-to-all costs one host sync per GPU position, none under NCCL.
"""
from __future__ import annotations

import math

import torch

from .protocol import ProtocolError
from ..sequence.ops import pinned_memory_allowed, real_cuda

__all__ = ["expect_sizes", "host_sync", "pack_parts", "part_items", "receive_buffer", "unpack_expected"]

def part_items(part) -> list:
    """The tensors (or None) of one part: a lone tensor, a tuple/list of them, or nothing."""
    if part is None:
        return []
    if isinstance(part, torch.Tensor):
        return [part]
    return list(part)


def host_sync(event) -> None:
    """The host waits for ``event`` (copies into a page-locked buffer gloo is about to read): the one
    host sync of the exchange path, so tests can count them."""
    event.synchronize()


def _on_gpu(device) -> bool:
    return real_cuda(device)


def _host_buffer(nbytes: int, pinned: bool) -> torch.Tensor:
    """Host bytes, page-locked when asked and allowed (ComfyUI's ``--disable-pinned-memory`` turns
    pinning off: ``sequence.ops.set_pinned_memory``; the copies then wait, as pageable copies do)."""
    return torch.empty(nbytes, dtype=torch.uint8, pin_memory=pinned and pinned_memory_allowed())


def _record(device):
    return torch.cuda.current_stream(device).record_event()


def receive_buffer(nbytes: int, wire, local_devices) -> torch.Tensor:
    """Where received bytes land: on ``wire``; page-locked when that is host memory and a local
    position is a GPU (so the copies on to it do not block the host)."""
    wire = torch.device(wire)
    if wire.type == "cpu":
        return _host_buffer(nbytes, any(_on_gpu(d) for d in local_devices))
    return torch.empty(nbytes, dtype=torch.uint8, device=wire)


def pack_parts(parts: list, order: list[int], device):
    """One byte tensor on ``device`` with every part, destinations in ``order`` (``order[g]`` = the
    index into ``parts`` that goes to group rank ``g``), and the byte count per destination
    (``all_to_all_single``'s input split sizes). Parts on a GPU bound for host memory are staged
    through one page-locked buffer with one ``host_sync`` per GPU (module docstring)."""
    device = torch.device(device)
    raws, sizes = [], []
    for j in order:
        size = 0
        for t in part_items(parts[j]):
            if t is not None and t.numel():
                raws.append(t.detach().contiguous().reshape(-1).view(torch.uint8))
                size += raws[-1].numel()
        sizes.append(size)
    gpus = sorted({r.device for r in raws if _on_gpu(r.device)}, key=str)
    staged = device.type == "cpu" and bool(gpus)
    data = _host_buffer(sum(sizes), True) if staged else torch.empty(sum(sizes), dtype=torch.uint8, device=device)
    offset = 0
    for raw in raws:
        data[offset:offset + raw.numel()].copy_(raw, non_blocking=True)
        offset += raw.numel()
    for gpu in gpus if staged else ():
        host_sync(_record(gpu))
    return data, sizes


def _nbytes(spec) -> int:
    return 0 if spec is None else math.prod(spec[1]) * spec[0].itemsize


def expect_sizes(expect: list) -> list[int]:
    """Byte count of each expected part (``expect[g]``: its items as (dtype, shape) or None)."""
    return [sum(_nbytes(s) for s in specs) for specs in expect]


def unpack_expected(expect: list, data: torch.Tensor, device) -> list[tuple]:
    """The parts ``expect`` describes (one list of item specs per source) out of the received bytes,
    each item a tensor of its own on ``device`` (or on ``device[g]`` for part ``g``), copied without
    blocking (from a page-locked buffer to a GPU the host does not wait)."""
    out, offset = [], 0
    for g, specs in enumerate(expect):
        dev = device[g] if isinstance(device, (list, tuple)) else device
        items = []
        for spec in specs:
            if spec is None:
                items.append(None)
                continue
            dtype, shape = spec
            nbytes = _nbytes(spec)
            t = torch.empty(shape, dtype=dtype, device=dev)  # own storage, aligned for the dtype
            if nbytes:
                t.view(-1).view(torch.uint8).copy_(data[offset:offset + nbytes], non_blocking=True)
            offset += nbytes
            items.append(t)
        out.append(tuple(items))
    if offset != data.numel():
        raise ProtocolError(f"exchange: {data.numel()} bytes received, {offset} expected")
    return out
