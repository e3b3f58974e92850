"""ComfyUI adapters: model loading, ModelPatcher integration, per-architecture specs."""
