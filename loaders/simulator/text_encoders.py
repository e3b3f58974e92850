"""The text encoder a model needs, reported beside its DiT: which one, its size, where it would go.

ComfyUI runs the text encoder before the DiT and hands its output over through the CPU, so the
DiT's tables do not count it; but a 24 GiB Gemma 3 12B (LTX-2) decides whether a 2x24 GiB machine
runs the workflow at all. Sizes are parameter counts of ComfyUI 0.29's own text encoder classes
built on ``meta`` (``comfy/text_encoders/``: ``lt.ltxav_te``, ``hunyuan_image.te``, ``kandinsky5.te``,
``wan.te``, ``lt.ltxv_te``, ``hunyuan_video.hunyuan_video_clip``; tests/test_presets_2026_comfy.py
counts them again), in bf16 (2 bytes a parameter; an fp8 file holds about half).

Where it would go is the rule ``ShardDiTLoadTextEncoder`` applies with ``device`` ``auto``
(``loaders/comfy/placement.py``, the planner's rule 3): a GPU the DiT does not use when it fits
there, else beside the DiT when the DiT's blocks still fit, else the CPU.
"""
from __future__ import annotations

from dataclasses import dataclass

from ...parallel.placement.planner import Footprint, PlacementError, PlacementRequest, plan_placement
from .simulator_report import format_gib

__all__ = ["ENCODERS", "TextEncoderReport", "encoders_of", "place_text_encoder"]

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


def encoders_of(spec) -> tuple[str, ...]:
    """The ``ENCODERS`` keys of the text encoder(s) ComfyUI loads for ``spec``'s DiT (by family and
    config: HunyuanVideo 1.5 has ``byt5``/``vision_in``, LTX-2.3 its caption projection before the
    connectors); () for a family without a known encoder."""
    unet = spec.unet_config
    if spec.family == "wan":
        return ("umt5-xxl",)
    if spec.family == "ltxv":
        return ("t5-xxl",)
    if spec.family == "ltxav":
        return ("gemma3-12b", "ltx2.3-projection" if unet.get("caption_proj_before_connector") else "ltx2-projection")
    if spec.family == "hunyuan_video":
        if unet.get("byt5") or unet.get("vision_in_dim"):
            return ("qwen2.5-vl-7b", "byt5-small")
        return ("llava-llama3-8b", "clip-l")
    if spec.family == "kandinsky5":
        return ("qwen2.5-vl-7b", "clip-l")
    if spec.family == "minimax_h3":
        return ("qwen3-vl-32b-h3",)
    return ()


@dataclass(frozen=True)
class TextEncoderReport:
    """The text encoder beside the DiT (bytes in bf16)."""

    parts: tuple[tuple[str, int], ...]
    """(name, parameters) of each part."""
    device: str | None
    """Where ``ShardDiTLoadTextEncoder`` ``auto`` would put it beside this plan; None without a plan."""

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
        return {"name": self.name, "parts": [{"name": n, "params": p} for n, p in self.parts],
                "params": self.params, "bytes_bf16": self.bytes, "device": self.device}

    def to_text(self) -> str:
        where = (f"; ShardDiTLoadTextEncoder auto -> {self.device} (a GPU the DiT leaves free, else beside the DiT, "
                 "else the CPU)" if self.device else "; not placed (no placement for the DiT)")
        return (f"text encoder: {self.name} {format_gib(self.bytes)} GiB bf16 ({format_gib(self.bytes // 2)} fp8, "
                f"{self.params / 1e9:.1f}B parameters), run before the DiT{where}")


def place_text_encoder(spec, inventory, request, block_bytes, home_bytes: int, activation: int,
                       dit_devices: list[str]) -> TextEncoderReport | None:
    """The report for ``spec``'s text encoder, placed beside a DiT on ``dit_devices`` (home first) as
    the loader places it (``loaders/comfy/placement.plan_component_device``); None when unknown."""
    keys = encoders_of(spec)
    if not keys:
        return None
    parts = tuple(ENCODERS[k] for k in keys)
    device = None
    if dit_devices:
        footprint = Footprint(block_bytes=tuple(block_bytes), dit_home_bytes=home_bytes,
                              dit_activation_bytes=activation, text_encoder_bytes=2 * sum(n for _, n in parts))
        placed = PlacementRequest(devices=",".join(dit_devices), reserve_vram_gb=request.reserve_vram_gb)
        try:
            device = plan_placement(inventory, footprint, placed).text_encoder_device
        except PlacementError:
            device = None
    return TextEncoderReport(parts, device)
