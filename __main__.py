"""``python <pack-dir> <command> ...``: the pack's command line (commands live in ``loaders/cli/``).

``python <pack-dir>`` puts the pack folder first on ``sys.path``; its ``nodes/`` package would then
shadow ComfyUI's ``nodes.py``. So that entry is removed first and the pack is imported by path as
the package ``sharddit`` (relative imports inside it keep working).
"""
import importlib
import importlib.util
import os
import sys


def _import_pack():
    pack_dir = os.path.dirname(os.path.abspath(__file__))
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != pack_dir]
    if "sharddit" not in sys.modules:
        spec = importlib.util.spec_from_file_location(
            "sharddit", os.path.join(pack_dir, "__init__.py"), submodule_search_locations=[pack_dir])
        module = importlib.util.module_from_spec(spec)
        sys.modules["sharddit"] = module
        spec.loader.exec_module(module)
    return importlib.import_module("sharddit.loaders.cli.main")


if __name__ == "__main__":
    sys.exit(_import_pack().main(sys.argv[1:]))
