"""Byte-exact tensor and message transport over a torch.distributed process group (pure PyTorch).

Two things cross processes in distributed `sequence` mode, both through torch.distributed only
(no home-made sockets):

- **parts**: what one rank sends each other rank in an all-to-all (a tuple of tensors, ``None``
  allowed). ``pack_parts`` writes a fixed-size int64 header per destination (item count, dtype
  codes, shapes) and the raw bytes of every tensor; ``unpack_parts`` rebuilds them bit for bit.
- **messages**: control commands between the host (rank 0) and one worker: any picklable object
  (tensors inside travel as raw bytes through ``torch.save``), sent as a length then a byte
  tensor with ``send``/``recv`` on the pair's own gloo group.
"""
from __future__ import annotations

import datetime
import io

import torch
import torch.distributed as dist

__all__ = ["HEADER", "RawMessage", "pack_parts", "part_items", "recv_message", "send_message", "unpack_parts"]

HEADER = 96
"""int64 words of one part's header: item count, then per item dtype code (-1: None), ndim,
shape. 96 words hold 8 items of up to 9 dims."""
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


def pack_parts(parts: list, order: list[int], device) -> tuple[torch.Tensor, torch.Tensor, list[int]]:
    """Header rows ``[n, HEADER]`` and one byte tensor with every part, destinations in ``order``
    (``order[g]`` = the index into ``parts`` that goes to group rank ``g``); plus the byte count per
    destination (``all_to_all_single``'s input split sizes)."""
    header = torch.zeros(len(order), HEADER, dtype=torch.int64)
    chunks, sizes = [], []
    for g, j in enumerate(order):
        items = part_items(parts[j])
        words, size = [len(items)], 0
        for t in items:
            if t is None:
                words += [-1, 0]
                continue
            if t.dtype not in _CODE:
                raise TypeError(f"[ShardDiT] distributed exchange cannot send dtype {t.dtype}")
            words += [_CODE[t.dtype], t.dim(), *t.shape]
            raw = t.detach().contiguous().reshape(-1).view(torch.uint8) if t.numel() else None
            if raw is not None:
                chunks.append(raw.to(device))
                size += raw.numel()
        if len(words) > HEADER:
            raise ValueError(f"[ShardDiT] distributed exchange: part {j} needs {len(words)} header words, "
                             f"at most {HEADER}")
        header[g, :len(words)] = torch.tensor(words, dtype=torch.int64)
        sizes.append(size)
    data = torch.cat(chunks) if chunks else torch.empty(0, dtype=torch.uint8, device=device)
    return header.to(device), data, sizes


def part_sizes(header: torch.Tensor) -> list[int]:
    """Byte count of each part described by received header rows."""
    out = []
    for row in header.cpu().tolist():
        n, i, size = row[0], 1, 0
        for _ in range(n):
            code, ndim = row[i], row[i + 1]
            shape = row[i + 2:i + 2 + ndim]
            i += 2 + ndim
            if code >= 0:
                numel = 1
                for s in shape:
                    numel *= s
                size += numel * torch.empty(0, dtype=_DTYPES[code]).element_size()
        out.append(size)
    return out


def unpack_parts(header: torch.Tensor, data: torch.Tensor, device) -> list[tuple]:
    """The parts described by ``header`` (one row per source) out of the received bytes."""
    out, offset = [], 0
    for row in header.cpu().tolist():
        n, i, items = row[0], 1, []
        for _ in range(n):
            code, ndim = row[i], row[i + 1]
            shape = row[i + 2:i + 2 + ndim]
            i += 2 + ndim
            if code < 0:
                items.append(None)
                continue
            dtype = _DTYPES[code]
            numel = 1
            for s in shape:
                numel *= s
            nbytes = numel * torch.empty(0, dtype=dtype).element_size()
            raw = data[offset:offset + nbytes].clone()  # own storage, aligned for the dtype view
            offset += nbytes
            t = raw.view(dtype).reshape(shape) if numel else torch.empty(shape, dtype=dtype)
            items.append(t.to(device))
        out.append(tuple(items))
    return out


def send_message(obj, dst: int, group, timeout_s: float | None = None) -> int:
    """Send a picklable object to ``dst`` (global rank) over ``group``; returns the bytes sent.
    Gives up after ``timeout_s`` (None: the group's own timeout), so a peer that stopped reading
    (hung, frozen) cannot hold the sender forever."""
    buf = io.BytesIO()
    torch.save(obj, buf)
    payload = torch.frombuffer(bytearray(buf.getvalue()), dtype=torch.uint8)
    _wait(dist.isend(torch.tensor([payload.numel()], dtype=torch.int64), dst, group=group), timeout_s)
    _wait(dist.isend(payload, dst, group=group), timeout_s)
    return payload.numel() + 8


def recv_message(src: int, group, timeout_s: float | None = None) -> RawMessage:
    """The next message ``src`` (global rank) sent over ``group`` (``.load()`` rebuilds it); waits up
    to ``timeout_s`` (None: the group's own timeout), then raises."""
    size = torch.zeros(1, dtype=torch.int64)
    _wait(dist.irecv(size, src, group=group), timeout_s)
    payload = torch.empty(int(size.item()), dtype=torch.uint8)
    _wait(dist.irecv(payload, src, group=group), timeout_s)
    return RawMessage(payload.numpy().tobytes())


class RawMessage(bytes):
    """A received message not yet rebuilt: ``load()`` unpickles it (may raise ImportError when the
    sender's classes are missing here, which the caller reports back instead of dying)."""

    def load(self):
        return torch.load(io.BytesIO(self), weights_only=False)


def _wait(work, timeout_s: float | None) -> None:
    if timeout_s is None:
        work.wait()
    else:
        work.wait(datetime.timedelta(seconds=timeout_s))
