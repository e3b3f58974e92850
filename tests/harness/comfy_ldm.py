"""Light import of ComfyUI's model classes (``comfy.ldm``) for fake-GPU tests, on CPU.

Only ComfyUI's root (``COMFYUI_PATH``) goes on ``sys.path``, never this repo; ComfyUI's ``nodes``
is not imported. Attention is forced to PyTorch SDPA (no CUDA memory queries); tests route it to
``flash_attention_standin`` through ComfyUI's ``optimized_attention_override``.
"""
from sharddit.loaders.comfyui_import import import_comfyui
from sharddit.parallel.simulate import flash_attention_standin


def import_comfy_ldm():
    import_comfyui()  # COMFYUI_PATH, CPU mode, PyTorch attention (the pack's one way)
    import comfy.ldm.flux.model  # noqa: F401
    import comfy.ldm.hunyuan_video.model  # noqa: F401
    import comfy.ldm.lightricks.model  # noqa: F401
    import comfy.ldm.wan.model  # noqa: F401
    import comfy.ldm.wan.model_animate  # noqa: F401
    import comfy.ops

    return comfy


def attention_override(func, *args, **kwargs):
    """ComfyUI's ``optimized_attention_override`` hook: output-only flash stand-in."""
    return flash_attention_standin(*args, **kwargs)
