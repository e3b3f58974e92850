"""ShardDiT: video diffusion transformers across several GPUs in one ComfyUI process.

Imported two ways:
- by ComfyUI, as a custom node folder: then ``comfy_api`` is importable and this module exposes
  one V3 ``comfy_entrypoint`` (and no ``NODE_CLASS_MAPPINGS``, which would hide it);
- by tests and tools (``python <pack-dir> plan``) without ComfyUI: then only the pure engine in
  ``parallel/`` is used and nothing ComfyUI-specific is imported.
"""

try:
    import comfy_api.latest  # noqa: F401  (only present inside a ComfyUI process)
except ImportError:
    _IN_COMFYUI = False
else:
    _IN_COMFYUI = True

if _IN_COMFYUI:
    from .loaders.workflow.routes import register as _register_routes
    from .nodes import comfy_entrypoint  # noqa: F401

    _register_routes()   # shard / unshard routes and the template category (inside a ComfyUI server only)

__version__ = "0.1.0"
