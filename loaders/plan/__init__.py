"""The dry-run planner: ComfyUI's own model classes run on fake GPUs without weights. ``dry_run``
answers "will this fit?" from a preset (``presets``) with the fake forward (``fake_forward``,
``fake_sequence``) over the planned blocks (``block_plan``); ``strategies``, ``core_baselines``,
``worker_shares`` and ``text_encoders`` add the report's rows; ``findings`` holds the report,
``picture`` draws it, and ``node_logic`` is what the ``ShardDiTPlan`` node calls."""
