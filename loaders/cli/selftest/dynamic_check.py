"""``selftest`` check of ShardDiT under ComfyUI's dynamic VRAM (core 0.16+, on by default on NVIDIA).

The self-test imports ComfyUI as its ``main.py`` would run it (``import_comfyui(dynamic_vram=True)``),
so core's loader builds the tiny Wan 2.1 DiT as a ``ModelPatcherDynamic``. On one GPU:

- the unsharded dynamic MODEL sampled by core (cfg 4 and cfg 1);
- sharded over ``cuda:0,cuda:0`` in ``blocks`` and in ``sequence`` mode: every patcher of the
  sharded MODEL must be non-dynamic and whole (``loaders/comfy/core/dynamic_vram.py``), the latents
  within ``GPU_TOL`` of the unsharded ones (a token split changes cuBLAS's matrix shapes);
- then core's sampler on the unsharded MODEL again (the shards hand the weights back) and a
  sharded run again: each equal to its first result within the same bound;
- this process's peak host RAM (informational: the weights are read once, one copy in RAM).

Skipped where dynamic VRAM is off (no GPU, core before 0.16, ``--disable-dynamic-vram``).
"""
from __future__ import annotations

import resource
import sys

import torch

from ...comfy.core.dynamic_vram import is_dynamic
from ...comfy.shard.hooks import get_shard_patchers
from ...comfy.shard.pipeline import shard_model
from .sequence_check import sample_tiny
from .tiny_models import build_wan_dit

__all__ = ["check_dynamic_vram"]

GPU_TOL = 1e-3
DEVICES = "cuda:0,cuda:0"


def _compare(check, what: str, got: torch.Tensor, expected: torch.Tensor) -> None:
    diff = (got.float() - expected.float()).abs().max().item()
    ok = bool(torch.isfinite(got).all()) and diff <= GPU_TOL
    check.ok = check.ok and ok
    same = "identical" if torch.equal(got, expected) else f"max diff {diff:.3g}"
    check.lines.append(f"{what}: {'PASS' if ok else 'FAIL'}: {same} (limit {GPU_TOL:g})")


def _patchers_line(check, sharded) -> str:
    patchers = [sharded, *get_shard_patchers(sharded)]
    dynamic = [p for p in patchers if is_dynamic(p)]
    if dynamic:
        check.ok = False
        return f"FAIL: {len(dynamic)} dynamic patcher(s) in the sharded MODEL"
    return f"{len(patchers)} patchers, all non-dynamic ({', '.join(sorted({type(p).__name__ for p in patchers}))})"


def check_dynamic_vram(check, status: str) -> None:
    if status != "on":
        check.lines.append(f"{status}: skipped")
        return
    model = build_wan_dit(num_layers=4)
    if not is_dynamic(model):
        check.ok = False
        check.lines.append(f"FAIL: dynamic VRAM is on but core's loader built a {type(model).__name__}")
        return
    check.lines.append(f"dynamic VRAM on: core's loader built a {type(model).__name__} on {model.load_device}")
    expected = {cfg: sample_tiny(model, cfg) for cfg in (4.0, 1.0)}
    first = {}
    for mode in ("blocks", "sequence"):
        sharded = shard_model(model, DEVICES, reserve_vram_gb=0.0, parallel=mode)
        check.lines.append(f"{mode} on {DEVICES}: {_patchers_line(check, sharded)}")
        for cfg, ref in expected.items():
            first[mode, cfg] = sample_tiny(sharded, cfg)
            _compare(check, f"{mode} cfg {cfg:g} vs unsharded", first[mode, cfg], ref)
    _compare(check, "core's sampler on the unsharded MODEL again", sample_tiny(model, 4.0), expected[4.0])
    again = shard_model(model, DEVICES, reserve_vram_gb=0.0, parallel="blocks")
    _compare(check, "blocks again after that", sample_tiny(again, 4.0), first["blocks", 4.0])
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / (1 << 20 if sys.platform == "darwin" else 1 << 10)
    weights = sum(t.numel() * t.element_size() for t in model.model.state_dict().values()) / (1 << 20)
    check.lines.append(f"host RAM peak of this process {peak:.0f} MiB (tiny DiT weights {weights:.1f} MiB; "
                       "informational)")
