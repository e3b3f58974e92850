"""Byte-exact tensor and message transport over a torch.distributed process group (pure PyTorch).

The Ulysses exchanges cross processes through torch.distributed only (no home-made sockets):

- **parts**: what one rank sends each other rank in an all-to-all (a tuple of tensors, ``None``
  allowed). ``pack_parts`` writes a fixed-size int64 header per destination (item count, dtype
  codes, shapes) and the raw bytes of every tensor; ``unpack_parts`` rebuilds them bit for bit.
  When both sides know what they exchange (``expect``: the dtype and shape of every item each
  source sends, as Ulysses attention knows from the token and head ranges), no header travels:
  the split sizes follow from ``expect``, and no host sync waits for a header.

  **Host syncs.** Gloo sends host memory: the parts a process sends from a GPU are copied, without
  blocking, into one page-locked buffer, and the host waits once (``host_sync``, the one wait of
  this path) per GPU they came from before gloo reads them; received bytes go to a page-locked
  buffer and on to each destination's device without blocking. So an all-to-all costs a process
  with one GPU position one host sync under gloo, and none in the copies under NCCL (its parts
  stay on the GPU). In-process exchanges (``sequence.threads``) have none.
(The host's commands to a member travel as ``distributed.protocol`` payloads in Ray calls, not here.)

Every size a peer chooses (a length word, a header row, a tensor count) is checked against a
limit before anything is allocated.
"""
from __future__ import annotations

import math

import torch

from .protocol import ProtocolError
from ..sequence.ops import pinned_memory_allowed, real_cuda

__all__ = [
    "HEADER",
    "MAX_PART_BYTES",
    "expect_sizes",
    "host_sync",
    "pack_parts",
    "part_items",
    "part_sizes",
    "receive_buffer",
    "unpack_expected",
    "unpack_parts",
]

HEADER = 96
"""int64 words of one part's header: item count, then per item dtype code (-1: None), ndim,
shape. 96 words hold 8 items of up to 9 dims."""
MAX_ITEMS, MAX_NDIM = 8, 9
MAX_PART_BYTES = 1 << 36
"""Largest part a header may announce (64 GiB: a 720p Wan 14B Ulysses part is about 1 GB)."""
_DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int64, torch.int32,
           torch.int16, torch.int8, torch.uint8, torch.bool, torch.complex64, torch.complex128)
_CODE = {d: i for i, d in enumerate(_DTYPES)}


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


def pack_parts(parts: list, order: list[int], device, header: bool = True):
    """Header rows ``[n, HEADER]`` (None when ``header`` is False: the receivers know the sizes) and
    one byte tensor on ``device`` with every part, destinations in ``order`` (``order[g]`` = the
    index into ``parts`` that goes to group rank ``g``); plus the byte count per destination
    (``all_to_all_single``'s input split sizes). Parts on a GPU bound for host memory are staged
    through one page-locked buffer with one ``host_sync`` per GPU (module docstring)."""
    device = torch.device(device)
    rows, raws, sizes = [], [], []
    for j in order:
        items = part_items(parts[j])
        words, size = [len(items)], 0
        for t in items:
            if t is None:
                words += [-1, 0]
                continue
            if t.dtype not in _CODE:
                raise TypeError(f"[ShardDiT] distributed exchange cannot send dtype {t.dtype}")
            words += [_CODE[t.dtype], t.dim(), *t.shape]
            if t.numel():
                raws.append(t.detach().contiguous().reshape(-1).view(torch.uint8))
                size += raws[-1].numel()
        if len(words) > HEADER:
            raise ValueError(f"[ShardDiT] distributed exchange: part {j} needs {len(words)} header words, "
                             f"at most {HEADER}")
        rows.append(words)
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
    if not header:
        return None, data, sizes
    head = torch.zeros(len(order), HEADER, dtype=torch.int64)
    for g, words in enumerate(rows):
        head[g, :len(words)] = torch.tensor(words, dtype=torch.int64)
    return head.to(device), data, sizes


def _row_specs(row: list[int], where: str) -> list:
    """The items of one received header row as (dtype, shape) or None, checked (ProtocolError)."""
    n, i, out = row[0], 1, []
    if not 0 <= n <= MAX_ITEMS:
        raise ProtocolError(f"{where}: {n} items announced, at most {MAX_ITEMS}")
    for _ in range(n):
        if i + 2 > len(row):
            raise ProtocolError(f"{where}: header row too short")
        code, ndim = row[i], row[i + 1]
        if code == -1:
            out.append(None)
            i += 2
            continue
        if not (0 <= code < len(_DTYPES) and 0 <= ndim <= MAX_NDIM and i + 2 + ndim <= len(row)):
            raise ProtocolError(f"{where}: bad dtype code {code} or {ndim} dims")
        shape = row[i + 2:i + 2 + ndim]
        if any(s < 0 for s in shape):
            raise ProtocolError(f"{where}: negative size in shape {shape}")
        out.append((_DTYPES[code], tuple(shape)))
        i += 2 + ndim
    return out


def _nbytes(spec) -> int:
    return 0 if spec is None else math.prod(spec[1]) * spec[0].itemsize


def part_sizes(header: torch.Tensor, max_bytes: int = MAX_PART_BYTES) -> list[int]:
    """Byte count of each part described by received header rows; ProtocolError for a malformed
    row or a part above ``max_bytes`` (before the receive buffer is allocated)."""
    out = []
    for g, row in enumerate(header.cpu().tolist()):
        size = sum(_nbytes(s) for s in _row_specs(row, f"exchange header {g}"))
        if size > max_bytes:
            raise ProtocolError(f"exchange header {g} announces {size} bytes, more than the limit {max_bytes}")
        out.append(size)
    return out


def unpack_parts(header: torch.Tensor, data: torch.Tensor, device) -> list[tuple]:
    """The parts described by ``header`` (one row per source) out of the received bytes."""
    specs = [_row_specs(row, f"exchange header {g}") for g, row in enumerate(header.cpu().tolist())]
    return unpack_expected(specs, data, device)


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


# ---- control messages --------------------------------------------------------------------------------
