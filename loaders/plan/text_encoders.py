"""The text encoder a model needs, reported beside its DiT: which one, its size, where it would go.

ComfyUI runs the text encoder before the DiT and hands its output over through the CPU, so the
DiT's tables do not count it; but a 24 GiB Gemma 3 12B (LTX-2) decides whether a 2x24 GiB machine
runs the workflow at all. Sizes are parameter counts of ComfyUI 0.29's own text encoder classes
built on ``meta`` (``comfy/text_encoders/``: ``lt.ltxav_te``, ``hunyuan_image.te``, ``kandinsky5.te``,
``wan.te``, ``lt.ltxv_te``, ``hunyuan_video.hunyuan_video_clip``; tests/test_presets_2026_comfy.py
counts them again), in bf16 (2 bytes a parameter; an fp8 file holds about half).

Where it would go is the rule ``ShardDiTLoadTextEncoder`` applies with ``device`` ``auto``
(``loaders/comfy/core/component_placement.py``, the planner's rule 3): a GPU the DiT does not use when it fits
there, else beside the DiT when the DiT's blocks still fit, else its layers split over the GPUs by
their room left beside the DiT, the CPU taking what they cannot (``parallel.placement.layer_split``,
as ``loaders/comfy/loading/text_encoder_split.py`` does); where no GPU can take a layer, the CPU.

Time per prompt: 2 FLOP per layer parameter per token (the layers' matmuls; attention over a
prompt's few hundred tokens is small beside them), each layer at its device's rate: a GPU at the
cost model's effective TFLOPS (``parallel.cost.inputs.gpu_flops``), the CPU at ``CPU_TFLOPS``.
"""
from __future__ import annotations

from dataclasses import dataclass

from ...parallel.placement.devices import DevicePlan
from ...parallel.placement.layer_split import LayerSplit, plan_layer_split
from ...parallel.placement.planner import plan_placement
from ...parallel.placement.plan_types import Footprint, PlacementRequest
from ...parallel.placement.plan_text import PlacementError
from ...parallel.units import format_gib

__all__ = ["ENCODERS", "LAYERS", "TextEncoderReport", "encoders_of", "place_text_encoder"]

ENCODERS: dict[str, tuple[str, int]] = {
    "gemma3-12b": ("Gemma 3 12B", 12_187_325_041),  # lt.ltxav_te: gemma3_12b (text + SigLIP vision tower)
    "ltx2-projection": ("LTX-2 text projection", 722_534_400),  # single_linear: 3840 * 49 -> 3840
    "ltx2.3-projection": ("LTX-2.3 text projection", 1_156_061_184),  # dual_linear: 3840 * 49 -> 4096 + 2048
    "qwen2.5-vl-7b": ("Qwen2.5-VL 7B", 7_747_169_281),  # hunyuan_image.te / kandinsky5.te: qwen25_7b
    "byt5-small": ("byT5-small (glyph)", 219_314_945),  # hunyuan_image.te: byt5_small
    "clip-l": ("CLIP-L", 123_650_305),  # kandinsky5.te / hunyuan_video_clip: clip_l
    "umt5-xxl": ("umT5-XXL", 5_680_910_337),  # wan.te: umt5xxl
    "t5-xxl": ("T5-XXL", 4_762_310_657),  # lt.ltxv_te: t5xxl
    "llava-llama3-8b": ("LLaVA-LLaMA-3 8B", 7_505_186_817),  # hunyuan_video_clip: llama
    # 0.33 minimax.te: qwen3vl_32b, Qwen3-VL 32B cut to its first 50 of 64 layers (Qwen3VL_32BConfig)
    "qwen3-vl-32b-h3": ("Qwen3-VL 32B (H3's 50 layers)", 25_753_095_921),
}
"""Key -> (name users know, parameters in ComfyUI 0.29's class)."""

LAYERS: dict[str, tuple[int, int]] = {
    "gemma3-12b": (48, 10_759_151_616),
    "qwen2.5-vl-7b": (28, 6_525_618_176),
    "byt5-small": (12, 217_090_752),
    "clip-l": (12, 85_054_464),
    "umt5-xxl": (24, 4_630_757_376),
    "t5-xxl": (24, 4_630_710_272),
    "llava-llama3-8b": (32, 6_979_584_000),
    "qwen3-vl-32b-h3": (50, 24_379_916_800),
}
"""Key -> (layers, parameters in them) of the lists ShardDiT's loader splits (``layers`` / T5's
``block``, vision towers left out), counted on ComfyUI 0.33's classes on meta; the rest (token
tables, vision towers, LTX-2's projection) stays on the first device."""

PROMPT_TOKENS = {"gemma3-12b": 1024, "umt5-xxl": 512}
"""Tokens an encoder runs per prompt where its tokenizer pads (Gemma 3 for LTX-2: 1024; umT5 for
Wan: 512); others run the prompt's own tokens, taken as ``DEFAULT_PROMPT_TOKENS``."""
DEFAULT_PROMPT_TOKENS = 256
CPU_TFLOPS = 0.2
"""Effective bf16 TFLOPS assumed for a desktop CPU running an encoder's layers (stated in the line)."""


def encoders_of(family, unet_config: dict) -> tuple[str, ...]:
    """The ``ENCODERS`` keys of the text encoder(s) ComfyUI loads for a DiT of ``family`` (its registry
    entry, ``parallel/families.Family.text_encoders``) built from ``unet_config`` (HunyuanVideo 1.5
    has ``byt5``/``vision_in``, LTX-2.3 its caption projection before the connectors); () for a
    family without a known encoder."""
    pick = family.text_encoders
    return tuple(pick(unet_config)) if pick else ()


@dataclass(frozen=True)
class TextEncoderReport:
    """The text encoder beside the DiT (bytes in bf16)."""

    parts: tuple[tuple[str, int], ...]
    """(name, parameters) of each part."""
    device: str | None
    """Where the whole encoder goes beside this plan (``auto``'s single-device rule); None without a plan."""
    split: LayerSplit | None = None
    """Its layers over devices when no single device holds it and a GPU takes some."""
    seconds: float | None = None
    """Estimated seconds per prompt where it runs (None: unknown)."""
    tokens: int = DEFAULT_PROMPT_TOKENS

    @property
    def name(self) -> str:
        return " + ".join(name for name, _ in self.parts)

    @property
    def params(self) -> int:
        return sum(n for _, n in self.parts)

    @property
    def bytes(self) -> int:
        return 2 * self.params

    def to_dict(self) -> dict:
        split = None if self.split is None else [[r.device, r.start, r.stop] for r in self.split.ranges]
        return {"name": self.name, "parts": [{"name": n, "params": p} for n, p in self.parts],
                "params": self.params, "bytes_bf16": self.bytes, "device": self.device, "split": split,
                "seconds_per_prompt": self.seconds, "prompt_tokens": self.tokens}

    def to_text(self) -> str:
        if self.split is not None:
            layers = ", ".join(f"{d} {n}" for d, n in _layer_counts(self.split))
            where = (f"; ShardDiTLoadTextEncoder auto -> split, layers per device: {layers} (home {self.split.home}; "
                     "no single device holds it, GPUs first)")
        elif self.device:
            where = (f"; ShardDiTLoadTextEncoder auto -> {self.device} (a GPU the DiT leaves free, else beside the "
                     "DiT, else its layers over the GPUs, else the CPU)")
        else:
            where = "; not placed (no placement for the DiT)"
        time = (f"; about {self.seconds:.1f} s per prompt ({self.tokens} tokens; GPUs at the cost model's TFLOPS, "
                f"the CPU at {CPU_TFLOPS:g} TFLOPS assumed)" if self.seconds is not None else "")
        return (f"text encoder: {self.name} {format_gib(self.bytes)} GiB bf16 ({format_gib(self.bytes // 2)} fp8, "
                f"{self.params / 1e9:.1f}B parameters), run before the DiT{where}{time}")


def _layer_counts(split: LayerSplit) -> list[tuple[str, int]]:
    counts: dict[str, int] = {}
    for r in split.ranges:
        counts[r.device] = counts.get(r.device, 0) + r.stop - r.start
    return list(counts.items())


def _layer_sizes(keys) -> tuple[list[int], int]:
    """(bf16 bytes of each layer, bf16 bytes of the rest) of the encoder made of ``keys``."""
    layers, rest = [], 0
    for key in keys:
        count, in_layers = LAYERS.get(key, (0, 0))
        layers += [2 * in_layers // count] * count if count else []
        rest += 2 * (ENCODERS[key][1] - in_layers)
    return layers, rest


def place_text_encoder(spec, family, inventory, request, block_bytes, home_bytes: int, activation: int,
                       dit_devices: list[str], rates: dict) -> TextEncoderReport | None:
    """The report for ``spec``'s text encoder (``family``: its registry entry), placed beside a DiT on
    ``dit_devices`` (home first) as the loader places it
    (``loaders/comfy/core/component_placement.plan_component_device``, then ``text_encoder_split``);
    ``rates``: each GPU's effective FLOP/s (``cost/inputs.GpuTable.flops``) for the time per prompt.
    None when unknown."""
    keys = encoders_of(family, spec.unet_config)
    if not keys:
        return None
    parts = tuple(ENCODERS[k] for k in keys)
    tokens = max(PROMPT_TOKENS.get(k, DEFAULT_PROMPT_TOKENS) for k in keys)
    layer_bytes, rest = _layer_sizes(keys)
    if not dit_devices:
        return TextEncoderReport(parts, None, tokens=tokens)
    footprint = Footprint(block_bytes=tuple(block_bytes), dit_home_bytes=home_bytes,
                          dit_activation_bytes=activation, text_encoder_bytes=2 * sum(n for _, n in parts))
    placed = PlacementRequest(devices=DevicePlan.of_devices(dit_devices), reserve_vram_gb=request.reserve_vram_gb)
    try:
        plan = plan_placement(inventory, footprint, placed)
    except PlacementError:
        return TextEncoderReport(parts, None, tokens=tokens)
    device, split = plan.text_encoder_device, None
    if device == "cpu" and inventory.gpus and layer_bytes:
        # the layers over the GPUs' room beside the DiT, then the CPU; not where the CPU takes them all
        loads = {load.device: load.weight_bytes + load.activation_bytes for load in plan.loads}
        rooms = {g.device: g.available_bytes - placed.reserve_bytes - loads.get(g.device, 0) for g in inventory.gpus}
        try:
            split = plan_layer_split(layer_bytes, rest, rooms)
        except PlacementError:
            split = None
        split = None if split is None or split.devices == ("cpu",) else split
    devices = split.layer_devices() if split is not None else [device] * len(layer_bytes)
    # 2 FLOP per layer parameter per token, each layer at its device's rate
    seconds = sum(2 * (size // 2) * tokens / (CPU_TFLOPS * 1e12 if d == "cpu" else rates[d])
                  for size, d in zip(layer_bytes, devices))
    return TextEncoderReport(parts, device, split, seconds, tokens)
