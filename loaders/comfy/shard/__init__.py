"""The sharded MODEL: one sharding call in four steps (``pipeline``: ``which_devices``,
``mode_decision``, ``sharded_model``, ``attach_mode``; the values between them in ``step_values``),
its ComfyUI hooks (``hooks``), the per-block compile guard, `sequence` memory and resident budgets,
the ``auto`` mode at sampling time, the token shares per GPU, and the sampling glue (``sampling``)."""
