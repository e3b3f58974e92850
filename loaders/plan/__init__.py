"""The dry-run planner: ComfyUI's own model classes run on fake GPUs without weights. ``dry_run``
answers "will this fit?" in stages: ``setup`` (the model from ``presets``, every argument checked),
``context`` (the meta DiT), ``blocks_run`` (the fake forward, ``fake_forward``, over the planned blocks,
``block_plan``), then ``strategies`` (with ``fake_sequence`` and ``core_baselines``), ``worker_shares``
and ``text_encoders`` add the report's rows; ``findings`` holds the report, ``picture`` draws it, and
``node_logic`` is what the ``ShardDiTPlan`` node calls."""
