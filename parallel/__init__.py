"""Pure-PyTorch engine: device inventory, sizing, placement planner, block sharding, VAE tiling.

Nothing here imports ComfyUI (``comfy``, ``comfy_api``, ``folder_paths``, ``nodes``) or the
pack's ``loaders``/``nodes`` packages; a test enforces it.
"""
