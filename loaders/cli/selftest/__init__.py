"""The ``selftest`` command's checks: the suite (``suite``), the switches it runs under
(``switches``), its tiny random models (``tiny_models``), the `sequence` and dynamic VRAM checks."""
