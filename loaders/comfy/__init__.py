"""ComfyUI adapters, imported inside a ComfyUI process: model and component loading, the sharded
ModelPatcher and its hooks, placement bookkeeping, per-architecture specs, sampling, VAE decode.
The nodes in ``nodes/`` call these (and, for the Plan node only, ``loaders/simulator/plan_node``)."""
