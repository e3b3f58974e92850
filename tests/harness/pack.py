"""Import the repo as the package ``sharddit`` by path (the repo root never goes on sys.path:
its ``nodes/`` would shadow ComfyUI's ``nodes.py``). Used by conftest, harness modules and the
benchmarks."""
import importlib.util
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def import_pack(name: str = "sharddit"):
    """Import the repo as package ``name`` (idempotent)."""
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, REPO / "__init__.py", submodule_search_locations=[str(REPO)])
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module
