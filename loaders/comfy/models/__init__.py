"""What a model is, ComfyUI's side: its family (``comfy_families``), where its blocks live
(``specs``), its constructor arguments (``model_params``), where its text tokens go
(``token_order``), and the checks of model files and latents (``checks``, ``file_kinds``)."""
