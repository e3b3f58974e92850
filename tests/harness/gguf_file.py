"""Write a tiny GGUF diffusion model the way ComfyUI-GGUF's ``tools/convert.py`` does (the
``gguf`` package's writer and quantizer), from a state dict built in the test: never downloaded."""
from __future__ import annotations

import torch

GGUF_QTYPES = ("Q8_0", "F16")


def write_gguf(path, sd: dict, qtype: str = "Q8_0", arch: str = "wan") -> None:
    """2-D weights of over 1024 values ``qtype``, other tensors F32 (Wan's 3-D modulation is kept
    high-precision by convert.py too); >4-D tensors reshaped with the pack's
    ``comfy.gguf.orig_shape.<key>`` field, as convert.py does."""
    import gguf

    quant = getattr(gguf.GGMLQuantizationType, qtype)
    writer = gguf.GGUFWriter(path=None, arch=arch)
    writer.add_quantization_version(gguf.GGML_QUANT_VERSION)
    for key, tensor in sd.items():
        data = tensor.to(torch.float32).numpy()
        kind = quant if data.ndim == 2 and data.size > 1024 and data.shape[-1] % 32 == 0 else \
            gguf.GGMLQuantizationType.F32
        if data.ndim > 4:
            writer.add_array(f"comfy.gguf.orig_shape.{key}", [int(d) for d in data.shape])
            data = data.reshape(data.shape[0], -1)
            kind = gguf.GGMLQuantizationType.F32
        writer.add_tensor(key, gguf.quants.quantize(data, kind), raw_dtype=kind)
    writer.write_header_to_file(path=str(path))
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
