"""workflows/ holds only the pack's own words: no text of core's workflow templates in it.

Reads every workflow template the installed ``comfyui_workflow_templates*`` packages ship (every
``*.json`` with nodes, subgraphs included) and their index files, and fails if any of these
appears anywhere in ``workflows/`` (the UI and API workflows' strings, its README) or in the repo's
README.md and docs/:

- a paragraph of a Note / MarkdownNote (text between blank lines) of 30 characters or more,
- a node, group or subgraph title of 30 characters or more,
- a template's title or description in the index (30 characters or more).

Compared with whitespace collapsed and case folded. Model file names, links, sizes and settings
are facts and are not looked for: a phrase counts only if 30 characters remain once its URLs, file
names and markdown punctuation are taken out. The templates come with ComfyUI's requirements from 0.29 on (marker
``comfy``: run in ComfyUI's environment); without them the test is skipped with the reason.
"""
from __future__ import annotations

import json
import pkgutil
import re
from importlib import resources
from pathlib import Path

import pytest

import workflow_tools as wt

pytestmark = pytest.mark.comfy

PACKAGE_PREFIX = "comfyui_workflow_templates"
MIN_CHARS = 30
NOTE_TYPES = {"Note", "MarkdownNote"}
WINDOW = MIN_CHARS   # every needle is at least this long: its first WINDOW characters index the haystack


FACT = re.compile(r"https?://\S+|\S+\.(?:safetensors|gguf|ckpt|pth?|bin|sft|json)\b|[\[\]()`*#>|_~-]")


def normalize(text: str) -> str:
    return re.sub(r"\s+", " ", text).strip().casefold()


def is_prose(phrase: str) -> bool:
    """At least MIN_CHARS left once URLs, model file names and markdown punctuation are removed."""
    return len(normalize(FACT.sub(" ", phrase))) >= MIN_CHARS


def template_files() -> list[Path]:
    """Every ``*.json`` of every installed ``comfyui_workflow_templates*`` package."""
    files = []
    for module in sorted(m.name for m in pkgutil.iter_modules() if m.name.startswith(PACKAGE_PREFIX)):
        root = Path(str(resources.files(module)))
        files += sorted(root.rglob("*.json"))
    return files


def _graphs(workflow: dict) -> list:
    return [workflow, *((workflow.get("definitions") or {}).get("subgraphs") or [])]


def workflow_phrases(workflow: dict) -> set[str]:
    """Note paragraphs and titles (node, group, subgraph) of a UI workflow, normalized, >= MIN_CHARS."""
    out = []
    for graph in _graphs(workflow):
        out.append(graph.get("name") or "")
        for node in graph.get("nodes") or []:
            out.append(node.get("title") or "")
            values = node.get("widgets_values")
            if node.get("type") in NOTE_TYPES and isinstance(values, list) and values and isinstance(values[0], str):
                out += re.split(r"\n\s*\n", values[0])
        out += [g.get("title") or "" for g in graph.get("groups") or []]
    return {p for p in map(normalize, out) if is_prose(p)}


def index_phrases(index) -> set[str]:
    """Titles and descriptions of an index file's template entries, normalized, >= MIN_CHARS."""
    out = []

    def walk(value):
        if isinstance(value, dict):
            out.extend(v for k, v in value.items() if k in ("title", "description") and isinstance(v, str))
            for v in value.values():
                walk(v)
        elif isinstance(value, list):
            for v in value:
                walk(v)

    walk(index)
    return {p for p in map(normalize, out) if is_prose(p)}


def template_phrases(files: list[Path]) -> tuple[dict, int]:
    """``({phrase: template file name}, number of workflow templates read)``."""
    phrases, workflows = {}, 0
    for path in files:
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError):
            continue
        if isinstance(data, dict) and isinstance(data.get("nodes"), list):
            workflows += 1
            found = workflow_phrases(data)
        else:
            found = index_phrases(data)
        for phrase in found:
            phrases.setdefault(phrase, path.name)
    return phrases, workflows


def _strings(value) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [s for k, v in value.items() for s in (_strings(k) + _strings(v))]
    if isinstance(value, list):
        return [s for v in value for s in _strings(v)]
    return []


def our_texts(directory: Path = wt.WORKFLOWS_DIR, extra: tuple = ()) -> dict[str, str]:
    """``{relative path: normalized text}`` of every text file in ``directory`` (JSON: its strings)
    and of the ``extra`` files."""
    out = {str(path.relative_to(wt.REPO)): normalize(path.read_text("utf-8")) for path in extra}
    for path in sorted(directory.rglob("*")):
        if path.suffix == ".json":
            out[str(path.relative_to(directory))] = normalize("\n".join(_strings(json.loads(path.read_text("utf-8")))))
        elif path.suffix in (".md", ".txt") or path.name.startswith("LICENSE"):
            out[str(path.relative_to(directory))] = normalize(path.read_text("utf-8"))
    return out


def copied(phrases: dict, texts: dict) -> list[tuple[str, str, str]]:
    """``[(our file, template file, phrase)]`` for every phrase found in one of ``texts``."""
    hits = []
    for name, text in texts.items():
        starts = {text[i:i + WINDOW] for i in range(max(len(text) - WINDOW + 1, 0))}
        hits += [(name, source, p) for p, source in phrases.items() if p[:WINDOW] in starts and p in text]
    return sorted(hits)


@pytest.fixture(scope="module")
def phrases():
    files = template_files()
    if not files:
        pytest.skip(f"no {PACKAGE_PREFIX}* package installed (added after ComfyUI 0.3.64)")
    found, workflows = template_phrases(files)
    print(f"[ShardDiT] read {workflows} core workflow templates ({len(files)} JSON files): {len(found)} phrases")
    assert workflows > 100 and len(found) > 1000, (workflows, len(found))  # really read them
    return found


def test_no_template_text_in_workflows(phrases):
    hits = copied(phrases, our_texts(extra=(wt.REPO / "README.md", *sorted((wt.REPO / "docs").glob("*.md")))))
    assert not hits, "text of core's templates in workflows/ (write it in our own words):\n" + "\n".join(
        f"  {ours} <- {source}: {phrase[:120]!r}" for ours, source, phrase in hits)


def test_the_check_finds_a_pasted_paragraph(phrases, tmp_path):
    """The same check on a copy of workflows/ with one template paragraph pasted into a workflow's
    note (as the removed video_*_sharddit files carried them) finds it."""
    import shutil

    copy = tmp_path / "workflows"
    shutil.copytree(wt.WORKFLOWS_DIR, copy, ignore=shutil.ignore_patterns("*.jpg", "*.png"))
    name = wt.workflow_pairs()[0][0]
    ui = json.loads((copy / f"{name}.json").read_text())
    note = next(n for n in ui["nodes"] if n["type"] in NOTE_TYPES)
    phrase, source = max(((p, s) for p, s in phrases.items() if "\n" not in p), key=lambda ps: (len(ps[0]), ps[0]))
    note["widgets_values"][0] += "\n\n" + phrase.upper().replace(" ", "\n")  # another case and line breaks
    (copy / f"{name}.json").write_text(json.dumps(ui, indent=2, ensure_ascii=False) + "\n")
    assert copied(phrases, our_texts(copy)) == [(f"{name}.json", source, phrase)]
