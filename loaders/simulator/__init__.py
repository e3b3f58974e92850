"""The plan simulator: ComfyUI's own model classes run on fake GPUs without weights (presets, the
fake forward, the report) and the glue the ``ShardDiTPlan`` node calls (``plan_node``)."""
