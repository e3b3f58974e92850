"""Model families, ComfyUI's side: one entry per family, found by the name of its pure entry in
``parallel/families.py`` (block lists, token layout, geometry, cost shape live there).

An entry lists the ComfyUI classes the family covers, grouped by the inter-block code each group
runs (``ArchSpec``: matched by exact class name, so a subclass with other inter-block code is never
guessed), the class whose constructor takes a parameter dataclass (``model_params.py``) and the
extra inputs ComfyUI's sampler gives the model (the simulator's fake forward). Inter-block code,
read off the instance:

- Wan VACE: after block i in ``vace_layers_mapping`` (``x += vace_block(...)``).
- Wan S2V: after the audio-injection layers (``audio_injector.injected_block_id``). Its blocks are
  called without ``transformer_options``: nothing special, routing is by argument name.
- Wan Animate: after every fifth block (``face_adapter.fuser_blocks[i // 5]``).
- WanDancer (0.29): after its music layers (``music_injector.injected_block_id``).
- Wan SCAIL (0.29): none between blocks (pose tokens join before the first block).
- Kandinsky 5 (0.29): the visual blocks take the text blocks' output; the router brings the
  stream home after the last block of every list, so it needs nothing here.
- LTX-2 (0.29): none; the stream is the (video, audio) pair.
- CausalWanModel (0.29) is refused: its autoregressive forward updates per-block caches in place.
- HunyuanVideo / Flux: a ControlNet (``control``) adds into the hidden state after every block
  (the pure entry's ``home_every_block_kwargs``); double blocks take and return ``(img, txt)``.
- LTXV: ``pe`` is a ``(cos, sin)`` tuple (0.3.64) or ``(rotation matrix, split flag)`` (0.29):
  routed as a constant like any tensor.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import torch

from ....parallel.blocks.routing import BlockLayout
from ....parallel.families import FAMILIES, Family, get_family
from ....parallel.sequence.split import TokenSpec
from .token_order import TEXT_FIRST, read_text_order
from ....parallel.errors import InputError

__all__ = ["COMFY_FAMILIES", "ArchSpec", "ComfyFamily", "comfy_family", "family_of_image_model",
           "no_inter_block_code"]


def no_inter_block_code(dit) -> frozenset[int]:
    return frozenset()


def _vace_layers(dit) -> frozenset[int]:
    return frozenset(getattr(dit, "vace_layers_mapping", {}) or {})


def _injected_layers(injector_attr: str) -> Callable[[torch.nn.Module], frozenset[int]]:
    """Blocks after which ``dit.<injector_attr>`` (``AudioInjector_WAN``) adds into the hidden state."""
    def read(dit) -> frozenset[int]:
        injector = getattr(dit, injector_attr, None)
        return frozenset(getattr(injector, "injected_block_id", {}) or {})
    read.__name__ = f"_{injector_attr}_layers"
    return read


def _animate_face_layers(dit) -> frozenset[int]:
    return frozenset(range(0, len(dit.blocks), 5))


@dataclass(frozen=True)
class ArchSpec:
    """How one group of ComfyUI DiT classes of a family runs its blocks."""

    name: str
    """Shown to users."""
    family: str
    """The entry in ``parallel/families.py``: block lists, stream arguments, token axes."""
    class_names: tuple[str, ...]
    """ComfyUI class names (``type(diffusion_model).__name__``) this spec covers."""
    home_after: Callable[[torch.nn.Module], frozenset[int]] = no_inter_block_code
    """Global block indices followed by inter-block code on the home device, read off the model."""
    sequence: bool = True
    """False: this group runs `blocks` only even where its family splits tokens (``why_not``)."""
    why_not: str = ""
    token_order: Callable[[torch.nn.Module], str | None] | None = None
    """Families with replicated text tokens in joint tensors: reads ``TEXT_FIRST``/``IMAGE_FIRST``
    off the model, None when it cannot (then `sequence` is refused for that model)."""

    @property
    def pure(self) -> Family:
        return get_family(self.family)

    @property
    def block_lists(self) -> tuple[str, ...]:
        return self.pure.block_lists

    @property
    def stream_args(self) -> tuple[tuple[int | str, ...], ...]:
        return self.pure.stream_args

    @property
    def home_every_block_kwargs(self) -> tuple[str, ...]:
        return self.pure.home_every_block_kwargs

    @property
    def token_specs(self) -> tuple[TokenSpec, ...] | None:
        return self.pure.token_specs if self.sequence else None

    def sequence_specs(self, dit: torch.nn.Module) -> tuple[tuple[TokenSpec, ...] | None, str]:
        """(token specs for `sequence` on ``dit``, '') or (None, why ``dit`` runs in blocks mode only)."""
        if self.token_specs is None:
            why = self.why_not or self.pure.why_blocks_only
            return None, f"{self.name} runs in blocks mode only ({why})"
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


def _no_inputs(unet: dict, g, empty) -> dict:
    return {}


def _wan_inputs(unet: dict, g, empty) -> dict:
    return {"clip_fea": empty(g.clip_tokens, 1280)} if g.clip_tokens else {}


def _ltxv_inputs(unet: dict, g, empty) -> dict:
    return {"attention_mask": None, "frame_rate": 25}


def _hunyuan_inputs(unet: dict, g, empty) -> dict:
    out = {"y": empty(g.pooled_dim)} if g.pooled_dim else {}
    if unet.get("guidance_embed"):
        out["guidance"] = empty(dt=torch.float32)
    return out


def _video_only(x, frames: int, empty):
    return x


def _ltxav_latent(x, frames: int, empty):
    """LTX-2's DiT input: [video latent, audio latent] (``model_base`` unpacks the packed latent by
    ``latent_shapes``); the audio latent is [B, 8, n, 16] with n = ceil(frames / frame rate * 25)
    (``LTXVEmptyLatentAudio``: 16 kHz, hop 160, 4x down = 25 latents a second), at 25 fps = frames."""
    return [x, empty(8, frames, 16, dt=x.dtype)]


def _minimax_h3_latent(x, frames: int, empty):
    """MiniMax H3's DiT input: [video latent, audio latent [B, 32, 2, n]], n = frames x 5/3 rounded, of
    the frames the video latent holds (0.33 comfy_extras/nodes_minimax_h3.py: 17k + 5 frames at 24 fps
    in 5k + 2 latent frames, audio latents at 40 a second)."""
    snapped = 5 + (x.shape[2] - 2) // 5 * 17
    return [x, empty(32, 2, round(snapped * 5 / 3), dt=x.dtype)]


@dataclass(frozen=True)
class ComfyFamily:
    """ComfyUI's side of one family (see the module docstring)."""

    family: str
    specs: tuple[ArchSpec, ...]
    params_class: str | None = None
    """``module.Class`` whose constructor takes a parameter dataclass (``model_params.fit_params``)."""
    sim_inputs: Callable[[dict, object, Callable], dict] = _no_inputs
    """``(unet_config, geometry, empty) -> kwargs`` beyond ``x, t, context`` for one forward;
    ``empty(*shape, dt=...)`` makes a tensor with the batch prepended."""
    sim_latent: Callable[[torch.Tensor, int, Callable], object] = _video_only
    """``(video latent, frames, empty) -> x`` as the sampler gives it to the DiT (LTX-2: with its audio)."""
    refused: Mapping[str, str] = field(default_factory=dict)
    """ComfyUI classes of this family that cannot be sharded -> why (the error says it)."""
    sim_scalars: bool = False
    """The forward reads Python numbers off its inputs (MiniMax H3's timesteps): the simulator's fake
    tensors give stand-ins (``parallel.simulate.fake_device_mode(scalars=True)``)."""


_WAN, _HY = "wan", "hunyuan_video"
_UNPROVEN = "sequence mode is not proven on this variant's extra tokens yet"
COMFY_FAMILIES: dict[str, ComfyFamily] = {f.family: f for f in (
    ComfyFamily(_WAN, (
        ArchSpec("Wan 2.1/2.2 (t2v, i2v, Camera, HuMo)", _WAN, ("WanModel", "CameraWanModel", "HumoWanModel")),
        ArchSpec("Wan VACE", _WAN, ("VaceWanModel",), home_after=_vace_layers),
        ArchSpec("Wan S2V", _WAN, ("WanModel_S2V",), home_after=_injected_layers("audio_injector"), sequence=False),
        ArchSpec("Wan Animate", _WAN, ("AnimateWanModel",), home_after=_animate_face_layers, sequence=False),
        # ComfyUI 0.29: SCAIL appends pose tokens to the video tokens; WanDancer injects music after
        # the ``music_injector`` layers. Their token splits are not proven: blocks only.
        ArchSpec("Wan SCAIL", _WAN, ("SCAILWanModel", "SCAIL2WanModel"), sequence=False, why_not=_UNPROVEN),
        ArchSpec("WanDancer", _WAN, ("WanDancerModel",), home_after=_injected_layers("music_injector"),
                 sequence=False, why_not=_UNPROVEN),
    ), sim_inputs=_wan_inputs, refused={"CausalWanModel": (
        "its autoregressive forward writes each block's key/value cache in place, and a block on another "
        "device would write into a copy: the video would be wrong; run it with ComfyUI's core nodes")}),
    ComfyFamily("ltxv", (ArchSpec("LTX-Video", "ltxv", ("LTXVModel",)),), sim_inputs=_ltxv_inputs),
    ComfyFamily(_HY, (ArchSpec("HunyuanVideo", _HY, ("HunyuanVideo",), token_order=read_text_order),),
                params_class="comfy.ldm.hunyuan_video.model.HunyuanVideo", sim_inputs=_hunyuan_inputs),
    ComfyFamily("flux", (ArchSpec("Flux", "flux", ("Flux",)),), params_class="comfy.ldm.flux.model.Flux"),
    ComfyFamily("ltxav", (ArchSpec("LTX-2", "ltxav", ("LTXAVModel",)),), sim_inputs=_ltxv_inputs,
                sim_latent=_ltxav_latent),
    ComfyFamily("kandinsky5", (ArchSpec("Kandinsky 5", "kandinsky5", ("Kandinsky5",)),),
                sim_inputs=lambda unet, g, empty: {"y": empty(g.pooled_dim)}),
    ComfyFamily("minimax_h3", (ArchSpec("MiniMax H3", "minimax_h3", ("MiniMaxH3Model",)),),
                sim_latent=_minimax_h3_latent, sim_scalars=True),
)}
"""Family name (as in ``parallel/families.py``) -> ComfyUI's side."""


def family_of_image_model(image_model) -> str | None:
    """The family whose pure entry lists ``unet_config["image_model"]`` ``image_model``, else None."""
    return next((f.name for f in FAMILIES.values() if image_model in f.image_models), None)


def comfy_family(name: str) -> ComfyFamily:
    """ComfyUI's side of family ``name``; ValueError lists the known ones."""
    if name not in COMFY_FAMILIES:
        raise InputError(f"model family {name!r} has no ComfyUI entry: known {', '.join(COMFY_FAMILIES)}")
    return COMFY_FAMILIES[name]
