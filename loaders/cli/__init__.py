"""The command line, ``python <pack-dir> <command>`` (``main``), its commands (``plan``,
``selftest``) and the self-test's checks and tiny models."""
