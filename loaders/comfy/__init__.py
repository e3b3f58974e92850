"""ComfyUI adapters, imported inside a ComfyUI process, by concern. Imports point one way:
``loading`` -> ``shard``, ``vae`` -> ``remote`` -> ``core``, ``models``.
The nodes in ``nodes/`` call these (and, for the Plan node only, ``loaders/plan/``)."""
