"""Core's workflow templates as the user's ComfyUI installed them (read at run time, never copied).

ComfyUI 0.2x+ installs them as Python packages whose names start with ``comfyui_workflow_templates``:
the UI workflows in one of them (``comfyui_workflow_templates_json/templates/*.json`` in 0.29 and
0.33), the thumbnails in media packages beside it. ComfyUI 0.3.64 has none: every function here
then returns nothing.
"""
from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

PACKAGE_PREFIX = "comfyui_workflow_templates"
THUMBNAIL_SUFFIXES = (".webp", ".jpg", ".png")


def _package_dirs() -> list:
    """The folders of every installed ``comfyui_workflow_templates*`` package, by name."""
    names = set()
    for entry in sys.path:
        try:
            names.update(p.name for p in Path(entry or ".").iterdir()
                         if p.name.startswith(PACKAGE_PREFIX) and (p / "__init__.py").is_file())
        except OSError:
            continue
    dirs = []
    for name in sorted(names):
        spec = importlib.util.find_spec(name)
        if spec is not None and spec.submodule_search_locations:
            dirs += [Path(d) for d in spec.submodule_search_locations]
    return dirs


def video_templates() -> dict:
    """``{name: path}`` of the installed ``video_*`` UI templates (``name`` without ``.json``); {}
    when no templates package is installed."""
    found = {}
    for d in _package_dirs():
        for path in sorted((d / "templates").glob("video_*.json")):
            found.setdefault(path.stem, path)
    return found


def template_path(name: str) -> Path | None:
    """The installed video template ``name`` (with or without ``.json``), None when absent."""
    return video_templates().get(name[:-5] if name.endswith(".json") else name)


def load_template(name: str) -> dict:
    path = template_path(name)
    if path is None:
        known = ", ".join(sorted(video_templates())[:8]) or "none: no comfyui_workflow_templates package installed"
        raise FileNotFoundError(f"no installed video template {name!r} (installed: {known}, ...)")
    return json.loads(path.read_text(encoding="utf-8"))


def template_thumbnail(name: str) -> Path | None:
    """The template's card picture (``<name>-1.webp`` and the like) from the media packages."""
    for d in _package_dirs():
        for suffix in THUMBNAIL_SUFFIXES:
            for stem in (f"{name}-1", name):
                path = d / "templates" / f"{stem}{suffix}"
                if path.is_file():
                    return path
    return None
