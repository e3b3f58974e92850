"""Tiny random-weight files for the 2026 video models' text encoders, as ComfyUI 0.29 loads them.

- LTX-2 / LTX-2.3: Gemma 3 12B (``text_encoders``) + the checkpoint's ``text_embedding_projection``
  (core's ``LTXAVTextEncoderLoader``: the Gemma file and the LTX-2 checkpoint, ``CLIPType.LTXV``).
- HunyuanVideo 1.5: Qwen2.5-VL 7B + byT5-small glyph (``DualCLIPLoader`` type ``hunyuan_video_15``).
- Kandinsky 5: Qwen2.5-VL 7B + CLIP-L (``DualCLIPLoader`` type ``kandinsky5``).

Key names and detection shapes are core's (``comfy.sd.detect_te_model``: Gemma 3 12B by layer 47's
q_norm, Qwen2.5 7B by k_proj.bias 512 = 4 kv heads x 128, byT5 glyph by k rows 384, CLIP-L by
text_model layers; ``LTXAVTEModel.load_sd`` routes the Gemma file by layer 47, Kandinsky's by CLIP
layer 1, HunyuanImage's byT5 by its o weight): so Gemma keeps 48 layers, Qwen 4 kv heads. Widths
the 2026 DiTs hard-code stay: Qwen 3584 (Kandinsky 5's ``in_text_dim``), CLIP-L 768
(``in_text_dim2``), byT5 1472 (HunyuanVideo 1.5's ``ByT5Mapper``). The rest is tiny, through the
harness's tiny-TE hook (``tiny_te_hook``: each file carries its config override; core's own
``<model_name>_model_config``), which also folds the two full-size token tables, shrinks LTX-2's
3840 x 49 projection to the checkpoint's shape and pads Gemma prompts to 64 tokens, not 1024. No
vision towers are stored: core builds them (uninitialised, untouched for text) and warns that their
keys are missing.

For the templates: the LTX-2.3 checkpoint a tiny DiT file stands for must carry
``ltxav_text_projection_state_dict(video_dim=<DiT video width>, audio_dim=<DiT audio width>)``
(top-level keys) so that ``LTXAVTextEncoderLoader`` finds its projection there.

Tokenizers work offline: Qwen's, byT5's and CLIP's ship in core's tree; Gemma's SentencePiece
model travels in the file (``spiece_model``), trained here with Gemma's special ids.

Output widths (what a tiny DiT must take): LTX-2.3 conditioning ``video_dim + audio_dim`` of the
projection (default 64 + 32, ``unprocessed_ltxav_embeds``); HunyuanVideo 1.5: Qwen 3584 + byT5
1472 (``conditioning_byt5small``, only for quoted text); Kandinsky 5: Qwen 3584, pooled 768.
"""
from __future__ import annotations

import io
import json
import os
import random
import string
import zlib
from pathlib import Path
from typing import Mapping

import torch

from .tiny_models import SEED, _bytes_tensor, _meta_ops, save_file
from .tiny_te_hook import TE_CONFIG_KEY, TINY_LTXAV, TINY_MIN_LENGTH, TINY_VOCAB_ROWS, install_tiny_te_hook

import sharddit.parallel.random_weights as rw  # noqa: E402  (tiny_models imported the pack)

# Gemma 3 12B: head_dim 256 and the vision tower are class constants; 48 layers for detection.
GEMMA3_12B_CONFIG = dict(vocab_size=256, hidden_size=32, intermediate_size=32, num_hidden_layers=48,
                         num_attention_heads=1, num_key_value_heads=1)
# Qwen2.5-VL 7B: head_dim 128 fixed, 4 kv heads (detection), 4 layers (HunyuanVideo 1.5 reads
# hidden state -3; core asserts |layer_idx| < layers), hidden 3584 (Kandinsky 5's DiT takes 3584 features).
QWEN25_7B_CONFIG = dict(vocab_size=152064, hidden_size=3584, intermediate_size=32, num_hidden_layers=4,
                        num_attention_heads=4, num_key_value_heads=4)
# byT5-small glyph (comfy/text_encoders/byt5_config_small_glyph.json): d_model 1472 and 6 x 64 kept.
BYT5_CONFIG = dict(d_ff=32, num_layers=1)
# CLIP-L (comfy/sd1_clip_config.json): 768 wide (Kandinsky 5's pooled input); 2 layers (routing).
CLIP_L_CONFIG = dict(intermediate_size=32, num_hidden_layers=2)
# Token-table rows stored for Qwen (152,064 ids) and CLIP-L (49,408): id -> row id % VOCAB_ROWS.
VOCAB_ROWS = 2048
LTXAV_VIDEO_DIM, LTXAV_AUDIO_DIM = 64, 32
# Gemma's tokenizer pads prompts to 1024 tokens (left, masked); the tiny file's pads to this.
GEMMA_MIN_LENGTH = 64


def _text_weights(module: torch.nn.Module, seed: int, dtype, skip=(), folded_vocab: str | None = None) -> dict:
    """Seeded weights for ``module``'s keys (on meta) but ``skip``; ``folded_vocab``: the token
    table, stored with ``VOCAB_ROWS`` rows (the hook folds ids onto them)."""
    shapes = {k: v.shape for k, v in module.state_dict().items() if not k.startswith(tuple(skip))}
    if folded_vocab:
        shapes[folded_vocab] = torch.Size((VOCAB_ROWS, shapes[folded_vocab][1]))
    return {k: rw.random_tensor(k, shape, seed).to(dtype) for k, shape in shapes.items()}


def _with_te_config(sd: dict, options: Mapping) -> dict:
    sd[TE_CONFIG_KEY] = _bytes_tensor(json.dumps(dict(options)).encode())
    return sd


def gemma_spiece_model() -> bytes:
    """A 256-piece SentencePiece model with Gemma's ids (pad 0, eos 1, bos 2, unk 3)."""
    import sentencepiece as spm

    r = random.Random(1)
    words = ("a red fox jumps over the lazy dog in a video of the sea with waves cat runs city night "
             "light rain sun camera pan zoom close up wide shot").split()
    words += ["".join(r.choice(string.ascii_lowercase) for _ in range(r.randint(2, 8))) for _ in range(300)]
    sents = [" ".join(r.choice(words) for _ in range(12)) for _ in range(3000)]
    sents += [" ".join(string.ascii_letters + string.digits + ".,;:!?'\"-()<>_/\n")] * 5
    buf = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(sents), model_writer=buf, vocab_size=GEMMA3_12B_CONFIG["vocab_size"],
        model_type="unigram", pad_id=0, eos_id=1, bos_id=2, unk_id=3, num_threads=1,
        character_coverage=1.0, hard_vocab_limit=False, minloglevel=2)
    return buf.getvalue()


def gemma3_12b_state_dict(seed: int = SEED, dtype=torch.float32) -> dict:
    """Gemma 3 12B text model (``comfy.text_encoders.llama.Gemma3_12B``) + ``spiece_model``."""
    import comfy.text_encoders.llama as llama

    model = llama.Gemma3_12B(GEMMA3_12B_CONFIG, dtype, "meta", _meta_ops())
    sd = _text_weights(model, seed, dtype, skip=("vision_model.", "multi_modal_projector."))
    sd["spiece_model"] = _bytes_tensor(gemma_spiece_model())
    return _with_te_config(sd, {"_model_config": GEMMA3_12B_CONFIG, TINY_LTXAV: 1,
                                TINY_MIN_LENGTH: {"gemma3_12b": GEMMA_MIN_LENGTH}})


def ltxav_text_projection_state_dict(seed: int = SEED, dtype=torch.float32, video_dim: int = LTXAV_VIDEO_DIM,
                                     audio_dim: int = LTXAV_AUDIO_DIM, dual: bool = True) -> dict:
    """The LTX-2 checkpoint's text projection (top-level keys, as in the checkpoint): LTX-2.3's
    ``dual_linear`` to ``video_dim`` + ``audio_dim`` (the DiT's video and audio widths), or
    LTX-2's ``single_linear`` (Gemma width out). Input: Gemma's hidden x (layers + 1)."""
    width = GEMMA3_12B_CONFIG["hidden_size"]
    in_dim = width * (GEMMA3_12B_CONFIG["num_hidden_layers"] + 1)
    p = "text_embedding_projection."
    shapes = ({f"{p}video_aggregate_embed.weight": (video_dim, in_dim), f"{p}video_aggregate_embed.bias": (video_dim,),
               f"{p}audio_aggregate_embed.weight": (audio_dim, in_dim), f"{p}audio_aggregate_embed.bias": (audio_dim,)}
              if dual else {f"{p}aggregate_embed.weight": (width, in_dim)})
    return {k: rw.random_tensor(k, torch.Size(s), seed).to(dtype) for k, s in shapes.items()}


def qwen25_7b_state_dict(seed: int = SEED, dtype=torch.float32) -> dict:
    """Qwen2.5-VL 7B text model (``comfy.text_encoders.llama.Qwen25_7BVLI``), folded token table."""
    import comfy.text_encoders.llama as llama

    model = llama.Qwen25_7BVLI(QWEN25_7B_CONFIG, dtype, "meta", _meta_ops())
    sd = _text_weights(model, seed, dtype, skip=("visual.",), folded_vocab="model.embed_tokens.weight")
    return _with_te_config(sd, {"qwen25_7b_model_config": QWEN25_7B_CONFIG, TINY_VOCAB_ROWS: VOCAB_ROWS})


def byt5_small_glyph_state_dict(seed: int = SEED, dtype=torch.float32) -> dict:
    """byT5-small glyph encoder (``comfy.text_encoders.t5.T5``, core's glyph config, 1 block)."""
    import comfy.text_encoders.t5 as t5

    config = json.loads((Path(t5.__file__).parent / "byt5_config_small_glyph.json").read_text())
    model = t5.T5({**config, **BYT5_CONFIG}, dtype, "meta", _meta_ops())
    # HunyuanImageTEModel gives byT5 the outer model_options (no model_name): key "_model_config".
    return _with_te_config(_text_weights(model, seed, dtype), {"_model_config": BYT5_CONFIG})


def clip_l_state_dict(seed: int = SEED, dtype=torch.float32) -> dict:
    """CLIP-L text model (``comfy.clip_model.CLIPTextModel``), 2 layers, folded token table."""
    import comfy.clip_model
    import comfy.sd1_clip

    config = json.loads((Path(comfy.sd1_clip.__file__).parent / "sd1_clip_config.json").read_text())
    model = comfy.clip_model.CLIPTextModel({**config, **CLIP_L_CONFIG}, dtype, "meta", _meta_ops())
    sd = _text_weights(model, seed, dtype, folded_vocab="text_model.embeddings.token_embedding.weight")
    # Core's own override for a CLIP file is "model_config" (comfy/text_encoders/long_clipl.py puts it
    # under clip_l_model_config with the file's position count); clip_l_model_config is overwritten.
    return _with_te_config(sd, {"model_config": CLIP_L_CONFIG, TINY_VOCAB_ROWS: VOCAB_ROWS})


# kind -> (ComfyUI folder, file name, builder)
ENCODER_FILES = {
    "gemma3_12b": ("text_encoders", "tiny_gemma_3_12B_it.safetensors", gemma3_12b_state_dict),
    "ltx2_text_projection": ("checkpoints", "tiny_ltx-2.3_text_projection.safetensors", ltxav_text_projection_state_dict),
    "qwen25_7b": ("text_encoders", "tiny_qwen_2.5_vl_7b.safetensors", qwen25_7b_state_dict),
    "byt5_small_glyph": ("text_encoders", "tiny_byt5_small_glyphxl.safetensors", byt5_small_glyph_state_dict),
    "clip_l": ("text_encoders", "tiny_clip_l.safetensors", clip_l_state_dict),
}
# core loader type -> the two files it takes (first, second), as the templates load them.
ENCODER_PAIRS = {
    "ltxv": ("gemma3_12b", "ltx2_text_projection"),          # LTXAVTextEncoderLoader
    "hunyuan_video_15": ("qwen25_7b", "byt5_small_glyph"),   # DualCLIPLoader
    "kandinsky5": ("qwen25_7b", "clip_l"),                   # DualCLIPLoader
}


def _cache_dir() -> Path | None:
    env = os.environ.get("SHARDDIT_TINY_MODELS_CACHE")
    if env == "0":
        return None
    base = Path(env) if env else Path.home() / ".cache" / "sharddit" / "tiny_models"
    here = Path(__file__).parent
    digest = zlib.crc32((here / "tiny_encoders.py").read_bytes() + (here / "tiny_te_hook.py").read_bytes())
    try:
        import comfyui_version

        version = comfyui_version.__version__
    except ImportError:
        version = "unknown"
    return base / f"encoders-{version}-{digest:08x}"


def write_tiny_encoders(models_dir, kinds=None, seed: int = SEED) -> dict:
    """Write the files into ``models_dir/<folder>/`` (built once into the cache, then symlinked);
    returns kind -> path."""
    cache = _cache_dir()
    out = {}
    for kind in kinds or ENCODER_FILES:
        folder, name, build = ENCODER_FILES[kind]
        path = Path(models_dir) / folder / name
        built = cache / f"seed{seed}" / folder / name if cache else path
        if not built.exists():
            save_file(build(seed), built, {"sharddit_tiny_kind": kind, "sharddit_tiny_seed": str(seed)})
        path.parent.mkdir(parents=True, exist_ok=True)
        if built != path and not (path.is_symlink() and os.readlink(path) == str(built)):
            if path.is_symlink() or path.exists():
                path.unlink()
            os.symlink(built, path)
        out[kind] = path
    return out


def load_tiny_encoder(paths, clip_type: str, model_options: Mapping | None = None):
    """``comfy.sd.load_clip`` of tiny encoder files (as core's CLIPLoader / DualCLIPLoader /
    LTXAVTextEncoderLoader call it) with the tiny-TE hook installed."""
    import comfy.sd

    install_tiny_te_hook()
    return comfy.sd.load_clip(ckpt_paths=[str(p) for p in paths], clip_type=getattr(comfy.sd.CLIPType, clip_type.upper()),
                              model_options=dict(model_options or {}))


def register_tiny_encoders(paths: Mapping) -> None:
    """Put the folders of ``paths`` (kind -> path, from ``write_tiny_encoders``) first in ComfyUI's
    search paths (in-process use)."""
    import folder_paths

    for kind, path in paths.items():
        folder_paths.add_model_folder_path(ENCODER_FILES[kind][0], str(Path(path).parent), is_default=True)
    cache = getattr(folder_paths, "filename_list_cache", None)
    if isinstance(cache, dict):
        cache.clear()
