"""Architecture specs: where a ComfyUI DiT keeps its blocks and which block arguments travel.

One small ``ArchSpec`` per family maps ComfyUI 0.3.64 classes (matched by exact class name, so a
subclass with different inter-block code is never guessed) to a ``BlockLayout``. The stream
arguments are the block-to-block hidden state(s); every other tensor argument is routed as a
per-forward constant by the engine (``parallel/blocks/routing.py``). ``return_home_after`` lists the
blocks after which the model runs code on its home device:

- Wan VACE: after block i in ``vace_layers_mapping`` (``x += vace_block(...)``).
- Wan S2V: after the audio-injection layers (``audio_injector.injected_block_id``). Its blocks are
  called without ``transformer_options``: nothing special, routing is by argument name.
- Wan Animate: after every fifth block (``face_adapter.fuser_blocks[i // 5]``).
- HunyuanVideo / Flux: a ControlNet (``control``) adds into the hidden state after every block,
  so ``home_every_block_kwargs = ("control",)``; double blocks take and return ``(img, txt)``.
- LTXV: ``pe`` is a ``(cos, sin)`` tuple (0.3.64) or ``(rotation matrix, split flag)`` (0.29):
  routed as a constant like any tensor.

`sequence` on HunyuanVideo needs the side its text tokens are on (after the image tokens before
ComfyUI 0.14, before them since): ``token_order`` reads it off the model (``token_order.py``);
``sequence_specs`` refuses `sequence` when it cannot.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

import torch

from ...parallel.sequence.split import TokenSpec
from ...parallel.blocks.sharding import BlockLayout
from .token_order import TEXT_FIRST, read_text_order

__all__ = ["ArchSpec", "SPECS", "find_arch_spec", "get_arch_spec", "supported_architectures"]


def _no_inter_block_code(dit) -> frozenset[int]:
    return frozenset()


def _vace_layers(dit) -> frozenset[int]:
    return frozenset(getattr(dit, "vace_layers_mapping", {}) or {})


def _s2v_audio_layers(dit) -> frozenset[int]:
    injector = getattr(dit, "audio_injector", None)
    return frozenset(getattr(injector, "injected_block_id", {}) or {})


def _animate_face_layers(dit) -> frozenset[int]:
    return frozenset(range(0, len(dit.blocks), 5))


@dataclass(frozen=True)
class ArchSpec:
    """How one family of ComfyUI DiT classes runs its blocks."""

    name: str
    """Family name shown to users."""
    class_names: tuple[str, ...]
    """ComfyUI class names (``type(diffusion_model).__name__``) this spec covers."""
    block_lists: tuple[str, ...]
    stream_args: tuple[tuple[int | str, ...], ...]
    home_after: Callable[[torch.nn.Module], frozenset[int]] = _no_inter_block_code
    """Global block indices followed by inter-block code on the home device, read off the model."""
    home_every_block_kwargs: tuple[str, ...] = ()
    token_specs: tuple[TokenSpec, ...] | None = None
    """Per block list, the token axes `sequence` mode splits; None: this family runs `blocks` only
    (its blocks do not pass ComfyUI's attention override on, or its token order is not handled)."""
    token_order: Callable[[torch.nn.Module], str | None] | None = None
    """Families with replicated text tokens in joint tensors: reads ``TEXT_FIRST``/``IMAGE_FIRST``
    off the model, None when it cannot (then `sequence` is refused for that model)."""

    def sequence_specs(self, dit: torch.nn.Module) -> tuple[tuple[TokenSpec, ...] | None, str]:
        """(token specs for `sequence` on ``dit``, '') or (None, why ``dit`` runs in blocks mode only)."""
        if self.token_specs is None:
            return None, (f"{self.name} runs in blocks mode only (sequence mode does not split this "
                          "architecture yet)")
        if self.token_order is None:
            return self.token_specs, ""
        order = self.token_order(dit)
        if order is None:
            return None, (f"{self.name} runs in blocks mode only: ShardDiT cannot read where this ComfyUI's "
                          f"{type(dit).__name__} puts its text tokens (before or after the image tokens), and "
                          "splitting them at the wrong place would give a wrong video; please report your "
                          "ComfyUI version at https://github.com/sharddit/sharddit/issues")
        return tuple(dataclasses.replace(s, text_first=order == TEXT_FIRST) for s in self.token_specs), ""

    def layout(self, dit: torch.nn.Module | None) -> BlockLayout:
        return BlockLayout(self.block_lists, self.stream_args, frozenset(self.home_after(dit)),
                           self.home_every_block_kwargs)


_WAN = (("blocks",), (("x",),))
_MMDIT = (("double_blocks", "single_blocks"), (("img", "txt"), ("x",)))

# `sequence` token axes (ComfyUI 0.3.64 and 0.29). Wan: x [B, L, C], e [B, 1|L, 6, C] (per token in
# Wan 2.2 5B), freqs [B|1, L, 1, D/2, 2, 2]. LTXV: x [B, L, C], timestep [B, 1|L, 6C], pe = (cos,
# sin) (0.3.64) or (rotation [B, L, H, D/2, 2, 2], split flag) (0.29) with tokens on dim 1; its
# guide self_attention_mask (0.29) is not split yet. HunyuanVideo: double blocks split img and keep
# txt whole, single blocks split x = cat of img and txt with txt replicated; pe [B, 1, L+T, ...]
# covers both, text after the image tokens (< 0.14) or before them (>= 0.14, ``text_first``, read
# off the model). Its per-token modulation_dims (image-to-video token replace) is not split yet.
_WAN_TOKENS = (TokenSpec({"x": 1, "e": 1, "freqs": 1}),)
_LTXV_TOKENS = (TokenSpec({"x": 1, "timestep": 1, "pe": 1}, must_be_none=("self_attention_mask",)),)
_HUNYUAN_TOKENS = (
    TokenSpec({"img": 1, "pe": 2}, replicated_streams=("txt",), tail_stream="txt",
              must_be_none=("modulation_dims_img", "modulation_dims_txt")),
    TokenSpec({"x": 1, "pe": 2}, tail_stream="txt", must_be_none=("modulation_dims",)),
)

SPECS: tuple[ArchSpec, ...] = (
    ArchSpec("Wan 2.1/2.2 (t2v, i2v, Camera, HuMo)", ("WanModel", "CameraWanModel", "HumoWanModel"), *_WAN,
             token_specs=_WAN_TOKENS),
    ArchSpec("Wan VACE", ("VaceWanModel",), *_WAN, home_after=_vace_layers, token_specs=_WAN_TOKENS),
    ArchSpec("Wan S2V", ("WanModel_S2V",), *_WAN, home_after=_s2v_audio_layers),
    ArchSpec("Wan Animate", ("AnimateWanModel",), *_WAN, home_after=_animate_face_layers),
    ArchSpec("LTX-Video", ("LTXVModel",), ("transformer_blocks",), (("x",),), token_specs=_LTXV_TOKENS),
    ArchSpec("HunyuanVideo", ("HunyuanVideo",), *_MMDIT, home_every_block_kwargs=("control",),
             token_specs=_HUNYUAN_TOKENS, token_order=read_text_order),
    ArchSpec("Flux", ("Flux",), *_MMDIT, home_every_block_kwargs=("control",)),
)


def supported_architectures() -> list[str]:
    """``"Family (Class, ...)"`` for every spec."""
    return [f"{s.name} ({', '.join(s.class_names)})" for s in SPECS]


def find_arch_spec(class_name: str) -> ArchSpec:
    """The spec covering ComfyUI class ``class_name``; unknown names raise ``ValueError``."""
    for spec in SPECS:
        if class_name in spec.class_names:
            return spec
    raise ValueError(
        f"[ShardDiT] cannot shard diffusion model class {class_name!r}: supported architectures are "
        f"{'; '.join(supported_architectures())}. Use ComfyUI's core nodes for this model, or open "
        "an issue at https://github.com/sharddit/sharddit/issues with the model's name.")


def get_arch_spec(diffusion_model: torch.nn.Module | str) -> BlockLayout:
    """The ``BlockLayout`` of a ComfyUI diffusion model (``model.diffusion_model``).

    A class name works too for families without instance-dependent inter-block code; VACE, S2V
    and Animate read their inter-block layers off the model and need the instance.
    """
    if isinstance(diffusion_model, str):
        spec = find_arch_spec(diffusion_model)
        if spec.home_after is not _no_inter_block_code:
            raise ValueError(f"[ShardDiT] the {spec.name} layout depends on the model's configuration: "
                             f"pass the {diffusion_model} instance (model.diffusion_model), not its class name")
        return spec.layout(None)
    return find_arch_spec(type(diffusion_model).__name__).layout(diffusion_model)
