"""Shared test helpers (importable as ``harness``: conftest puts ``tests/`` on sys.path)."""
