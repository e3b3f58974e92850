"""What each mode costs before anything loads: model inputs per family (``inputs``), time and
bytes per step (``model``), memory per rank (``memory``), the alternatives users have
(``baselines``), the report (``report``), the ``auto``/explicit mode decision (``mode``) and the
memory a worker needs (``workers``)."""
