"""Tile geometry for tiled VAE decoding, identical to ComfyUI's ``tiled_scale_multidim``.

Pure PyTorch. For the same latent shape, tile sizes, overlaps, upscale functions and index
formulas, ``plan_tiles`` yields exactly the tiles core decodes (same starts, same edge clamping,
same order) and ``feather_mask`` exactly core's linear feather mask, so that blending the same
decoded tiles gives core's output (see ``tiling/runner`` for the accumulation order).

Core's rules, per latent dimension ``d`` of size ``S``, tile ``T`` and overlap ``O``:

- starts ``range(0, S - O, T - O)`` when ``S > T``, else ``[0]``; each start is clamped to
  ``[0, S - O]`` and the tile length is ``min(T, S - start)`` (edge tiles are shorter: "ragged");
- output position ``round(index(d, start))`` and output length ``round(scale(d, length))``, where
  ``scale``/``index`` are a number (multiply) or a callable (Wan time: frames ``4t - 3``, index ``4t``);
- feather width ``round(scale(d, O))``; the mask ramps ``1/F, 2/F, ... 1`` from both ends of the
  tile (skipped when ``F >= tile length``);
- a latent sample that fits into one tile in every dimension is decoded whole, without mask.

Here the tile parameters must satisfy ``0 <= overlap < tile`` in every dimension, and the decoded
tiles must cover the whole output; core raises (step 0) or silently returns NaN (negative step, or
gaps: with Wan's causal time a tile of ``l`` latent frames at ``p`` gives frames ``4p .. 4p+4l-4``,
so temporal overlap 0 leaves 3 frames uncovered; core's ``VAE.decode_tiled`` forces temporal
tile >= 2 and overlap >= 1 for that reason), so ``check_tiling`` raises instead.
"""
from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Union

import torch
from ..errors import InputError


__all__ = [
    "Scale",
    "Tile",
    "TileSpec",
    "check_coverage",
    "check_tiling",
    "dim_tiles",
    "feather_mask",
    "group_tiles",
    "make_batches",
    "plan_tiles",
]

Scale = Union[int, float, Callable[[int], float]]
"""A per-dimension upscale: a factor, or a callable latent length -> output length."""


def _apply(scale: Scale, value: int) -> float:
    return scale(value) if callable(scale) else scale * value


@dataclass(frozen=True)
class TileSpec:
    """Tile parameters in latent units, one entry per spatial/temporal dimension."""

    tile: tuple[int, ...]
    """Tile length per dimension (latent units), e.g. ``(t, h, w)``."""
    overlap: tuple[int, ...]
    """Overlap per dimension (latent units); ``0 <= overlap < tile``."""
    upscale: tuple[Scale, ...]
    """Output length per dimension: factor or callable (core's ``upscale_amount``)."""
    index: tuple[Scale, ...]
    """Output start per dimension: factor or callable (core's ``index_formulas``)."""

    @classmethod
    def build(cls, tile, overlap, upscale, index=None) -> "TileSpec":
        """Broadcast scalars like core does (``overlap=8`` -> every dimension)."""
        tile = tuple(int(t) for t in tile)
        dims = len(tile)
        overlap = tuple(overlap) if isinstance(overlap, (tuple, list)) else (overlap,) * dims
        upscale = tuple(upscale) if isinstance(upscale, (tuple, list)) else (upscale,) * dims
        index = upscale if index is None else index
        index = tuple(index) if isinstance(index, (tuple, list)) else (index,) * dims
        if not len(overlap) == len(upscale) == len(index) == dims:
            raise InputError(
                f"tile {tile}, overlap {overlap}, upscale and index formulas must have one entry per "
                f"dimension ({dims}); got {len(overlap)}, {len(upscale)}, {len(index)}"
            )
        return cls(tile, tuple(int(o) for o in overlap), upscale, index)

    @property
    def dims(self) -> int:
        return len(self.tile)

    def out_len(self, d: int, length: int) -> int:
        return round(_apply(self.upscale[d], length))

    def out_pos(self, d: int, start: int) -> int:
        return round(_apply(self.index[d], start))

    def feather(self, d: int) -> int:
        return round(_apply(self.upscale[d], self.overlap[d]))

    def out_shape(self, latent_shape: Sequence[int], out_channels: int) -> tuple[int, ...]:
        """Core's output shape ``(B, out_channels, *scaled dims)``."""
        return (latent_shape[0], out_channels) + tuple(self.out_len(d, s) for d, s in enumerate(latent_shape[2:]))


@dataclass(frozen=True)
class Tile:
    """One tile of one latent sample, in core's decode order (``index``)."""

    index: int
    """Position in core's order (batch-major, then ``itertools.product`` of the per-dim starts)."""
    batch: int
    """Latent batch entry."""
    start: tuple[int, ...]
    """Latent start per dimension (after clamping)."""
    size: tuple[int, ...]
    """Latent length per dimension (edge tiles are shorter)."""
    out_start: tuple[int, ...]
    """Output start per dimension."""
    whole: bool = False
    """The sample fits into one tile: core decodes it without mask or normalisation."""


def check_tiling(latent_shape: Sequence[int], spec: TileSpec) -> None:
    """Raise ValueError for tile parameters core cannot tile with (numbers and fix in the text)."""
    if len(latent_shape) != spec.dims + 2:
        raise InputError(
            f"latent of shape {tuple(latent_shape)} has {len(latent_shape)} dims; tiles {spec.tile} need "
            f"{spec.dims + 2} (batch, channels, {spec.dims} tiled dims)"
        )
    for d in range(spec.dims):
        tile, overlap = spec.tile[d], spec.overlap[d]
        if tile < 1 or overlap < 0:
            raise InputError(f"tile {tile} / overlap {overlap} in dim {d}: need tile >= 1 and overlap >= 0")
        if overlap >= tile:
            raise InputError(
                f"overlap {overlap} >= tile {tile} (latent units) in dim {d}: tiles would never advance; "
                f"use an overlap below {tile} or a larger tile"
            )


def check_coverage(latent_shape: Sequence[int], spec: TileSpec) -> None:
    """Raise ValueError when the tiles' outputs leave a gap (voxels no tile writes: NaN in core)."""
    for d, size in enumerate(latent_shape[2:]):
        covered = 0
        for start, n in dim_tiles(size, spec.tile[d], spec.overlap[d]):
            lo = spec.out_pos(d, start)
            if lo > covered:
                raise InputError(
                    f"tiles of {spec.tile[d]} with overlap {spec.overlap[d]} (latent units) leave output "
                    f"positions {covered}..{lo - 1} of dim {d} undecoded (latent size {size}); raise the "
                    f"overlap (temporal overlap >= 1 latent frame for causal video VAEs) or the tile size"
                )
            covered = max(covered, lo + spec.out_len(d, n))


def dim_tiles(size: int, tile: int, overlap: int) -> list[tuple[int, int]]:
    """``(start, length)`` of core's tiles along one dimension (before combining dimensions)."""
    starts = range(0, size - overlap, tile - overlap) if size > tile else [0]
    out = []
    for it in starts:
        pos = max(0, min(size - overlap, it))
        out.append((pos, min(tile, size - pos)))
    return out


def plan_tiles(latent_shape: Sequence[int], spec: TileSpec) -> list[Tile]:
    """Every tile core decodes for ``latent_shape`` ``(B, C, *dims)``, in core's order."""
    check_tiling(latent_shape, spec)
    check_coverage(latent_shape, spec)
    sizes = tuple(latent_shape[2:])
    tiles: list[Tile] = []
    for b in range(latent_shape[0]):
        if all(sizes[d] <= spec.tile[d] for d in range(spec.dims)):
            zero = (0,) * spec.dims
            tiles.append(Tile(len(tiles), b, zero, sizes, zero, whole=True))
            continue
        per_dim = [dim_tiles(sizes[d], spec.tile[d], spec.overlap[d]) for d in range(spec.dims)]
        for combo in itertools.product(*per_dim):
            start = tuple(p for p, _ in combo)
            size = tuple(n for _, n in combo)
            out_start = tuple(spec.out_pos(d, p) for d, p in enumerate(start))
            tiles.append(Tile(len(tiles), b, start, size, out_start))
    return tiles


def group_tiles(tiles: Sequence[Tile]) -> list[list[Tile]]:
    """Tiles of equal latent size (and wholeness) together; groups in order of first appearance.

    Interior tiles form one group; edge tiles of each distinct shape get their own group.
    """
    groups: dict[tuple, list[Tile]] = {}
    for tile in tiles:
        groups.setdefault((tile.size, tile.whole), []).append(tile)
    return list(groups.values())


def make_batches(groups: Sequence[Sequence[Tile]],
                 batch_size: int | Callable[[Sequence[Tile]], int]) -> list[list[Tile]]:
    """Split each group into consecutive batches of ``batch_size`` tiles (last may be smaller).

    ``batch_size`` is a positive int or a callable ``group -> int`` (per-group size, e.g. from memory).
    Gives ``ceil(len(group) / batch_size)`` batches per group.
    """
    batches = []
    for group in groups:
        size = batch_size(group) if callable(batch_size) else batch_size
        if not isinstance(size, int) or isinstance(size, bool) or size < 1:
            raise InputError(f"tile_batch_size {size!r} must be a positive integer (tiles per decoder call)")
        batches.extend(list(group[i:i + size]) for i in range(0, len(group), size))
    return batches


def feather_mask(out_size: Sequence[int], feathers: Sequence[int], device="cpu") -> torch.Tensor:
    """Core's linear feather mask for a decoded tile of output size ``out_size``: shape ``(1, 1, *out_size)``.

    Built with core's exact sequence of in-place fp32 multiplications so values match bit for bit.
    """
    mask = torch.ones((1, 1) + tuple(out_size), device=device)
    for d, feather in enumerate(feathers, start=2):
        if feather >= mask.shape[d]:
            continue
        for t in range(feather):
            a = (t + 1) / feather
            mask.narrow(d, t, 1).mul_(a)
            mask.narrow(d, mask.shape[d] - 1 - t, 1).mul_(a)
    return mask
