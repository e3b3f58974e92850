"""The command line, ``python <pack-dir> <command>`` (``main``), its commands (``plan``,
``selftest``, ``shard-workflow``, ``worker``) and the self-test's checks and tiny models
(``selftest/``)."""
