"""Checks of model files and latents, run before anything large is read or sampled.

- Files: a ``.safetensors`` file is read up to its JSON header only (8 bytes of length, the
  header, the data offsets it lists) so an empty, truncated or non-model file (an HTML page saved
  under the name) gets its name and the fix instead of a raw ``SafetensorError``. Any other file
  (``.ckpt``, ``.pt``, ``.bin``) must be what ``torch.load`` reads, a zip with ``data.pkl`` or a
  pickle, told from its first bytes (not torch.load's "Weights only load failed" stack).
- What a file holds for the other loaders (text encoder families, VAE, LoRA): ``file_kinds``.
- Diffusion model files: ComfyUI's own detection (``comfy.model_detection``) runs on tensors of
  the header's shapes on ``meta``; a file it does not recognise and whose keys look like a VAE,
  a text encoder or a LoRA is refused with the loader that takes it.
- Devices lists: at most ``MAX_DEVICE_ENTRIES`` entries.
- Latents: checked against the model's ``latent_format`` exactly where core's
  ``fix_empty_latent_channels`` would leave them broken, naming the latent node that fits.
"""
from __future__ import annotations

import json
import os
import struct
import zipfile

import torch
from ....parallel.errors import InputError

__all__ = ["check_latent", "check_model_file", "check_diffusion_model_file", "read_safetensors_header",
           "meta_state_dict", "diffusion_model_class", "guess_kind", "check_device_entries"]

_HEADER_LIMIT = 100 * 2**20  # safetensors' own limit on the JSON header
_DTYPES = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
           "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
           "BOOL": torch.bool, "F8_E4M3": torch.float8_e4m3fn, "F8_E5M2": torch.float8_e5m2}
# latent_format class -> the core node that makes an empty latent for it
LATENT_NODES = {"Wan21": "EmptyHunyuanLatentVideo", "Wan22": "Wan22ImageToVideoLatent",
                "LTXV": "EmptyLTXVLatentVideo", "HunyuanVideo": "EmptyHunyuanLatentVideo",
                "Mochi": "EmptyMochiLatentVideo", "Cosmos1CV8x8x8": "EmptyCosmosLatentVideo"}


# Entries of a devices list: each holds a shard of the DiT's blocks (a video DiT has at most a few
# hundred), so a longer list cannot be used; 500 'cpu' entries run, 20,001 ended in a contradictory
# "does not fit" from the planner.
MAX_DEVICE_ENTRIES = 1024
DEVICES_EXAMPLES = ("'auto' (this machine's GPUs), a list such as 'cuda:0,cuda:1' (a GPU may carry a weight: "
                    "'cuda:0:2,cuda:1'), or 'cpu,cpu' to test on the CPU")


def check_device_entries(devices, what: str = "devices", allow_empty: bool = True) -> None:
    """A devices text names at most ``MAX_DEVICE_ENTRIES`` entries (and, unless ``allow_empty``,
    at least one); the syntax of each is checked where it is parsed."""
    text = str(devices)
    if not text.strip() and not allow_empty:
        raise InputError(f"{what} is empty: give {DEVICES_EXAMPLES}")
    count = text.count(",") + 1
    if count > MAX_DEVICE_ENTRIES:
        raise InputError(f"{what} lists {count} entries ({text[:24]}...), more than the "
                         f"{MAX_DEVICE_ENTRIES} ShardDiT takes: each entry holds a shard of the model's blocks (a "
                         f"video DiT has at most a few hundred), so more cannot be used; give {DEVICES_EXAMPLES}")


def _broken(name: str, why: str) -> ValueError:
    return InputError(f"model file {name!r} {why}: download it again (or copy it again) into its "
                      f"models/ folder, and compare its size with the size on the download page")


def read_safetensors_header(path: str, name: str) -> dict:
    """The JSON header of a safetensors file; ValueError naming the file when it is broken."""
    size = os.path.getsize(path)
    if size == 0:
        raise _broken(name, "is empty (0 bytes)")
    if size < 8:
        raise _broken(name, f"is not a safetensors file (it has {size} bytes, too few for one)")
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        if n > _HEADER_LIMIT or 8 + n > size:
            raise _broken(name, f"is not a safetensors file (its first 8 bytes announce a {n}-byte header, "
                                f"the file has {size} bytes; a text or HTML file saved under this name?)")
        try:
            header = json.loads(f.read(n))
        except (UnicodeDecodeError, ValueError):
            raise _broken(name, "is not a safetensors file (its header is not JSON)") from None
    if not isinstance(header, dict):
        raise _broken(name, "is not a safetensors file (its header is not a table of tensors)")
    ends = [v["data_offsets"][1] for k, v in header.items() if k != "__metadata__" and isinstance(v, dict)
            and isinstance(v.get("data_offsets"), list) and len(v["data_offsets"]) == 2]
    if ends and 8 + n + max(ends) > size:
        raise _broken(name, f"is truncated: its header lists {8 + n + max(ends)} bytes, the file has {size}")
    return header


def is_safetensors(path: str) -> bool:
    """Whether core reads the file as safetensors (by its extension, as ``comfy.utils.load_torch_file``)."""
    return path.lower().endswith((".safetensors", ".sft"))


def check_model_file(path: str, name: str) -> None:
    """Cheap validity check of any model file before a loader reads it: a safetensors header, or
    the container of a PyTorch file (before ``torch.load`` is reached)."""
    if is_safetensors(path):
        read_safetensors_header(path, name)
    elif os.path.getsize(path) == 0:
        raise _broken(name, "is empty (0 bytes)")
    else:
        check_torch_file(path, name)


def check_torch_file(path: str, name: str) -> None:
    """A ``.ckpt`` / ``.pt`` / ``.pth`` / ``.bin`` is a zip archive holding a ``data.pkl`` (torch.save)
    or a pickle (the legacy format); anything else would end in torch.load's "Weights only load
    failed" stack. Only the first bytes and the zip's table of contents are read."""
    with open(path, "rb") as f:
        head = f.read(8)
    if head[:4] == b"PK\x03\x04":
        try:
            with zipfile.ZipFile(path) as archive:
                if any(n == "data.pkl" or n.endswith("/data.pkl") for n in archive.namelist()):
                    return
        except zipfile.BadZipFile:
            raise _broken(name, "is not a PyTorch checkpoint (a zip archive, but a broken one)") from None
        raise _broken(name, "is not a PyTorch checkpoint (a zip archive without the data.pkl torch.save writes)")
    if len(head) > 1 and head[0] == 0x80 and 2 <= head[1] <= 5:
        return  # a pickle (torch's legacy format): torch.load decides
    _check_other_format(path, name, head)
    raise _broken(name, f"is not a PyTorch checkpoint: its first bytes {head!r} are neither a zip archive "
                        f"(torch.save) nor a pickle (a text or HTML page saved under this name?)")


def _check_other_format(path: str, name: str, head: bytes) -> None:
    """A model file in a format core does not read under this extension: the fix."""
    if head[:4] == b"GGUF":
        raise InputError(f"{name!r} is a GGUF file, which core's loaders do not read: load it with the "
                         f"ComfyUI-GGUF pack's loader")
    try:
        read_safetensors_header(path, name)
    except ValueError:
        return
    raise InputError(f"{name!r} is a safetensors file under another extension, which core would read "
                     f"with torch.load and fail: rename it to {os.path.splitext(name)[0]}.safetensors")


def check_diffusion_model_file(path: str, name: str) -> None:
    """``check_model_file``, then refuse a VAE / text encoder / LoRA file given to the DiT loader."""
    check_model_file(path, name)
    if not is_safetensors(path):
        return
    header = read_safetensors_header(path, name)
    keys = [k for k in header if k != "__metadata__"]
    if _detects_as_diffusion_model(header, keys):
        return
    kind = guess_kind(keys)
    if kind is not None:
        folder, loader = kind
        raise InputError(f"{name!r} is not a diffusion model: its weights are those of a {folder[:-1]} "
                         f"({len(keys)} tensors such as {keys[0]!r}). Move it to ComfyUI/models/{folder}/ and load it "
                         f"with {loader}; pick a diffusion model (e.g. wan2.1_t2v_14B_fp16.safetensors) here.")


def meta_state_dict(header: dict, keys=None, strict: bool = False) -> dict:
    """Tensors of the header's shapes and dtypes on ``meta`` (``keys``: those, else every tensor):
    core's detection code runs on them. A dtype not in the safetensors table reads as bytes, or with
    ``strict`` (the dry run sizes the model by it) is refused naming the tensor."""
    out = {}
    for k in (k for k in header if k != "__metadata__") if keys is None else keys:
        dtype = header[k]["dtype"]
        if strict and dtype not in _DTYPES:
            raise InputError(f"tensor {k!r} has dtype {dtype!r}, which the simulator does not know")
        out[k] = torch.empty(header[k]["shape"], dtype=_DTYPES.get(dtype, torch.uint8), device="meta")
    return out


def diffusion_model_class(sd: dict) -> str | None:
    """Class name of the model config core's own detection gives the state dict (None: not a
    diffusion model core knows). Raises what detection code raises on meta tensors."""
    import comfy.model_detection
    import comfy.utils

    prefix = comfy.model_detection.unet_prefix_from_state_dict(sd)
    sd = comfy.utils.state_dict_prefix_replace(sd, {prefix: ""}, filter_keys=True) or sd
    config = comfy.model_detection.model_config_from_unet(sd, "")
    return None if config is None else type(config).__name__


def _detects_as_diffusion_model(header: dict, keys: list) -> bool:
    """ComfyUI's own detection on meta tensors of the header's shapes (True when unsure)."""
    try:
        return diffusion_model_class(meta_state_dict(header, keys)) is not None
    except Exception:  # detection code that reads values, an odd header: let core decide
        return True


def guess_kind(keys: list) -> tuple[str, str] | None:
    """(models folder, loader) for files that are clearly not a DiT; None when unsure."""
    def share(*parts):
        return sum(any(p in k for p in parts) for k in keys) / max(1, len(keys))

    if share("lora_up", "lora_down", "lora_A", "lora_B", ".diff_b", "lora.up") > 0.5:
        return "loras", "LoraLoaderModelOnly"
    if share("decoder.", "encoder.", "first_stage_model.", "quant_conv", "post_quant_conv") > 0.5 \
            and not share("encoder.block.", "text_model", "transformer.") > 0.1:
        return "vae", "Load VAE (ShardDiT) or core's Load VAE"
    if share("encoder.block.", "shared.weight", "text_model.", "transformer.h.", "model.layers.",
             "text_projection", "spiece_model", "embed_tokens") > 0.5:
        return "text_encoders", "Load Text Encoder (ShardDiT) or core's Load CLIP"
    return None


def check_latent(model, latent: dict) -> None:
    """Refuse a latent the model cannot denoise. Core's ``fix_empty_latent_channels`` is kept:
    an all-zero image latent (4-D) with other channels is resized by core; a video latent (5-D)
    of another family (other channels), another rank, or one without frames is refused, naming
    the latent node that fits the model."""
    fmt = model.get_model_object("latent_format")
    samples = latent["samples"]
    want, dims, shape = fmt.latent_channels, fmt.latent_dimensions, tuple(latent["samples"].shape)
    node = LATENT_NODES.get(type(fmt).__name__, f"an empty latent node for {type(fmt).__name__} models")
    family = f"{type(model.model).__name__} needs {type(fmt).__name__} latents ({want} channels"
    video = dims == 3
    if samples.ndim not in ((5, 4) if video else (dims + 2,)):
        form = "(batch, channels, frames, height, width)" if video else f"{dims + 2}-D"
        raise InputError(f"the latent has shape {shape} ({samples.ndim}-D), but {family}, {form}): "
                         f"connect the LATENT of {node} or of a sampler for this model")
    if 0 in shape:
        raise InputError(f"the latent has shape {shape}: nothing for {type(model.model).__name__} to "
                         f"denoise (a size is 0); "
                         f"give {node} at least 1 frame and a width and height of at least 16")
    core_fixes = not (video and samples.ndim == 5) and not torch.count_nonzero(samples)
    channels = shape[1]
    if getattr(samples, "is_nested", False):  # (video, audio) streams: the format names the widest
        channels = max(int(s.shape[1]) for s in samples.unbind())
    if channels != want and not core_fixes:
        raise InputError(f"the latent has {shape[1]} channels (shape {shape}), but {family}): it was "
                         f"made for another model family; use {node}")
