"""Batched, multi-device tiled decoding (pure PyTorch).

``plan_decode`` lays out core's tiles (``tiling/geometry``), groups tiles of equal shape and cuts
each group into batches of ``tile_batch_size``. ``run_tiled`` then stacks each batch on the batch
dimension into ONE decoder call, spreads batches over one worker thread per decoder replica
(each thread enters ``torch.inference_mode()`` and, for CUDA, sets its own current device) and
blends results into the output in the calling thread.

Determinism: decoded tiles are blended one by one in core's tile order (a tile that arrives
early waits in a buffer; batches are queued in order of their first tile, so the buffer holds
about ``tile_batch_size`` tiles per group), with core's exact fp32 operations. The output
therefore does not depend on arrival order or on how many replicas run, and equals core's bit for
bit when the decoder gives the same numbers for a tile alone and in a batch. Batched convolutions
may round differently from single ones: then outputs agree within 1e-5 (fp32), not bit for bit.

Interrupts: ``check_interrupt()`` (a callable that raises, e.g. ComfyUI's
``throw_exception_if_processing_interrupted``) is called after every blended batch and while
waiting; when it raises, workers take no further batch, are joined, and the exception is
re-raised. A worker's exception is re-raised the same way. Decoders are never shared between
threads, and no thread outlives ``run_tiled``.
"""
from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from .geometry import Tile, TileSpec, feather_mask, group_tiles, make_batches, plan_tiles
from ..errors import InputError, RunError

__all__ = ["TilePlan", "plan_decode", "run_tiled"]

log = logging.getLogger("sharddit")
_POLL_S = 0.05


@dataclass(frozen=True)
class TilePlan:
    """What ``run_tiled`` will decode: tiles in core's order and the batches (decoder calls)."""

    spec: TileSpec
    latent_shape: tuple[int, ...]
    out_channels: int
    tiles: tuple[Tile, ...]
    batches: tuple[tuple[Tile, ...], ...]
    """One decoder call each; tiles of a batch have equal latent size; ordered by first tile."""

    @property
    def out_shape(self) -> tuple[int, ...]:
        return self.spec.out_shape(self.latent_shape, self.out_channels)


def plan_decode(latent_shape, spec: TileSpec, out_channels: int,
                tile_batch_size: int | Callable[[Sequence[Tile]], int] = 1) -> TilePlan:
    """Tiles and batches for ``latent_shape``; ``tile_batch_size`` is an int or ``group -> int``."""
    tiles = plan_tiles(latent_shape, spec)
    batches = sorted(make_batches(group_tiles(tiles), tile_batch_size), key=lambda b: b[0].index)
    return TilePlan(spec, tuple(latent_shape), int(out_channels), tuple(tiles), tuple(tuple(b) for b in batches))


def _tile_input(samples: torch.Tensor, tile: Tile) -> torch.Tensor:
    x = samples[tile.batch:tile.batch + 1]
    for d, (start, size) in enumerate(zip(tile.start, tile.size)):
        x = x.narrow(d + 2, start, size)
    return x


def _batch_input(samples: torch.Tensor, batch: Sequence[Tile]) -> torch.Tensor:
    if len(batch) == 1:  # the narrowed view itself, exactly what core passes
        return _tile_input(samples, batch[0])
    return torch.cat([_tile_input(samples, t) for t in batch], dim=0)


class _Workers:
    """One thread per decoder; batch indices from a shared queue, results to ``results``."""

    def __init__(self, samples, plan: TilePlan, decoders, devices, output_device):
        self.todo: queue.Queue = queue.Queue()
        for i in range(len(plan.batches)):
            self.todo.put(i)
        self.results: queue.Queue = queue.Queue()
        self.stop = threading.Event()
        self.threads = [
            threading.Thread(target=self._work, name=f"sharddit-vae-{k}", daemon=True,
                             args=(samples, plan.batches, dec, dev, output_device))
            for k, (dec, dev) in enumerate(zip(decoders, devices))
        ]
        for t in self.threads:
            t.start()

    def _work(self, samples, batches, decoder, device, output_device) -> None:
        try:
            device = torch.device(device) if device is not None else None
            if device is not None and device.type == "cuda":
                torch.cuda.set_device(device)
            with torch.inference_mode():
                while not self.stop.is_set():
                    try:
                        i = self.todo.get_nowait()
                    except queue.Empty:
                        return
                    out = decoder(_batch_input(samples, batches[i])).to(output_device)
                    self.results.put((i, out))
        except BaseException as err:  # noqa: BLE001 - handed to the main thread and re-raised there
            self.stop.set()
            self.results.put((None, err))

    def alive(self) -> bool:
        return any(t.is_alive() for t in self.threads)

    def close(self) -> None:
        self.stop.set()
        for t in self.threads:
            t.join()


class _Blender:
    """Accumulates ``decoded * mask`` and ``mask`` exactly like core, then normalises."""

    def __init__(self, plan: TilePlan, output_device):
        shape = plan.out_shape
        self.out = torch.zeros(shape, device=output_device)
        self.weight = torch.zeros((shape[0], 1) + shape[2:], device=output_device)
        self.feathers = [plan.spec.feather(d) for d in range(plan.spec.dims)]
        self.masks: dict[tuple, torch.Tensor] = {}
        self.device = output_device

    def add(self, tile: Tile, ps: torch.Tensor) -> None:
        """Core's ``o.add_(ps * mask); o_d.add_(mask)`` for one decoded tile ``(1, C, *out)``."""
        b = tile.batch
        if tile.whole:  # core: output[b] = function(s), no mask
            self.out[b:b + 1] = ps
            self.weight[b:b + 1] = 1.0
            return
        size = tuple(ps.shape[2:])
        mask = self.masks.get(size)
        if mask is None:
            mask = self.masks[size] = feather_mask(size, self.feathers, device=self.device)
        o, w = self.out[b:b + 1], self.weight[b:b + 1]
        for d, (start, n) in enumerate(zip(tile.out_start, size)):
            o, w = o.narrow(d + 2, start, n), w.narrow(d + 2, start, n)
        o.add_(ps * mask)
        w.add_(mask)

    def result(self) -> torch.Tensor:
        return self.out.div_(self.weight)


def run_tiled(samples: torch.Tensor, plan: TilePlan, decoders: Sequence[Callable[[torch.Tensor], torch.Tensor]],
              devices: Sequence | None = None, output_device="cpu",
              on_batch: Callable[[int, int], None] | None = None,
              check_interrupt: Callable[[], None] | None = None) -> torch.Tensor:
    """Decode ``samples`` tile-batch by tile-batch; returns core's ``tiled_scale_multidim`` output.

    ``decoders[k]`` runs on its own thread (``devices[k]``: its torch device, used to set the
    thread's CUDA device; None = leave as is) and maps a latent batch ``(N, C, *tile)`` to decoded
    ``(N, out_channels, *scaled)``. Give every thread its own module (replicas never shared).
    ``on_batch(done, total)`` is called after each blended batch, in this thread.
    """
    if tuple(samples.shape) != plan.latent_shape:
        raise InputError(f"samples of shape {tuple(samples.shape)} do not match the plan's {plan.latent_shape}")
    if not decoders:
        raise InputError("run_tiled needs at least one decoder")
    devices = list(devices) if devices is not None else [None] * len(decoders)
    if len(devices) != len(decoders):
        raise InputError(f"{len(decoders)} decoders but {len(devices)} devices; give one device per decoder")
    total = len(plan.batches)
    with torch.no_grad():
        blender = _Blender(plan, output_device)
        workers = _Workers(samples, plan, decoders[:max(1, min(len(decoders), total))], devices, output_device)
        try:
            _collect(plan, workers, blender, on_batch, check_interrupt)
        finally:
            workers.close()
        return blender.result()


def _collect(plan: TilePlan, workers: _Workers, blender: _Blender, on_batch, check_interrupt) -> None:
    """Blend tiles in core's order as batches arrive; poll for interrupts while waiting."""
    total, received, next_tile, pending = len(plan.batches), 0, 0, {}
    while received < total:
        try:
            i, out = workers.results.get(timeout=_POLL_S)
        except queue.Empty:
            if check_interrupt is not None:
                check_interrupt()
            if not workers.alive() and workers.results.empty():
                raise RunError(f"tile workers stopped after {received} of {total} batches")
            continue
        if i is None:
            raise out
        received += 1
        for j, tile in enumerate(plan.batches[i]):
            pending[tile.index] = (tile, out[j:j + 1])
        while next_tile in pending:
            blender.add(*pending.pop(next_tile))
            next_tile += 1
        if on_batch is not None:
            on_batch(received, total)
        if check_interrupt is not None and received < total:
            check_interrupt()
    assert not pending and next_tile == len(plan.tiles), (next_tile, len(plan.tiles))
