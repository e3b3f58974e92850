"""What a model file holds, told from its safetensors header alone (key names and shapes; no
tensor is read), so a loader refuses a wrong file before core builds anything from it.

- Text encoders: core's own ``comfy.sd.detect_te_model`` on ``meta`` tensors of the header's
  shapes (CLIP-L, T5/UMT5, byT5, Qwen2.5-VL, Gemma ...).
- Diffusion models: core's own ``comfy.model_detection`` (``checks.diffusion_model_class``).
- VAEs and LoRAs: their key names (``checks.guess_kind``); a VAE also has a convolution in its decoder.

Each ``check_*`` raises a ValueError naming the file, what it holds, and what the input takes;
a file it cannot tell (an unknown layout, a ``.ckpt``) is left to core.
"""
from __future__ import annotations

from dataclasses import dataclass

from .checks import (
    diffusion_model_class,
    guess_kind,
    is_safetensors,
    meta_state_dict,
    read_safetensors_header,
)
from ....parallel.errors import InputError

__all__ = ["FileKind", "check_text_encoder_file", "check_text_encoder_pair", "check_vae_file", "read_kind"]

# core TEModel name -> family a user knows; the names not listed are shown as core spells them
FAMILIES = {"CLIP_L": "CLIP-L", "CLIP_G": "CLIP-G", "CLIP_H": "CLIP-H", "T5_XXL": "T5/UMT5", "T5_XL": "T5/UMT5",
            "T5_BASE": "T5/UMT5", "T5_XXL_OLD": "T5/UMT5", "BYT5_SMALL_GLYPH": "byT5 (glyph)",
            "QWEN25_7B": "Qwen2.5-VL 7B", "QWEN25_3B": "Qwen2.5-VL 3B", "GEMMA_3_12B": "Gemma 3 12B",
            "LLAMA3_8": "Llama 3 8B (llava)"}
# loader type -> the encoder family of each file it takes (in any order), with a typical file each
EXPECTED = {
    "wan": (("T5/UMT5", "umt5_xxl_fp8_e4m3fn_scaled.safetensors"),),
    "hunyuan_video_15": (("Qwen2.5-VL 7B", "qwen_2.5_vl_7b_fp8_scaled.safetensors"),
                         ("byT5 (glyph)", "byt5_small_glyphxl_fp16.safetensors")),
    "kandinsky5": (("Qwen2.5-VL 7B", "qwen_2.5_vl_7b_fp8_scaled.safetensors"), ("CLIP-L", "clip_l.safetensors")),
    "ltxav": (("Gemma 3 12B", "gemma_3_12B_it_fp4_mixed.safetensors"),),
}
# dual loader types whose second file is a model checkpoint (core's DualCLIPLoader type ltxv: Gemma + the
# LTX-2 checkpoint's text projection), so a diffusion model file is not refused there
CHECKPOINT_PAIRS = {"ltxv"}
_FOLDERS = {"diffusion_model": ("diffusion_models", "Load Diffusion Model (ShardDiT)"),
            "vae": ("vae", "Load VAE (ShardDiT)"), "lora": ("loras", "LoraLoaderModelOnly"),
            "text_encoder": ("text_encoders", "Load Text Encoder (ShardDiT)")}


@dataclass(frozen=True)
class FileKind:
    """``kind``: diffusion_model, vae, lora, text_encoder or unknown; ``family``: the text
    encoder's family (``FAMILIES``) or core's model class name for a diffusion model."""

    kind: str
    family: str = ""
    tensors: int = 0

    def describe(self) -> str:
        if self.kind == "text_encoder":
            return f"a {self.family} text encoder"
        if self.kind == "diffusion_model":
            return f"a diffusion model ({self.family})" if self.family else "a diffusion model"
        return {"vae": "a VAE", "lora": "a LoRA"}.get(self.kind, "a file of unknown layout")

    def where(self) -> str:
        """Where the file belongs and which node loads it."""
        folder, loader = _FOLDERS.get(self.kind, ("", ""))
        return f"it belongs in ComfyUI/models/{folder}/ and loads with {loader}" if folder else ""


def read_kind(path: str, name: str) -> FileKind:
    """The kind of a model file from its header; ``unknown`` for a non-safetensors file."""
    if not is_safetensors(path):
        return FileKind("unknown")
    header = read_safetensors_header(path, name)
    keys = [k for k in header if k != "__metadata__"]
    sd = meta_state_dict(header, keys)
    te = _text_encoder_family(sd)
    if te:
        return FileKind("text_encoder", te, len(keys))
    guessed = guess_kind(keys)
    if guessed is not None and guessed[0] == "loras":
        return FileKind("lora", "", len(keys))
    if guessed is not None and guessed[0] == "vae" and _has_conv_decoder(header, keys):
        return FileKind("vae", "", len(keys))
    try:
        model = diffusion_model_class(sd)
    except Exception:  # detection code that reads values: unknown
        model = None
    if model:
        return FileKind("diffusion_model", model, len(keys))
    return FileKind("unknown", "", len(keys))


def _has_conv_decoder(header: dict, keys: list) -> bool:
    """A VAE decodes with convolutions: a ``decoder`` weight of 4 or 5 dimensions (a text encoder
    named ``encoder.layer...``, such as BERT, has none)."""
    return any("decoder" in k and len(header[k].get("shape", ())) >= 4 for k in keys)


def _text_encoder_family(sd: dict) -> str:
    """Core's ``detect_te_model`` on the meta state dict, as a family name ('' when none)."""
    import comfy.sd

    try:
        found = comfy.sd.detect_te_model(sd)
    except Exception:  # detection that reads values: unknown
        return ""
    return FAMILIES.get(found.name, found.name) if found is not None else ""


def _refuse(name: str, found: FileKind, wanted: str, say_where: bool = True) -> ValueError:
    where = found.where() if say_where else ""
    return InputError(f"{name!r} is {found.describe()} (read from its {found.tensors} tensor names "
                      f"and shapes), but {wanted}" + (f"; {where}" if where else ""))


def check_text_encoder_file(path: str, name: str, clip_type: str, loader: str = "this text encoder loader") -> None:
    """Refuse a DiT, VAE or LoRA given as a text encoder, and an encoder of another family where
    ``clip_type`` has a known one (``EXPECTED``; ``ltxav``: the LTX-2 loader, which has no type)."""
    found = read_kind(path, name)
    wanted = EXPECTED.get(clip_type)
    typed = f"type {clip_type!r} of {loader}" if clip_type and clip_type != "ltxav" else loader
    if found.kind in ("diffusion_model", "vae", "lora"):
        raise _refuse(name, found, f"{typed} takes {_expected_text(wanted)}")
    if found.kind == "text_encoder" and wanted and len(wanted) == 1 and found.family != wanted[0][0]:
        fix = "pick that file, or the type this encoder is for" if clip_type != "ltxav" else "pick that file"
        raise _refuse(name, found, f"{typed} takes {_expected_text(wanted)}: {fix}", say_where=False)


def check_text_encoder_pair(paths: list[str], names: list[str], clip_type: str, loader: str) -> None:
    """Both files are text encoders, and where ``clip_type`` has a known pair, the two families
    it takes in either order: refused before core builds the pair (a missing encoder would be
    built with random weights)."""
    if clip_type in CHECKPOINT_PAIRS:
        return
    for path, name in zip(paths, names):
        check_text_encoder_file(path, name, clip_type, loader)
    wanted = EXPECTED.get(clip_type)
    if not wanted or len(wanted) != 2:
        return
    found = [read_kind(p, n) for p, n in zip(paths, names)]
    if any(f.kind != "text_encoder" for f in found):
        return  # a layout core's detection does not know: core decides
    families = sorted(f.family for f in found)
    if families != sorted(fam for fam, _ in wanted):
        held = " and ".join(f"{n!r} is {f.describe()}" for n, f in zip(names, found))
        raise InputError(f"type {clip_type!r} of {loader} takes {_expected_text(wanted)}, but {held}: "
                         f"pick those two files (either order), or the type this pair is for")


def _expected_text(wanted) -> str:
    if not wanted:
        return "a text encoder file"
    return " + ".join(f"a {fam} file (e.g. {example})" for fam, example in wanted)


def check_vae_file(path: str, name: str, loader: str = "Load VAE (ShardDiT)") -> None:
    """Refuse a diffusion model, text encoder or LoRA given as a VAE."""
    found = read_kind(path, name)
    if found.kind in ("diffusion_model", "text_encoder", "lora"):
        raise _refuse(name, found, f"{loader} takes a VAE file (e.g. wan_2.1_vae.safetensors, in ComfyUI/models/vae/)")
