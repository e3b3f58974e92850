"""Tiny random-weight models built from ComfyUI's own classes, saved as ComfyUI loads them.

Every builder instantiates ComfyUI's real class on ``meta`` (no memory, no init cost), takes the
state-dict key names and shapes from it and fills each tensor from its own generator seeded by
``(seed, key name)``: the same seed gives bit-identical files in any order, on any machine.
Scales keep activations finite: matrices ~ N(0, 1/fan_in), norm weights 1 + N(0, 0.02²),
biases and the rest ~ N(0, 0.02²).

Needs ComfyUI importable (``harness.comfy_env.load_comfy()`` first). File-level helpers:
``write_tiny_models(models_dir, names=...)`` writes the whole set; ``MODEL_KINDS`` lists what it
can write. What each model is and how ComfyUI loads it back is in ``TINY_MODEL_NOTES``.
"""
from __future__ import annotations

import io
import json
import os
import random
import string
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Mapping

import torch

from .pack import import_pack

import_pack()
from sharddit.loaders.comfy.models.model_params import fit_params  # noqa: E402
from sharddit.parallel.random_weights import random_generator, random_state_dict, random_tensor  # noqa: E402

from .tiny_te_hook import TE_CONFIG_KEY, install_tiny_te_hook  # noqa: F401  (re-exported)

SEED = 0

# Wan 2.1 t2v. ComfyUI infers heads = dim // 128 and takes text_dim 4096 (not detected).
WAN_CONFIG = dict(model_type="t2v", patch_size=(1, 2, 2), text_len=512, in_dim=16, dim=256,
                  ffn_dim=512, freq_dim=256, text_dim=4096, out_dim=16, num_heads=2, num_layers=4,
                  window_size=(-1, -1), qk_norm=True, cross_attn_norm=True, eps=1e-6)

# UMT5 for CLIPLoader type "wan". The DiT's text_embedding takes 4096 features, so d_model stays
# 4096; everything else is tiny. ComfyUI builds the text encoder from its fixed
# umt5_config_xxl.json (5.7B params) unless model_options["umt5xxl_model_config"] overrides it
# (see ``tiny_clip_model_options``). ComfyUI detects T5-XXL only by the key UMT5_DETECT_KEY and
# its shape: 4096 input features (``shape[-1]``, 0.3.64) or 10240 rows (``shape[0]``, 0.29). The
# file carries that one tensor as a marker beside the 2 real blocks, shaped UMT5_DETECT_SHAPE:
# both rules hold and it has no elements (nothing to store, and ``weight_dtype`` counts none). The
# loader ignores it as an unexpected key; 24 real blocks made every CPU encode of the 512 padded
# tokens ~12x slower.
UMT5_CONFIG = dict(d_ff=16, d_kv=8, d_model=4096, num_heads=2, num_layers=2, vocab_size=256,
                   dense_act_fn="gelu_pytorch_tanh", is_gated_act=True, model_type="umt5",
                   layer_norm_epsilon=1e-6, relative_attention_num_buckets=32)
UMT5_DETECT_KEY = "encoder.block.23.layer.1.DenseReluDense.wi_1.weight"
UMT5_DETECT_SHAPE = (10240, 0, 4096)  # T5-XXL's wi_1 rows, no elements, its input features

# ComfyUI's VAE() picks the Wan 2.1 config itself (dim 96, 127M params): no smaller one exists.
WAN21_VAE_CONFIG = dict(dim=96, z_dim=16, dim_mult=[1, 2, 4, 4], num_res_blocks=2, attn_scales=[],
                        temperal_downsample=[False, True, True], dropout=0.0)

# LTX-Video: ComfyUI fixes 32 heads and infers head dim = attn2.to_k rows // 32.
LTXV_CONFIG = dict(in_channels=128, cross_attention_dim=256, attention_head_dim=8,
                   num_attention_heads=32, caption_channels=4096, num_layers=2)

# HunyuanVideo: heads = hidden // 128 (rope axes 16+56+56 = 128 per head).
HUNYUAN_VIDEO_CONFIG = dict(image_model="hunyuan_video", in_channels=16, out_channels=16,
                            vec_in_dim=768, context_in_dim=4096, hidden_size=256, mlp_ratio=4.0,
                            num_heads=2, depth=1, depth_single_blocks=1, axes_dim=[16, 56, 56],
                            theta=256, patch_size=[1, 2, 2], qkv_bias=True, guidance_embed=True,
                            byt5=False, meanflow=False)

LORA_RANK = 4


# ----------------------------------------------------------------------------- filling weights
def _fill(name: str, shape: torch.Size, seed: int) -> torch.Tensor:
    return random_tensor(name, shape, seed)


def fill_state_dict(module: torch.nn.Module, seed: int, dtype=torch.float32) -> dict:
    """Deterministic random tensors for every state-dict entry of ``module`` (may be on meta)."""
    return random_state_dict(module, seed, dtype)


def _meta_ops():
    import comfy.ops

    return comfy.ops.disable_weight_init


# ----------------------------------------------------------------------------- state dicts
def wan21_t2v_state_dict(seed: int = SEED, dtype=torch.float32, **overrides) -> dict:
    """Wan 2.1 t2v DiT (``comfy.ldm.wan.model.WanModel``), ComfyUI checkpoint key names."""
    from comfy.ldm.wan.model import WanModel

    cfg = {**WAN_CONFIG, **overrides}
    cfg["num_heads"] = cfg["dim"] // 128
    model = WanModel(**cfg, device="meta", operations=_meta_ops())
    return fill_state_dict(model, seed, dtype)


def wan22_t2v_pair_state_dicts(seed: int = SEED, dtype=torch.float32, **overrides) -> tuple:
    """Wan 2.2 A14B-style (high-noise, low-noise) experts: same class, seeds seed+1 / seed+2."""
    return (wan21_t2v_state_dict(seed + 1, dtype, **overrides),
            wan21_t2v_state_dict(seed + 2, dtype, **overrides))


def ltxv_state_dict(seed: int = SEED, dtype=torch.float32, **overrides) -> dict:
    """LTX-Video DiT (``comfy.ldm.lightricks.model.LTXVModel``)."""
    from comfy.ldm.lightricks.model import LTXVModel

    cfg = {**LTXV_CONFIG, **overrides}
    cfg["cross_attention_dim"] = cfg["num_attention_heads"] * cfg["attention_head_dim"]
    model = LTXVModel(**cfg, device="meta", operations=_meta_ops())
    return fill_state_dict(model, seed, dtype)


def hunyuan_video_state_dict(seed: int = SEED, dtype=torch.float32, **overrides) -> dict:
    """HunyuanVideo t2v DiT (``comfy.ldm.hunyuan_video.model.HunyuanVideo``)."""
    from comfy.ldm.hunyuan_video.model import HunyuanVideo

    cfg = fit_params(HunyuanVideo, {**HUNYUAN_VIDEO_CONFIG, **overrides})  # fields differ by version
    model = HunyuanVideo(**cfg, device="meta", operations=_meta_ops())
    return fill_state_dict(model, seed, dtype)


def wan21_vae_state_dict(seed: int = SEED, dtype=torch.bfloat16) -> dict:
    """Wan 2.1 VAE (``comfy.ldm.wan.vae.WanVAE``) at the only size ComfyUI detects (127M)."""
    from comfy.ldm.wan.vae import WanVAE

    with torch.device("meta"):
        model = WanVAE(**WAN21_VAE_CONFIG)
    return fill_state_dict(model, seed, dtype)


def tiny_spiece_model() -> bytes:
    """A 256-piece SentencePiece unigram model (pad 0, eos 1, unk 2), trained deterministically."""
    import sentencepiece as spm

    r = random.Random(0)
    base = ("a red fox jumps over the lazy dog in a video of the sea with waves cat runs city "
            "night light rain sun mountain river forest slow motion camera pan zoom close up wide "
            "shot").split()
    words = base + ["".join(r.choice(string.ascii_lowercase) for _ in range(r.randint(2, 8)))
                    for _ in range(300)]
    chars = string.ascii_letters + string.digits + ".,;:!?'\"-()"
    sents = [" ".join(r.choice(words) for _ in range(12)) for _ in range(3000)] + [" ".join(chars)] * 5
    buf = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(sents), model_writer=buf, vocab_size=UMT5_CONFIG["vocab_size"],
        model_type="unigram", pad_id=0, eos_id=1, unk_id=2, bos_id=-1, num_threads=1,
        character_coverage=1.0, hard_vocab_limit=False, minloglevel=2)
    return buf.getvalue()


def umt5_state_dict(seed: int = SEED, dtype=torch.float32) -> dict:
    """Tiny UMT5 encoder (``comfy.text_encoders.t5.T5``) + its SentencePiece model as ``spiece_model``."""
    import comfy.text_encoders.t5

    config = json.loads(_umt5_base_config_path().read_text())
    config.update(UMT5_CONFIG)
    model = comfy.text_encoders.t5.T5(config, None, "meta", _meta_ops())
    sd = fill_state_dict(model, seed, dtype)
    sd[UMT5_DETECT_KEY] = torch.zeros(UMT5_DETECT_SHAPE, dtype=dtype)
    sd["spiece_model"] = torch.frombuffer(bytearray(tiny_spiece_model()), dtype=torch.uint8).clone()
    sd[TE_CONFIG_KEY] = _bytes_tensor(json.dumps({"umt5xxl_model_config": UMT5_CONFIG}).encode())
    return sd


def _bytes_tensor(b: bytes) -> torch.Tensor:
    return torch.frombuffer(bytearray(b), dtype=torch.uint8).clone()


def _umt5_base_config_path() -> Path:
    import comfy.text_encoders.t5

    return Path(comfy.text_encoders.t5.__file__).parent / "umt5_config_xxl.json"


def tiny_clip_model_options(model_options: Mapping | None = None) -> dict:
    """``model_options`` that make ``comfy.sd.load_clip(..., clip_type=WAN)`` build the tiny UMT5.

    ComfyUI builds a "wan" text encoder from its fixed umt5_config_xxl.json (5.7B params, ~23 GB
    in fp32) whatever the file holds; ``<model_name>_model_config`` in ``model_options`` is
    ComfyUI's own per-encoder config override (``comfy.sd1_clip.SDClipModel``).
    """
    return {**(model_options or {}), "umt5xxl_model_config": dict(UMT5_CONFIG)}


def wan_lora_state_dict(dit_sd: Mapping, seed: int = SEED, rank: int = LORA_RANK,
                        blocks: tuple = (0, 1), strength_scale: float = 1.0) -> dict:
    """LoRA for a Wan DiT: ``diffusion_model.blocks.N.<linear>.lora_up/lora_down/alpha`` keys.

    ComfyUI's LoRA loader maps ``diffusion_model.X`` onto ``X.weight`` of the Wan model, so each
    pair patches ``blocks.N.<linear>.weight`` (self_attn q/k/v/o, cross_attn q/k/v/o, ffn.0/2).
    ``lora_up`` is non-zero (unlike training init) so the patch visibly changes the output.
    """
    out = {}
    targets = ["self_attn.q", "self_attn.k", "self_attn.v", "self_attn.o",
               "cross_attn.q", "cross_attn.k", "cross_attn.v", "cross_attn.o", "ffn.0", "ffn.2"]
    for n in blocks:
        for t in targets:
            w = dit_sd[f"blocks.{n}.{t}.weight"]
            key = f"diffusion_model.blocks.{n}.{t}"
            g = random_generator(seed, key)
            out[f"{key}.lora_down.weight"] = torch.randn(rank, w.shape[1], generator=g) / w.shape[1] ** 0.5
            out[f"{key}.lora_up.weight"] = torch.randn(w.shape[0], rank, generator=g) * 0.1 * strength_scale
            out[f"{key}.alpha"] = torch.tensor(float(rank))
    return out


def adapt_conditioning(conditioning: list, model_kind: str) -> list:
    """Conditioning from the tiny UMT5 made acceptable to other tiny DiTs (a new list).

    The tiny UMT5 (4096 wide) is the only tiny text encoder; LTXV's forward also needs the
    ``attention_mask`` its own T5 would return, HunyuanVideo the CLIP-L ``pooled_output`` (768).
    Wan kinds pass through unchanged.
    """
    out = []
    for tensor, extra in conditioning:
        extra = dict(extra)
        if model_kind == "ltxv" and extra.get("attention_mask") is None:
            extra["attention_mask"] = torch.ones(tensor.shape[:2], dtype=torch.long)
        elif model_kind == "hunyuan_video" and extra.get("pooled_output") is None:  # umt5 gives None
            extra["pooled_output"] = torch.zeros(tensor.shape[0], 768)
        out.append([tensor, extra])
    return out


# ----------------------------------------------------------------------------- writing files
@dataclass(frozen=True)
class ModelKind:
    folder: str          # ComfyUI folder_paths key == subfolder of the models dir
    default_name: str    # canonical file name
    note: str            # what it is and how it loads back


MODEL_KINDS: dict[str, ModelKind] = {
    "wan21_t2v": ModelKind("diffusion_models", "tiny_wan2.1_t2v.safetensors",
                           "WanModel t2v dim 256, 2 heads, 4 blocks, ffn 512; UNETLoader → WAN21_T2V"),
    "wan22_high_noise": ModelKind("diffusion_models", "tiny_wan2.2_t2v_high_noise.safetensors",
                                  "as wan21_t2v, seed+1 (Wan 2.2 high-noise expert)"),
    "wan22_low_noise": ModelKind("diffusion_models", "tiny_wan2.2_t2v_low_noise.safetensors",
                                 "as wan21_t2v, seed+2 (Wan 2.2 low-noise expert)"),
    "ltxv": ModelKind("diffusion_models", "tiny_ltxv.safetensors",
                      "LTXVModel 32 heads × 8, 2 blocks, in 128; UNETLoader → LTXV"),
    "hunyuan_video": ModelKind("diffusion_models", "tiny_hunyuan_video_t2v.safetensors",
                               "HunyuanVideo hidden 256, 2 heads, 1 double + 1 single block; "
                               "UNETLoader → HunyuanVideo"),
    "umt5": ModelKind("text_encoders", "tiny_umt5.safetensors",
                      "T5 (umt5) d_model 4096, 2 layers, 2 heads × 8, ffn 16, vocab 256 + spiece_model; "
                      "CLIPLoader type wan with the harness's tiny-TE hook"),
    "wan21_vae": ModelKind("vae", "tiny_wan_2.1_vae.safetensors",
                           "WanVAE dim 96 (full size, 127M params, bf16); VAELoader → Wan 2.1 VAE"),
    "wan21_lora": ModelKind("loras", "tiny_wan2.1_t2v_lora.safetensors",
                            "LoRA rank 4 on blocks 0-1 of wan21_t2v; LoraLoaderModelOnly"),
    "wan21_lora_all": ModelKind("loras", "tiny_wan2.1_t2v_lora_all_blocks.safetensors",
                                "LoRA rank 4 on blocks 0-3 (all) of wan21_t2v; LoraLoaderModelOnly"),
}

_BUILDERS: dict[str, Callable[[int], dict]] = {
    "wan21_t2v": lambda s: wan21_t2v_state_dict(s),
    "wan22_high_noise": lambda s: wan22_t2v_pair_state_dicts(s)[0],
    "wan22_low_noise": lambda s: wan22_t2v_pair_state_dicts(s)[1],
    "ltxv": lambda s: ltxv_state_dict(s),
    "hunyuan_video": lambda s: hunyuan_video_state_dict(s),
    "umt5": lambda s: umt5_state_dict(s),
    "wan21_vae": lambda s: wan21_vae_state_dict(s),
    "wan21_lora": lambda s: wan_lora_state_dict(wan21_t2v_state_dict(s), s),
    "wan21_lora_all": lambda s: wan_lora_state_dict(wan21_t2v_state_dict(s), s, blocks=(0, 1, 2, 3)),
}

FOLDERS = ("diffusion_models", "text_encoders", "vae", "loras")


@dataclass
class TinyModels:
    """What ``write_tiny_models`` wrote. ``names[kind]`` is the canonical file name (what a
    loader node's ``*_name`` input takes); ``aliases[name]`` is the kind behind any extra name."""

    root: Path
    seed: int
    names: dict = field(default_factory=dict)
    aliases: dict = field(default_factory=dict)

    def path(self, kind_or_name: str) -> Path:
        kind = kind_or_name if kind_or_name in MODEL_KINDS else self.aliases[kind_or_name]
        name = kind_or_name if kind_or_name in self.aliases else self.names[kind]
        return self.root / MODEL_KINDS[kind].folder / name

    def add_aliases(self, names: Mapping[str, str]) -> None:
        """Expose kinds under more file names, e.g. ``{"wan2.1_t2v_14B_fp16.safetensors": "wan21_t2v"}``.

        Symlinks to the canonical file (ComfyUI follows them), so no extra disk or build time.
        A name may carry a subfolder (``"wan/x.safetensors"``), as in ComfyUI's lists.
        """
        for name, kind in names.items():
            if kind not in MODEL_KINDS:
                raise ValueError(f"unknown tiny model kind {kind!r} for {name!r}; known: {sorted(MODEL_KINDS)}")
            target = self.root / MODEL_KINDS[kind].folder / self.names[kind]
            link = self.root / MODEL_KINDS[kind].folder / name
            link.parent.mkdir(parents=True, exist_ok=True)
            if link.is_symlink() or link.exists():
                link.unlink()
            os.symlink(target, link)
            self.aliases[name] = kind


def save_file(sd: Mapping, path: Path, metadata: Mapping | None = None) -> None:
    """safetensors save via a unique temp file + rename (safe with concurrent writers)."""
    from safetensors.torch import save_file as _save

    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    _save(dict(sd), str(tmp), metadata=dict(metadata or {}))
    os.replace(tmp, path)


def default_cache_dir() -> Path | None:
    """Where built files are kept between sessions: ``$SHARDDIT_TINY_MODELS_CACHE`` (``0`` turns
    caching off), else ``~/.cache/sharddit/tiny_models``. A subfolder per hash of this file and
    the ComfyUI version, so a change to either rebuilds."""
    env = os.environ.get("SHARDDIT_TINY_MODELS_CACHE")
    if env == "0":
        return None
    base = Path(env) if env else Path.home() / ".cache" / "sharddit" / "tiny_models"
    try:
        import comfyui_version

        version = comfyui_version.__version__
    except ImportError:
        version = "unknown"
    digest = zlib.crc32(Path(__file__).read_bytes() + version.encode())
    return base / f"{version}-{digest:08x}"


def write_tiny_models(models_dir, kinds=None, names: Mapping[str, str] | None = None,
                      seed: int = SEED, cache_dir=None) -> TinyModels:
    """Write tiny models into ``models_dir/{diffusion_models,text_encoders,vae,loras}/``.

    ``kinds``: which of ``MODEL_KINDS`` to write (default all). ``names``: extra file names →
    kind (written as symlinks, see ``TinyModels.add_aliases``). ``cache_dir``: build each file
    there once (atomically) and symlink it into ``models_dir`` (e.g. ``default_cache_dir()``).
    Returns a ``TinyModels``.
    """
    root = Path(models_dir)
    for folder in FOLDERS:
        (root / folder).mkdir(parents=True, exist_ok=True)
    out = TinyModels(root=root, seed=seed)
    for kind in kinds or MODEL_KINDS:
        spec = MODEL_KINDS[kind]
        path = root / spec.folder / spec.default_name
        built = Path(cache_dir) / f"seed{seed}" / spec.folder / spec.default_name if cache_dir else path
        meta = {"sharddit_tiny_kind": kind, "sharddit_tiny_seed": str(seed)}
        if not built.exists():
            save_file(_BUILDERS[kind](seed), built, meta)
        if built != path and not path.exists():
            os.symlink(built, path)
        out.names[kind] = spec.default_name
    if names:
        out.add_aliases(names)
    return out


def register_with_folder_paths(tiny: TinyModels) -> None:
    """Put the tiny models dir first in ComfyUI's search paths (in-process use)."""
    import folder_paths

    for folder in FOLDERS:
        folder_paths.add_model_folder_path(folder, str(tiny.root / folder), is_default=True)
    cache = getattr(folder_paths, "filename_list_cache", None)
    if isinstance(cache, dict):
        cache.clear()


def load_tiny_clip(path, clip_type: str = "wan", model_options: Mapping | None = None):
    """``comfy.sd.load_clip`` of a tiny UMT5 file with the config override it needs (no hook needed)."""
    import comfy.sd

    return comfy.sd.load_clip(ckpt_paths=[str(path)], clip_type=getattr(comfy.sd.CLIPType, clip_type.upper()),
                              model_options=tiny_clip_model_options(model_options))
