"""The ComfyUI host's side of worker machines: the Ray cluster and member ranks (``host_workers``),
and ComfyUI's own blocks built on a worker from the model config (``worker_blocks``)."""
