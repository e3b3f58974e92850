"""What core ComfyUI has and holds, as ShardDiT reads it: which options exist (``features``), their
state in this process (``running_state``), core's own multi-GPU nodes (``multigpu``), dynamic VRAM
(``dynamic_vram``), ModelPatcher clones (``patcher_clone``) and where the text encoder and the VAE
go given what ComfyUI holds (``component_placement``)."""
