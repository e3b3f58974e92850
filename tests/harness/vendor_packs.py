"""Third-party node packs from ``../shared/vendor`` (tarballs; never copied into the repo).

``extract_pack(name, dest)`` unpacks one into ``dest`` (a temp custom_nodes folder) and returns
its folder; ``import_pack(folder)`` imports it in-process as ComfyUI would (a package named after
the folder). Both skip the calling test when the tarball or the pack's PyPI dependency is missing.
"""
from __future__ import annotations

import importlib.util
import os
import sys
import tarfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
VENDOR = Path(os.environ.get("SHARDDIT_VENDOR_DIR", REPO.parent / "shared" / "vendor"))
PACKS = {"ComfyUI-GGUF": ("ComfyUI-GGUF-795e451.tar.gz", "gguf"),
         "ComfyUI-KJNodes": ("ComfyUI-KJNodes-6ee278a.tar.gz", "cv2")}


def extract_pack(name: str, dest: Path) -> Path:
    tarball, needs = PACKS[name]
    path = VENDOR / tarball
    if not path.is_file():
        pytest.skip(f"vendored {tarball} not found in {VENDOR} (set SHARDDIT_VENDOR_DIR)")
    pytest.importorskip(needs, reason=f"{name} needs the {needs!r} module: pip install -r tests/requirements.txt")
    folder = Path(dest) / name
    if not folder.is_dir():
        with tarfile.open(path) as tar:
            tar.extractall(dest, filter="data")
    return folder


def import_pack(folder: Path):
    """The pack's package module, imported once per process under a name without dashes."""
    mod_name = "vendor_" + folder.name.replace("-", "_")
    if mod_name in sys.modules:
        return sys.modules[mod_name]
    spec = importlib.util.spec_from_file_location(mod_name, folder / "__init__.py",
                                                  submodule_search_locations=[str(folder)])
    module = importlib.util.module_from_spec(spec)
    sys.modules[mod_name] = module
    spec.loader.exec_module(module)
    return module
