"""Inputs of the cost model (pure, no torch): model shapes, GPU throughput, link bandwidth.

Units: FLOP, FLOP/s, bytes, bytes/s, seconds. ``TFLOPS`` = 1e12 FLOP/s, ``GB/s`` = 1e9 bytes/s.

- **Model shape** (``ModelShape``): parameters per block split into those applied to every image
  token, those applied to text tokens, and all weights (for streaming). Each family's entry in
  ``parallel/families.py`` builds one from ComfyUI's own ``unet_config`` (``shape_from_config``),
  with the layer shapes it cites. Biases and norms (< 0.1 %) are left out.
- **Device throughput**: dense bf16/fp16 tensor peak with fp32 accumulate (NVIDIA datasheets and
  architecture whitepapers; GeForce cards run fp32 accumulate at half their fp16-accumulate rate)
  times ``EFFICIENCY``; or a measured FLOP/s passed in, used as is.
- **Link**: a measured or known bandwidth passed in, else ``DEFAULT_LINK_GBPS``.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass

from ..errors import InputError

__all__ = [
    "DEFAULT_CFG",
    "DEFAULT_GPU",
    "DEFAULT_HOST_LINK_GBPS",
    "DEFAULT_LINK_GBPS",
    "EFFICIENCY",
    "GPU_PEAK_TFLOPS",
    "BlockShape",
    "GpuTable",
    "check_cfg",
    "ModelShape",
    "latent_frames",
    "gpu_flops",
    "gpu_names",
    "gpu_table",
    "link_bandwidth",
    "normalize_gpu_name",
    "parse_link_gbps",
    "positive_number",
    "table_gpu_name",
]

EFFICIENCY = 0.6
"""Fraction of dense peak a DiT block reaches (large bf16 GEMMs + flash attention). One constant
for every GPU and test: 0.6 × 165 TFLOPS = 99 effective on an RTX 4090 (ANCHORS.md)."""

DEFAULT_LINK_GBPS = 12.0
"""PCIe 4.0 x16 without peer-to-peer, copies staged through pinned host memory (two copies in
series): ANCHORS.md, one 335.5 MB hop in ~26 ms ≈ 12.9 GB/s."""

DEFAULT_HOST_LINK_GBPS = 25.0
"""PCIe 4.0 x16 from pinned host memory to one GPU (one copy): ANCHORS.md, one 335.5 MB hop in
~13 ms over PCIe 4.0 x16 ≈ 25 GB/s. What ComfyUI's dynamic VRAM streams non-resident weights over."""

DEFAULT_GPU = "RTX 4090"
"""Throughput assumed for a GPU whose name is not in the table (said in the output)."""

GPU_PEAK_TFLOPS: dict[str, float] = {
    "rtx 3090": 71.0, "rtx 3090 ti": 80.0, "rtx 4080": 97.5, "rtx 4090": 165.2,
    "rtx 5090": 209.5, "rtx a6000": 154.8, "rtx 6000 ada": 364.2, "l40": 181.0,
    "l40s": 362.0, "a100": 312.0, "h100": 989.4, "h100 pcie": 756.0, "h100 nvl": 835.0,
    "h200": 989.4,
}
"""Dense bf16 tensor TFLOPS with fp32 accumulate (no sparsity), keyed by normalised name."""

_NOISE = {"nvidia", "geforce", "tesla", "generation"}


@dataclass(frozen=True)
class BlockShape:
    """One kind of DiT block (HunyuanVideo has two: double- and single-stream)."""

    count: int
    """Blocks of this kind."""
    image_params: int
    """Parameters applied to every image token (linear FLOPs = 2 × image tokens × this)."""
    text_params: int
    """Parameters applied to every text token (Wan/LTXV cross-attention k, v; HunyuanVideo text)."""
    weight_params: int
    """All weight parameters of one block (bytes streamed = this × bytes per weight)."""
    joint_text: bool = False
    """Text tokens join self-attention (HunyuanVideo)."""
    cross_attention: bool = True
    """Image tokens attend to the text tokens in a separate cross-attention (Wan, LTXV)."""
    gathered_kv_width: int = 0
    """Width of the keys and of the values (each) that `sequence` gathers from every image token, split
    by heads, for an attention whose queries every rank holds whole (the family's ``TokenSpec.gather_kv``:
    LTX-2's video->audio attention, keys/values of the audio's inner width); 0 when the block has none."""


def latent_frames(frames: int, temporal: int, frame_grid: tuple = ()) -> int:
    """Latent frames of a ``frames``-frame video: ``(frames - 1) // temporal + 1`` (the latent nodes
    round down), or on a grid ``(base frames, base latents, period frames, period latents)`` that the
    latent node snaps up to (MiniMax H3: 17k + 5 frames -> 5k + 2 latent frames)."""
    if not frame_grid:
        return (frames - 1) // temporal + 1
    base_f, base_l, period_f, period_l = frame_grid
    return base_l + max(0, -(-(frames - base_f) // period_f)) * period_l


@dataclass(frozen=True)
class ModelShape:
    """What the cost model needs of a DiT: widths, blocks, token geometry."""

    name: str
    width: int
    """Hidden width (channels per token)."""
    heads: int
    """Self-attention heads (Ulysses splits them over the devices of a group)."""
    blocks: tuple[BlockShape, ...]
    text_tokens: int
    """Text (and image-encoder) tokens of the conditioning."""
    spatial: int
    """Pixels per latent cell (VAE stride)."""
    temporal: int
    """Frames per latent frame after the first."""
    patch: tuple[int, int, int]
    """Latent cells per token along (frames, height, width)."""
    frame_grid: tuple = ()
    """``latent_frames``'s grid, () for ``temporal`` frames per latent frame."""

    @property
    def block_count(self) -> int:
        return sum(b.count for b in self.blocks)

    def image_tokens(self, width: int, height: int, frames: int) -> int:
        """Tokens of a ``width × height × frames`` video: Wan 1280×720×81 -> 21 × 45 × 80 = 75600."""
        for name, value in (("width", width), ("height", height), ("frames", frames)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise InputError(f"{name} {value!r} must be a positive integer (pixels or frames)")
        pt, ph, pw = self.patch
        t = latent_frames(frames, self.temporal, self.frame_grid)
        return (math.ceil(t / pt) * math.ceil(height // self.spatial / ph)
                * math.ceil(width // self.spatial / pw))


def table_gpu_name(name) -> str | None:
    """``name`` when the throughput table knows it (``normalize_gpu_name`` matches), else None."""
    try:
        normalize_gpu_name(name)
    except ValueError:
        return None
    return name


def normalize_gpu_name(name: str) -> str:
    """``"NVIDIA GeForce RTX 4090"`` -> ``"rtx 4090"``; ``"NVIDIA H100 80GB HBM3"`` -> ``"h100"``.

    The table key with the most words that all occur in the name wins (``"h100 pcie"`` over
    ``"h100"``; ``"l40s"`` is its own word). ``"4090"`` alone matches ``"rtx 4090"``.
    ValueError lists the known names when none matches.
    """
    words = set(re.findall(r"[a-z0-9]+", str(name).lower())) - _NOISE
    best, best_len = None, 0
    for key in GPU_PEAK_TFLOPS:
        need = set(key.split()) - {"rtx"}
        if need <= words and len(key.split()) > best_len:
            best, best_len = key, len(key.split())
    if best is None:
        raise InputError(
            f"GPU name {name!r} is not in the throughput table ({', '.join(GPU_PEAK_TFLOPS)}): "
            "pass a measured throughput instead (selftest's timed matmul, in TFLOPS)")
    return best


def gpu_names(text: str) -> list[str]:
    """``--gpu``'s names: one for every GPU (``"RTX 4090"``), or one per GPU in order
    (``"RTX 5090,RTX 4090"``: mixed cards); ValueError (``normalize_gpu_name``'s) for an unknown one."""
    names = [part.strip() for part in str(text).split(",")]
    for name in names:
        normalize_gpu_name(name)
    return names


def gpu_flops(name: str, efficiency: float = EFFICIENCY) -> float:
    """Effective FLOP/s of a GPU by (NVML) name: table peak × ``efficiency``."""
    if not 0 < efficiency <= 1:
        raise InputError(f"efficiency {efficiency!r} must be in (0, 1] (fraction of dense peak)")
    return GPU_PEAK_TFLOPS[normalize_gpu_name(name)] * 1e12 * efficiency


@dataclass(frozen=True)
class GpuTable:
    """The throughput table's name and effective FLOP/s of each GPU a plan prices, settled once."""

    names: dict
    """Device -> the table's name for it (``--gpu``'s, else its own NVML name's, else ``DEFAULT_GPU``)."""
    flops: dict
    """Device -> effective FLOP/s (``gpu_flops`` of its name)."""
    shown: str
    """The name for the output's note and for a device the table does not list."""
    assumed: bool
    """A GPU's own name is not in the table (or there is no GPU): ``DEFAULT_GPU`` stands in."""
    given: bool
    """``--gpu`` named the GPUs."""

    def name(self, device: str) -> str:
        return self.names.get(device, self.shown)


def gpu_table(gpus, gpu: str | None = None) -> GpuTable:
    """``GpuTable`` of ``gpus`` ((device, NVML name) pairs, in order) under ``--gpu`` ``gpu`` (one
    name for all, or one per GPU in order; None: each GPU's own name, ``DEFAULT_GPU`` where the
    table lacks it)."""
    gpus = list(gpus)
    if gpu:
        given = gpu_names(gpu)
        if len(given) not in (1, len(gpus)):
            raise InputError(f"--gpu {gpu!r} names {len(given)} GPUs for {len(gpus)}: give one "
                             "name for all, or one per GPU in order (e.g. 'RTX 5090,RTX 4090')")
        per = given * len(gpus) if len(given) == 1 else given
        names = {device: name for (device, _), name in zip(gpus, per, strict=True)}
        shown, assumed = given[0], False
    else:
        names = {device: table_gpu_name(own) or DEFAULT_GPU for device, own in gpus}
        assumed = not gpus or any(names[device] != own for device, own in gpus)
        shown = next(iter(names.values()), DEFAULT_GPU)
    return GpuTable(names, {device: gpu_flops(name) for device, name in names.items()}, shown, assumed, bool(gpu))


def positive_number(text) -> float | None:
    """``text`` as a finite number > 0; None when it is not one (the caller names the fix)."""
    try:
        value = float(text)
    except (TypeError, ValueError):
        return None
    return value if math.isfinite(value) and value > 0 else None


def parse_link_gbps(text) -> float:
    """``--link-gbps 12`` -> 12e9 bytes/s; ValueError for non-numbers and values <= 0."""
    value = positive_number(text)
    if value is None:
        raise InputError(f"link bandwidth {text!r} must be a number of GB/s > 0, e.g. --link-gbps 12 "
                         "(PCIe 4.0 without P2P) or 25 (with P2P)")
    return value * 1e9


def link_bandwidth(link_gbps=None) -> tuple[float, str]:
    """(bytes/s, a sentence for the output): the given GB/s, else the PCIe 4.0 no-P2P default."""
    if link_gbps is None:
        note = (f"link {DEFAULT_LINK_GBPS:g} GB/s assumed (PCIe 4.0 without P2P, via host memory); "
                "pass --link-gbps or the selftest's measured hop")
        return DEFAULT_LINK_GBPS * 1e9, note
    bw = parse_link_gbps(link_gbps)
    return bw, f"link {bw / 1e9:g} GB/s (given)"


DEFAULT_CFG = 6.0
"""Guidance scale of the dry run: > 1 means cond + uncond every step (Wan's usual 5-6)."""


def check_cfg(value) -> float:
    """A guidance scale as a number >= 1 (InputError naming the value otherwise)."""
    try:
        cfg = float(value)
    except (TypeError, ValueError):
        cfg = float("nan")
    if not cfg >= 1.0 or cfg == float("inf"):
        raise InputError(f"cfg {value!r} must be a number >= 1: 1 = cond only (batch 1), "
                         "> 1 = cond + uncond every step (e.g. --cfg 6)")
    return cfg
