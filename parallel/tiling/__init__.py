"""Tiled VAE decoding engine: one import for the geometry and the batched multi-device runner.

- ``geometry``: core-identical tile layout (``plan_tiles``, ``feather_mask``, ``TileSpec``),
  grouping of equal-shaped tiles and batching (``group_tiles``, ``make_batches``);
- ``runner``: ``plan_decode`` + ``run_tiled`` (stacked decoder calls, one thread per replica,
  fixed-order blending, progress and interrupt callbacks);
- ``devices``: which devices decode (the decoder's replicas).

Pure PyTorch: nothing here imports ComfyUI; ``loaders/comfy/vae/tiled_decode.py`` adapts ComfyUI's VAE.
"""
from .geometry import (  # noqa: F401
    Scale,
    Tile,
    TileSpec,
    check_coverage,
    check_tiling,
    dim_tiles,
    feather_mask,
    group_tiles,
    make_batches,
    plan_tiles,
)
from .runner import TilePlan, plan_decode, run_tiled  # noqa: F401

__all__ = [
    "Scale", "Tile", "TilePlan", "TileSpec", "check_coverage", "check_tiling", "dim_tiles", "feather_mask",
    "group_tiles", "make_batches", "plan_decode", "plan_tiles", "run_tiled",
]
