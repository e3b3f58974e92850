"""Model families (pure): what the engine knows of each DiT family, one entry per family.

A ``Family`` holds what needs no ComfyUI: the block lists and the arguments that carry the hidden
state from block to block (``blocks`` mode), the token axes ``sequence`` mode splits (None: the
family runs ``blocks`` only, and ``why_blocks_only`` says why), the latent and conditioning
geometry read from ComfyUI's ``unet_config``, and the cost model's shape. The ComfyUI side (class
names, inter-block code read off an instance, the simulator's inputs, presets) is one entry per
family in ``loaders/comfy/models/comfy_families.py``, found by the same ``name``. Adding a family is one entry
in each. Shapes are read from ComfyUI 0.3.64 and 0.29 (the file each entry cites).
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from .cost.inputs import BlockShape, ModelShape, latent_frames
from .sequence.split import TokenSpec
from .errors import InputError

__all__ = ["FAMILIES", "Family", "Geometry", "activation_variant", "family_of", "geometry_of", "get_family", "shape_from_config",
           "shape_from_spec", "shape_of_unet"]


@dataclass(frozen=True)
class Geometry:
    """Latent and conditioning shapes of a model family (what the sampler feeds the DiT)."""

    in_channels: int
    """Channels of the DiT input (latent channels, plus concatenated image channels for i2v)."""
    spatial: int
    """Pixels per latent cell along width and height."""
    temporal: int
    """Frames per latent frame after the first: latent frames = (frames - 1) // temporal + 1."""
    context_tokens: int
    """Text tokens the text encoder produces (ComfyUI pads to at least this many)."""
    context_dim: int
    """Width of each text token."""
    pooled_dim: int = 0
    """Width of the pooled text vector (HunyuanVideo's CLIP-L ``y``), 0 when none."""
    clip_tokens: int = 0
    """Image-encoder tokens (Wan 2.1 i2v ``clip_fea``), 0 when none."""
    frame_grid: tuple = ()
    """``cost.inputs.latent_frames``'s grid (MiniMax H3), () for ``temporal`` frames per latent frame."""

    def latent_shape(self, width: int, height: int, frames: int, batch: int) -> tuple:
        t = latent_frames(frames, self.temporal, self.frame_grid)
        return (batch, self.in_channels, t, height // self.spatial, width // self.spatial)


@dataclass(frozen=True)
class Family:
    """One DiT family (see the module docstring)."""

    name: str
    """The one name both sides find the family by (``wan``, ``ltxv``, ``hunyuan_video``, ...)."""
    title: str
    """Shown to users."""
    block_lists: tuple[str, ...]
    """Attribute names of the model's block lists, in the order the forward runs them."""
    stream_args: tuple[tuple[int | str, ...], ...]
    """Per block list, the block arguments that carry the hidden state (the rest are constants)."""
    home_every_block_kwargs: tuple[str, ...] = ()
    """Block arguments that, when given, mean the model runs code on its home device after every block."""
    token_specs: tuple[TokenSpec, ...] | None = None
    """Per block list, the token axes `sequence` splits; None: `blocks` only."""
    why_blocks_only: str = "sequence mode does not split this architecture yet"
    image_models: tuple[str, ...] = ()
    """``unet_config["image_model"]`` values of this family; empty: not planned from a config."""
    geometry: Callable[[dict], Geometry] | None = None
    cost_shape: Callable[..., ModelShape] | None = None
    """``(name, unet_config, spatial, temporal, text_tokens, clip_tokens) -> ModelShape``."""
    lean_block_attr: str | None = None
    """A last-block attribute that selects the ``<name>/lean`` activation factors (``cost/memory.py``:
    HunyuanVideo single blocks that split ``linear1`` into ``mlp_hidden_dim_first`` free q/k/v early)."""
    code_variant: tuple[str, str, str] | None = None
    """``(submodule, name, suffix)``: when the last block's ``submodule`` calls ``name`` in its
    ``forward``, the ``<name>/<suffix>`` activation factors (Wan's and LTX-Video's FFN through core's
    ``linear_input_act``, ComfyUI 0.33: the up-projection stays alive through the down-projection)."""
    runs_fp16: bool = False
    """ComfyUI runs this family in fp16 (else fp16 files compute in bf16)."""
    default_cfg: float | None = None
    """The guidance ``plan`` assumes when none is given, where core's templates sample this family
    otherwise than with cfg > 1 (MiniMax H3: 1, ``BasicGuider`` on the prompt alone); None: plan's own."""
    max_batch: int = 2
    """Largest batch ComfyUI gives the DiT in one call: 1 when it never batches cond and uncond
    (MiniMax H3: a per-condition payload keeps them apart, and its forward takes batch 1)."""
    text_encoders: Callable[[dict], tuple[str, ...]] | None = None
    """``unet_config -> keys`` of the text encoder(s) ComfyUI loads for this family's DiT (the keys of
    ``loaders/plan/text_encoders.ENCODERS``: sizes and layers live there, by encoder); None: no
    known encoder (``plan`` prints no text encoder line)."""

    def activation_key(self, last_block) -> str:
        """The ``ACTIVATION_FACTORS`` key for a model whose last block is ``last_block``: read from
        the block's code, never from a version string."""
        if self.lean_block_attr and hasattr(last_block, self.lean_block_attr):
            return f"{self.name}/lean"
        if self.code_variant:
            sub, called, suffix = self.code_variant
            code = getattr(getattr(type(getattr(last_block, sub, None)), "forward", None), "__code__", None)
            if called in getattr(code, "co_names", ()):
                return f"{self.name}/{suffix}"
        return self.name


# ---- Wan 2.1 / 2.2 (comfy/ldm/wan/model.py ``WanAttentionBlock``) ----
def _wan_geometry(unet: dict) -> Geometry:
    spatial = 16 if unet.get("out_dim") == 48 else 8  # Wan 2.2 5B's VAE
    clip = 257 if unet.get("model_type") == "i2v" else 0
    return Geometry(unet.get("in_dim", 16), spatial, 4, context_tokens=512, context_dim=4096, clip_tokens=clip)


def _wan_cost(name, cfg, spatial, temporal, text_tokens, clip_tokens=0) -> ModelShape:
    d, f = cfg["dim"], cfg["ffn_dim"]
    kv_img = 2 * d * d if clip_tokens else 0  # i2v: k_img, v_img over the CLIP image tokens
    blocks = (BlockShape(cfg["num_layers"], 6 * d * d + 2 * d * f, 2 * d * d, 8 * d * d + 2 * d * f + kv_img),)
    return ModelShape(name, d, cfg["num_heads"], blocks, text_tokens + clip_tokens, spatial, temporal,
                      tuple(cfg.get("patch_size", (1, 2, 2))))


# ---- LTX-Video (comfy/ldm/lightricks/model.py ``BasicTransformerBlock``, ``FeedForward`` mult 4) ----
def _ltxv_geometry(unet: dict) -> Geometry:
    return Geometry(unet.get("in_channels", 128), 32, 8, context_tokens=128, context_dim=4096)


def _ltxv_cost(name, cfg, spatial, temporal, text_tokens, clip_tokens=0) -> ModelShape:
    heads = cfg.get("num_attention_heads", 32)
    d = heads * cfg.get("attention_head_dim", 64)
    # self-attn 4d², cross q/out 2d² on image tokens, cross k/v 2d² on text, FFN 8d² (mult 4).
    blocks = (BlockShape(cfg.get("num_layers", 28), 14 * d * d, 2 * d * d, 16 * d * d),)
    return ModelShape(name, d, heads, blocks, text_tokens, spatial, temporal, (1, 1, 1))


# ---- LTX-2 / LTX-2.3 (0.29 comfy/ldm/lightricks/av_model.py ``LTXAVModel``, ``BasicAVTransformerBlock``) ----
def _ltxav_geometry(unet: dict) -> Geometry:
    """The video latent (LTXV's: 128 channels, 32x spatial, 8x temporal); the audio latent beside it is
    built by the simulator's inputs. Text: Gemma 3 12B, padded to 1024 tokens (``Gemma3_12BTokenizer``
    min_length), given to the DiT after ``preprocess_text_embeds``: video + audio widths side by side
    (LTX-2.3, ``caption_proj_before_connector``: 4096 + 2048) or two 3840-wide copies (LTX-2)."""
    if unet.get("caption_proj_before_connector"):
        width = unet.get("cross_attention_dim", 4096) + unet.get("audio_cross_attention_dim", 2048)
    else:
        width = 2 * unet.get("caption_channels", 3840)
    return Geometry(unet.get("in_channels", 128), 32, 8, context_tokens=1024, context_dim=width)


def _ltxav_cost(name, cfg, spatial, temporal, text_tokens, clip_tokens=0) -> ModelShape:
    """Video stream as LTXV plus the audio->video cross-attention's q/out on every video token; the
    audio stream's own work runs on ~25 tokens a second of video (frames, not frames x pixels):
    under 1% of the video's at 704p, left out of the per-token FLOPs but in the bytes."""
    heads = cfg.get("num_attention_heads", 32)
    d = heads * cfg.get("attention_head_dim", 128)
    da = cfg.get("audio_num_attention_heads", 32) * cfg.get("audio_attention_head_dim", 64)
    cross_modal = 2 * (2 * d * da + 2 * da * da)  # a2v and v2a: q/out on one side, k/v on the other (width da)
    # video->audio attention (``_LTXAV_TOKENS`` gather_kv): every video token's keys and values, da wide
    # (the audio's heads x head width), gathered by heads in `sequence`
    blocks = (BlockShape(cfg.get("num_layers", 48), 14 * d * d + 2 * d * da, 2 * d * d + 2 * da * da,
                         16 * d * d + 16 * da * da + cross_modal, gathered_kv_width=da),)
    return ModelShape(name, d, heads, blocks, text_tokens, spatial, temporal, (1, 1, 1))


# ---- HunyuanVideo (comfy/ldm/flux/layers.py ``DoubleStreamBlock``, ``SingleStreamBlock``) ----
def _hunyuan_geometry(unet: dict) -> Geometry:
    """HunyuanVideo 1.5 (a vision projection: ``vision_in_dim``, ComfyUI 0.29 supported_models.py
    ``HunyuanVideo15``) has a 16x spatial VAE (latent_formats.py ``HunyuanVideo15``); 1.0 has 8x."""
    pooled = 768 if unet.get("vec_in_dim") else 0
    spatial = 16 if unet.get("vision_in_dim") else 8
    return Geometry(unet.get("in_channels", 16), spatial, 4, context_tokens=256,
                    context_dim=unet.get("context_in_dim", 4096), pooled_dim=pooled)


def _hunyuan_cost(name, cfg, spatial, temporal, text_tokens, clip_tokens=0) -> ModelShape:
    d = cfg["hidden_size"]
    m = int(d * cfg.get("mlp_ratio", 4.0))
    per_stream = 4 * d * d + 2 * d * m  # qkv + proj + MLP; modulation runs on one vector
    single = d * (3 * d + m) + (d + m) * d
    blocks = (BlockShape(cfg["depth"], per_stream, per_stream, 2 * per_stream + 12 * d * d, True, False),
              BlockShape(cfg["depth_single_blocks"], single, single, single + 3 * d * d, True, False))
    return ModelShape(name, d, cfg["num_heads"], blocks, text_tokens, spatial, temporal,
                      tuple(cfg.get("patch_size", (1, 2, 2))))


# ---- Kandinsky 5 (0.29 comfy/ldm/kandinsky5/model.py; constructor defaults = Video Lite) ----
def _kandinsky5_geometry(unet: dict) -> Geometry:
    """latent_formats.HunyuanVideo (supported_models.py ``Kandinsky5``): 8x spatial, 4x temporal;
    the DiT's input is the latent + image + mask channels (``visual_embed_dim`` over the patch);
    Qwen2.5-VL 7B text (3584 wide), CLIP-L pooled (768)."""
    patch = unet.get("patch_size", (1, 2, 2))
    channels = unet.get("visual_embed_dim", 132) // (patch[0] * patch[1] * patch[2])
    return Geometry(channels, 8, 4, context_tokens=256, context_dim=unet.get("in_text_dim", 3584), pooled_dim=768)


def _kandinsky5_cost(name, cfg, spatial, temporal, text_tokens, clip_tokens=0) -> ModelShape:
    d, f, td = cfg.get("model_dim", 1792), cfg.get("ff_dim", 7168), cfg.get("time_dim", 512)
    ffn = 2 * d * f
    # text blocks: self-attention (4d²) + FFN on the text tokens only; modulation from the time vector
    text = BlockShape(cfg.get("num_text_blocks", 2), 0, 4 * d * d + ffn, 4 * d * d + ffn + 6 * td * d, False, False)
    # visual blocks: self-attn 4d², cross q/out 2d² and FFN on image tokens, cross k/v 2d² on text
    visual = BlockShape(cfg.get("num_visual_blocks", 32), 6 * d * d + ffn, 2 * d * d, 8 * d * d + ffn + 9 * td * d)
    heads = d // sum(cfg.get("axes_dims", (16, 24, 24)))
    return ModelShape(name, d, heads, (text, visual), text_tokens, spatial, temporal,
                      tuple(cfg.get("patch_size", (1, 2, 2))))


# ---- MiniMax H3 (0.33 comfy/ldm/minimax/model.py ``MiniMaxH3Model``, ``DiTBlock``) ----
_H3_FRAMES = (5, 2, 17, 5)
"""0.33 comfy_extras/nodes_minimax_h3.py: frames snap up to 17k + 5; 5 frames -> 2 latent frames, each
17 more -> 5 more (1344x768x124 -> 37 latent frames)."""


def _minimax_h3_geometry(unet: dict) -> Geometry:
    """latent_formats.MiniMaxH3Video: 24 channels, 16x spatial, 4x temporal (the audio latent beside it
    is built by the simulator's inputs); Qwen3-VL 32B text (5120 wide, ``text_dim``), a prompt of a few
    hundred tokens (256 here, as for the other LLM encoders)."""
    return Geometry(unet.get("latents_dim", 24), 16, 4, context_tokens=256, context_dim=unet.get("text_dim", 5120),
                    frame_grid=_H3_FRAMES)


def _minimax_h3_cost(name, cfg, spatial, temporal, text_tokens, clip_tokens=0) -> ModelShape:
    """One packed sequence (text, audio, video) through every block: fused q/k/v 3d² + out d², a SwiGLU
    MLP (fc1 d x 2f, fc2 f x d); AdaLN from the time vector: t_dim x 6d for each of 3 modalities.
    The audio stream (2 tokens per audio step, ~3 per video frame) is under 2% of the video's at
    704p: left out of the per-token FLOPs, in the bytes."""
    d, f = cfg.get("hidden_size", 5376), cfg.get("ffn_hidden_size", 14336)
    per_token = 4 * d * d + 3 * d * f
    adaln = cfg.get("time_embed_dim", 2688) * 18 * d
    blocks = (BlockShape(cfg.get("num_layers", 50), per_token, per_token, per_token + adaln, True, False),)
    return ModelShape(name, d, cfg.get("num_attention_heads", 56), blocks, text_tokens, spatial, temporal,
                      tuple(cfg.get("patch_size", (1, 2, 2))), _H3_FRAMES)


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
# MiniMax H3 (0.33): one sample's packed rows h [S, C] (text, audio, video: all join one self-attention,
# so a contiguous cut of the rows is a token split like any other), rope_freqs [1, S, 1, r, 2, 2];
# mod_segments (start, stop, row) ranges of S, cut per rank; t_emb (one row per timestep) whole.
_MINIMAX_H3_TOKENS = (TokenSpec({"x": 0, "rope_freqs": 1}, unbatched=True, row_tables=("mod_segments",)),)
# Kandinsky 5 (0.29/0.33): text blocks run whole (the text alone, before the video is embedded); visual
# blocks split visual_embed [B, L, C] and freqs [1, L, ...]; text_embed (cross-attention) stays whole.
_KANDINSKY5_TOKENS = (TokenSpec(whole=True), TokenSpec({"visual_embed": 1, "freqs": 1}))
# LTX-2 / LTX-2.3 (0.29/0.33 av_model.py): the stream x = (vx [B, L, C], ax [B, A, Ca]); the video
# tokens split, the audio (25 tokens a second) whole on every rank, which all compute the same audio
# update. v_pe and v_cross_pe: (rotation [B, L, H, ...], split flag). The video timesteps are
# ``CompressedTimestep``s (one row per latent frame) or per-token tensors: each rank gets its rows.
# Video self-attention (attn1): Ulysses; audio->video attention: the rank's video queries against the
# whole audio (local); video->audio attention: the whole audio queries split by heads, each rank
# receiving every video token's keys/values of its heads (``TokenSpec.gather_kv``).
_LTXAV_TOKENS = (TokenSpec({"x": 1, "v_pe": 1, "v_cross_pe": 1}, whole_parts={"x": (1,)},
                           frame_tables=("v_timestep", "v_cross_scale_shift_timestep", "v_cross_gate_timestep"),
                           gather_kv=("video_to_audio_attn",), must_be_none=("self_attention_mask",)),)
_MMDIT = (("double_blocks", "single_blocks"), (("img", "txt"), ("x",)))


# ---- the text encoders each family's DiT is conditioned by (keys of the simulator's encoder table) ----
def _ltxav_encoders(unet: dict) -> tuple[str, ...]:
    """Gemma 3 12B, and LTX-2.3's caption projection (before the connectors) or LTX-2's."""
    return ("gemma3-12b", "ltx2.3-projection" if unet.get("caption_proj_before_connector") else "ltx2-projection")


def _hunyuan_encoders(unet: dict) -> tuple[str, ...]:
    """HunyuanVideo 1.5 (``byt5`` / ``vision_in_dim`` in its config): Qwen2.5-VL 7B + byT5;
    HunyuanVideo 1.0: LLaVA-LLaMA-3 8B + CLIP-L."""
    if unet.get("byt5") or unet.get("vision_in_dim"):
        return ("qwen2.5-vl-7b", "byt5-small")
    return ("llava-llama3-8b", "clip-l")


_ENTRIES = (
    Family("wan", "Wan", ("blocks",), (("x",),), token_specs=_WAN_TOKENS, image_models=("wan2.1",),
           geometry=_wan_geometry, cost_shape=_wan_cost, runs_fp16=True,
           code_variant=("ffn", "linear_input_act", "fused_ffn"), text_encoders=lambda unet: ("umt5-xxl",)),
    Family("ltxv", "LTX-Video", ("transformer_blocks",), (("x",),), token_specs=_LTXV_TOKENS,
           image_models=("ltxv",), geometry=_ltxv_geometry, cost_shape=_ltxv_cost,
           code_variant=("ff", "linear_input_act", "fused_ffn"), text_encoders=lambda unet: ("t5-xxl",)),
    Family("hunyuan_video", "HunyuanVideo", *_MMDIT, home_every_block_kwargs=("control",),
           token_specs=_HUNYUAN_TOKENS, image_models=("hunyuan_video",), geometry=_hunyuan_geometry,
           cost_shape=_hunyuan_cost, lean_block_attr="mlp_hidden_dim_first", text_encoders=_hunyuan_encoders),
    Family("flux", "Flux", *_MMDIT, home_every_block_kwargs=("control",), image_models=("flux",)),
    # LTX-2 / LTX-2.3 (ComfyUI 0.29 comfy/ldm/lightricks/av_model.py ``LTXAVModel``): one list of
    # ``BasicAVTransformerBlock``s called as ``block((vx, ax), v_context=..., a_pe=..., ...)``: the
    # stream is the (video, audio) pair, returned as a pair.
    Family("ltxav", "LTX-2 (audio+video)", ("transformer_blocks",), (("x",),), token_specs=_LTXAV_TOKENS,
           image_models=("ltxav",), geometry=_ltxav_geometry, cost_shape=_ltxav_cost,
           text_encoders=_ltxav_encoders),
    # Kandinsky 5 (0.29 comfy/ldm/kandinsky5/model.py): text blocks ``block(x, time_embed, freqs)``
    # refine the text tokens, then visual blocks ``block(visual_embed, text_embed, time_embed, freqs)``
    # (the router brings the text home after the last text block, where the video is embedded).
    Family("kandinsky5", "Kandinsky 5", ("text_transformer_blocks", "visual_transformer_blocks"),
           (("x",), ("visual_embed",)), token_specs=_KANDINSKY5_TOKENS, image_models=("kandinsky5",),
           geometry=_kandinsky5_geometry, cost_shape=_kandinsky5_cost,
           text_encoders=lambda unet: ("qwen2.5-vl-7b", "clip-l")),
    # MiniMax H3 (0.33 comfy/ldm/minimax/model.py): one list of ``DiTBlock``s called as
    # ``block(h, t_emb, mod_segments, rope_freqs)`` on one packed sequence [S, C] (text, audio, video
    # rows; batch 1); ``mod_segments`` names row ranges of that sequence.
    Family("minimax_h3", "MiniMax H3", ("blocks",), (("x",),), token_specs=_MINIMAX_H3_TOKENS,
           image_models=("minimax_h3",), geometry=_minimax_h3_geometry, cost_shape=_minimax_h3_cost, max_batch=1,
           default_cfg=1.0, text_encoders=lambda unet: ("qwen3-vl-32b-h3",)),
)
FAMILIES: dict[str, Family] = {f.name: f for f in _ENTRIES}
"""Family name -> entry."""


def get_family(name: str) -> Family:
    """The entry named ``name``; ValueError lists the known names."""
    if name not in FAMILIES:
        raise InputError(f"model family {name!r} is not known: use one of {', '.join(FAMILIES)}")
    return FAMILIES[name]


def activation_variant(family: str, last_block) -> str:
    """The ``cost/memory.ACTIVATION_FACTORS`` key for a model of ``family`` whose last block is
    ``last_block``: read from the block's code by the family's entry (``Family.activation_key``),
    never from a version string."""
    return get_family(family).activation_key(last_block)


def family_of(unet: dict, what: str) -> str:
    """The family of a ``unet_config``; ValueError naming ``what`` (a file, a class) otherwise."""
    image_model = unet.get("image_model")
    for family in FAMILIES.values():
        if image_model in family.image_models and family.geometry is not None:
            return family.name
    known = ", ".join(f.title for f in FAMILIES.values() if f.geometry is not None)
    raise InputError(f"{what!r} is a {image_model!r} model; the simulator knows {known}")


def geometry_of(family: str, unet: dict) -> Geometry:
    return get_family(family).geometry(unet)


def shape_from_config(name: str, family: str, unet_config: dict, spatial: int, temporal: int,
                      text_tokens: int, clip_tokens: int = 0) -> ModelShape:
    """The cost model's ``ModelShape`` from ComfyUI's ``unet_config``, by ``family``'s entry."""
    fam = get_family(family)
    if fam.cost_shape is None:
        raise InputError(f"model family {family!r} has no cost shape: the cost model knows "
                         f"{', '.join(f.name for f in FAMILIES.values() if f.cost_shape)}")
    return fam.cost_shape(name, unet_config, spatial, temporal, text_tokens, clip_tokens)


def shape_from_spec(spec) -> ModelShape:
    """From the simulator's ``ModelSpec`` (duck-typed: ``name``, ``family``, ``unet_config``, ``geometry``)."""
    g = spec.geometry
    return shape_from_config(spec.name, spec.family, spec.unet_config, g.spatial, g.temporal,
                             g.context_tokens, getattr(g, "clip_tokens", 0))


def shape_of_unet(name: str, unet: dict) -> ModelShape:
    """The cost shape of a model from its ``unet_config`` alone (family, geometry, blocks)."""
    family = family_of(unet, name)
    g = geometry_of(family, unet)
    return shape_from_config(name, family, unet, g.spatial, g.temporal, g.context_tokens, g.clip_tokens)
