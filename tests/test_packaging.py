"""Packaging: Comfy Registry fields, a wheel that holds only `sharddit/`, `comfy node validate`,
and the rule that the engine in parallel/ never imports ComfyUI or the pack's ComfyUI layers."""
import ast
import importlib.util
import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from harness.require import import_or_skip, skip_or_fail

pytestmark = pytest.mark.no_blas  # no BLAS arithmetic: left out of the other-MKL_CBWR rerun in .ci/run

REPO = Path(__file__).resolve().parents[1]

try:
    import tomllib
except ImportError:  # Python 3.10
    tomllib = import_or_skip("tomli", "Python 3.10 needs tomli to read pyproject.toml (pip install tomli)")


@pytest.fixture(scope="module")
def pyproject():
    with open(REPO / "pyproject.toml", "rb") as f:
        return tomllib.load(f)


def _requirement_names(lines):
    return {re.split(r"[\s<>=!~;\[]", line.strip(), maxsplit=1)[0].lower()
            for line in lines if line.strip() and not line.strip().startswith("#")}


# ------------------------------------------------------------------ (a) Registry fields


def test_project_fields(pyproject):
    project = pyproject["project"]
    assert project["name"] == "sharddit" and "comfyui" not in project["name"].lower()
    assert re.fullmatch(r"\d+\.\d+\.\d+(?:-[0-9A-Za-z.-]+)?", project["version"]), project["version"]
    import sharddit

    assert sharddit.__version__ == project["version"], "pyproject version and sharddit.__version__ differ"
    assert len(project["description"]) > 20
    assert project["license"] == {"file": "LICENSE"} and (REPO / "LICENSE").is_file()
    assert project["requires-python"].startswith(">=")
    assert "Environment :: GPU :: NVIDIA CUDA" in project["classifiers"]
    assert project["urls"]["Repository"].startswith("https://")


def test_dependencies(pyproject):
    names = _requirement_names(pyproject["project"]["dependencies"])
    assert "nvidia-ml-py" in names
    assert "pynvml" not in names, "the PyPI package pynvml is deprecated: depend on nvidia-ml-py"
    assert not names & {"torch", "torchvision", "torchaudio"}, "ComfyUI brings torch; never pin it here"
    requirements = _requirement_names((REPO / "requirements.txt").read_text().splitlines())
    assert requirements == names, "requirements.txt and [project] dependencies must list the same packages"


def test_tool_comfy(pyproject):
    comfy = pyproject["tool"]["comfy"]
    for key in ("PublisherId", "DisplayName", "Icon"):
        assert isinstance(comfy.get(key), str) and comfy[key].strip(), key
    assert comfy["requires-comfyui"] == ">=0.3.64"


def test_pytest_markers_registered(pyproject):
    markers = {m.split(":")[0] for m in pyproject["tool"]["pytest"]["ini_options"]["markers"]}
    assert {"gpu", "multi_gpu", "comfy"} <= markers


# ------------------------------------------------------------------ (b) wheel holds only sharddit/


def _copy_sources(target: Path) -> None:
    ignore = shutil.ignore_patterns(".git", "build", "dist", "*.egg-info", "__pycache__", ".venv", "venv",
                                    ".pytest_cache", ".hypothesis")
    shutil.copytree(REPO, target, ignore=ignore)


def test_wheel_contains_only_the_sharddit_package(tmp_path):
    if importlib.util.find_spec("setuptools") is None:
        skip_or_fail("needs setuptools in this environment for an offline wheel build (pip install setuptools)")
    src = tmp_path / "src"
    _copy_sources(src)  # build a copy: never write build/ or *.egg-info into the shared checkout
    cmd = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index", "-q",
           "-w", str(tmp_path / "dist"), str(src)]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    (wheel,) = (tmp_path / "dist").glob("sharddit-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    stray = [n for n in names if not (n.startswith("sharddit/") or re.match(r"sharddit-[^/]+\.dist-info/", n))]
    assert stray == [], f"wheel would install outside sharddit/: {stray}"
    assert {"sharddit/__init__.py", "sharddit/parallel/placement/planner.py", "sharddit/nodes/__init__.py",
            "sharddit/loaders/__init__.py", "sharddit/loaders/comfyui_import.py",
            "sharddit/loaders/comfy/shard/sharded_model.py", "sharddit/loaders/plan/dry_run.py",
            "sharddit/loaders/cli/main.py"} <= set(names)
    assert not any(n.startswith("sharddit/tests/") for n in names)
    # every module of the pack's code folders is in the wheel (a subpackage missing from
    # pyproject's list would be left out silently)
    code = {f"sharddit/{p.relative_to(REPO).as_posix()}" for d in ("nodes", "loaders", "parallel")
            for p in (REPO / d).rglob("*.py")}
    assert code - set(names) == set(), sorted(code - set(names))
    dist_info = next(n for n in names if n.endswith(".dist-info/METADATA"))
    metadata = zipfile.ZipFile(wheel).read(dist_info).decode()
    assert "Requires-Dist: nvidia-ml-py" in metadata and "Requires-Dist: torch" not in metadata


# ------------------------------------------------------------------ (c) comfy node validate


def _find_comfy_cli():
    beside_python = Path(sys.executable).parent / ("comfy.exe" if os.name == "nt" else "comfy")
    return str(beside_python) if beside_python.exists() else shutil.which("comfy")


def test_comfy_node_validate():
    if _find_comfy_cli() is None:
        skip_or_fail("comfy-cli not installed (pip install comfy-cli) - `comfy` not on PATH")
    # Offline: it reads pyproject.toml and runs ruff's security rules; telemetry off, no prompts.
    cmd = [_find_comfy_cli(), "--skip-prompt", "--no-enable-telemetry", "node", "validate"]
    out = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=180)
    text = out.stdout + out.stderr
    assert out.returncode == 0, text
    assert "Validating node configuration" in text, text
    assert not re.search(r"\b(error|warning)s?\b", text, re.IGNORECASE), text


# ------------------------------------------------------------------ (d) parallel/ is pure


FORBIDDEN_TOP = {"comfy", "comfy_api", "comfy_extras", "comfy_execution", "folder_paths", "nodes"}
FORBIDDEN_PACK = ("sharddit.loaders", "sharddit.nodes")


def _is_forbidden(name: str) -> bool:
    top = name.split(".")[0]
    return top in FORBIDDEN_TOP or any(name == p or name.startswith(p + ".") for p in FORBIDDEN_PACK)


def find_forbidden_imports(source: str, module: str) -> list:
    """Forbidden imports in ``source`` of module ``module`` (e.g. ``sharddit.parallel.placement.planner``),
    resolving relative imports; ``from ..loaders import x`` -> ``sharddit.loaders.x``."""
    package = module.split(".")[:-1]
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names if _is_forbidden(a.name)]
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            if node.level > len(package):
                base = []  # above the pack: a top-level module such as ComfyUI's nodes.py
            stem = ".".join(base + ([node.module] if node.module else []))
            targets = [stem] if node.module else [f"{stem}.{a.name}".lstrip(".") for a in node.names]
            found += [(node.lineno, t) for t in targets if _is_forbidden(t)]
        elif isinstance(node, ast.Call) and _is_dynamic_import(node):
            found += [(node.lineno, node.args[0].value)] if _is_forbidden(node.args[0].value) else []
    return found


def _is_dynamic_import(node: ast.Call) -> bool:
    func = node.func
    name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
    return (name in ("import_module", "__import__") and node.args
            and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str))


@pytest.mark.parametrize(
    "source, module, expected",
    [
        ("import comfy.model_management", "sharddit.parallel.x", ["comfy.model_management"]),
        ("from comfy_api.latest import io", "sharddit.parallel.x", ["comfy_api.latest"]),
        ("def f():\n    import folder_paths", "sharddit.parallel.x", ["folder_paths"]),
        ("from nodes import NODE_CLASS_MAPPINGS", "sharddit.parallel.x", ["nodes"]),
        ("from ..loaders import specs", "sharddit.parallel.x", ["sharddit.loaders"]),
        ("from .. import nodes", "sharddit.parallel.x", ["sharddit.nodes"]),
        ("from ...loaders.specs import y", "sharddit.parallel.sub.x", ["sharddit.loaders.specs"]),
        ("from ... import nodes", "sharddit.parallel.x", ["nodes"]),
        ("import sharddit.nodes.node_list", "sharddit.parallel.x", ["sharddit.nodes.node_list"]),
        ("importlib.import_module('comfy.sd')", "sharddit.parallel.x", ["comfy.sd"]),
        ("import torch\nfrom .devices import parse_devices\nfrom . import inventory\nimport nodesx\n"
         "from ..parallel import planner", "sharddit.parallel.x", []),
    ],
)
def test_import_checker_catches(source, module, expected):
    assert [name for _, name in find_forbidden_imports(source, module)] == expected


def test_parallel_imports_no_comfyui_and_no_pack_layers():
    offenders = []
    for path in sorted((REPO / "parallel").rglob("*.py")):
        rel = path.relative_to(REPO).with_suffix("")
        module = ".".join(("sharddit",) + rel.parts)
        if path.name == "__init__.py":
            module += ".__init__"  # relative imports resolve against the package itself
        offenders += [f"{rel}.py:{line}: {name}" for line, name in find_forbidden_imports(path.read_text(), module)]
    assert offenders == [], "parallel/ must stay pure PyTorch (no ComfyUI, no loaders/ or nodes/):\n" + "\n".join(offenders)


# ------------------------------------------------------------------ (e) nodes/ call only the adapters


def _pack_imports(path: Path, repo: Path = REPO) -> list:
    """``[(line, module)]`` of the pack modules ``path`` imports (relative imports resolved)."""
    rel = path.relative_to(repo).with_suffix("")
    package = ["sharddit", *rel.parts[:-1]]
    found = []
    tree = ast.parse(path.read_text())
    # imports under ``if TYPE_CHECKING:`` never run: annotations only, no import edge
    typing_only = {id(n) for b in ast.walk(tree) if isinstance(b, ast.If) and ast.unparse(b.test).endswith("TYPE_CHECKING")
                   for stmt in b.body for n in ast.walk(stmt)}
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        if isinstance(node, ast.ImportFrom) and node.level:
            stem = ".".join(package[: len(package) - node.level + 1] + ([node.module] if node.module else []))
            found += [(node.lineno, f"{stem}.{a.name}") for a in node.names]
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("sharddit"):
            found += [(node.lineno, f"{node.module}.{a.name}") for a in node.names]
        elif isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names if a.name.startswith("sharddit")]
    return found


# nodes/ may reach loaders/ only through the ComfyUI adapters (loaders/comfy/). One exception:
# the ShardDiTPlan node (debug_nodes.py) shows the simulator's report, so it may use loaders/plan/.
NODES_MAY_IMPORT = {"*": ("sharddit.loaders.comfy.",),
                    "debug_nodes.py": ("sharddit.loaders.comfy.", "sharddit.loaders.plan.")}


def _bad_node_imports(path: Path, repo: Path = REPO) -> list:
    allowed = NODES_MAY_IMPORT.get(path.name, NODES_MAY_IMPORT["*"])
    return [f"{path.relative_to(repo)}:{line}: {name}" for line, name in _pack_imports(path, repo)
            if name.startswith("sharddit.loaders") and not name.startswith(allowed)]


def test_nodes_import_only_the_comfy_adapters():
    offenders = [o for path in sorted((REPO / "nodes").rglob("*.py")) for o in _bad_node_imports(path)]
    assert offenders == [], ("nodes/ may import loaders/comfy/ only (the Plan node also loaders/plan/), "
                             "never loaders/cli/ or loaders/comfyui_import:\n" + "\n".join(offenders))


def test_node_import_checker_catches_cli_and_simulator(tmp_path):
    fake_repo = tmp_path / "repo"
    (fake_repo / "nodes").mkdir(parents=True)
    bad = fake_repo / "nodes" / "sampling_nodes.py"
    bad.write_text("from ..loaders.cli import main\nfrom ..loaders.plan import presets\n"
                   "from ..loaders.comfy import sampling\nfrom .common_inputs import devices_input\n")
    assert [o.split(": ")[1] for o in _bad_node_imports(bad, fake_repo)] == [
        "sharddit.loaders.cli.main", "sharddit.loaders.plan.presets"]


# Rooms and their floors: a room may import rooms on lower floors only (never one beside it or above).
LOADERS_ROOMS = {"cli": 2, "plan": 1, "comfy": 0}
COMFY_ROOMS = {"loading": 3, "shard": 2, "vae": 2, "remote": 1, "core": 0, "models": 0}


def find_room_offenders(folder: str, rooms: dict, repo: Path = REPO) -> list:
    """Imports from one room of ``folder`` (e.g. ``loaders/comfy``) into a room on the same floor or
    above it, as ``path:line: module``."""
    prefix = ["sharddit", *folder.split("/")]
    offenders = []
    for room, floor in rooms.items():
        for path in sorted((repo / folder / room).rglob("*.py")):
            for line, name in _pack_imports(path, repo):
                parts = name.split(".")
                if parts[:len(prefix)] == prefix and len(parts) > len(prefix):
                    other = parts[len(prefix)]
                    if other in rooms and other != room and rooms[other] >= floor:
                        offenders.append(f"{path.relative_to(repo)}:{line}: {name}")
    return offenders


def test_loaders_subpackages_have_no_import_cycle():
    """Package-level import graph of loaders/: cli -> plan -> comfy, never back."""
    offenders = find_room_offenders("loaders", LOADERS_ROOMS)
    assert offenders == [], "loaders/ imports must point cli -> plan -> comfy:\n" + "\n".join(offenders)


def test_comfy_rooms_import_one_way():
    """loaders/comfy/ is rooms only, and they import down: loading -> shard, vae -> remote -> core, models."""
    comfy = REPO / "loaders" / "comfy"
    loose = sorted(p.name for p in comfy.glob("*.py") if p.name != "__init__.py")
    rooms = sorted(p.name for p in comfy.iterdir() if (p / "__init__.py").is_file())
    assert loose == [] and rooms == sorted(COMFY_ROOMS), (
        f"loaders/comfy/ holds rooms {sorted(COMFY_ROOMS)} only; put {loose or rooms} in one (and in COMFY_ROOMS)")
    offenders = find_room_offenders("loaders/comfy", COMFY_ROOMS)
    assert offenders == [], ("loaders/comfy/ rooms import down only: loading -> shard, vae -> remote -> core, "
                             "models:\n" + "\n".join(offenders))


def test_room_checker_catches_up_and_sideways_imports(tmp_path):
    files = {"loaders/comfy/core/state.py": "from ..shard.hooks import x\nfrom ..models.specs import y\n",
             "loaders/comfy/shard/hooks.py": "from ..core.state import z\nfrom . import pipeline\n",
             "loaders/comfy/loading/load.py": "def f():\n    from ..shard import pipeline\n",
             "loaders/comfy/vae/decode.py": "from sharddit.loaders.comfy.shard.hooks import x\n"}
    for rel, text in files.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    assert find_room_offenders("loaders/comfy", COMFY_ROOMS, tmp_path) == [
        "loaders/comfy/vae/decode.py:1: sharddit.loaders.comfy.shard.hooks.x",
        "loaders/comfy/core/state.py:1: sharddit.loaders.comfy.shard.hooks.x",
        "loaders/comfy/core/state.py:2: sharddit.loaders.comfy.models.specs.y"]


# ------------------------------------------------------------------ (e2) one name, one module


def find_duplicate_module_names(repo: Path = REPO) -> list:
    """Product modules (everything but tests/ and benchmarks/) that share a base name: a file's stem
    or a package's folder name, ``__init__``/``__main__`` aside. ``[(name, [paths])]``."""
    seen = {}
    for path in sorted(repo.rglob("*.py")):
        rel = path.relative_to(repo)
        if rel.parts[0] in ("tests", "benchmarks") or any(p.startswith(".") for p in rel.parts):
            continue
        if path.name == "__main__.py":
            continue
        if path.name == "__init__.py":
            if len(rel.parts) > 1:
                seen.setdefault(rel.parts[-2], []).append(str(rel.parent) + "/")
        else:
            seen.setdefault(path.stem, []).append(str(rel))
    return [(name, paths) for name, paths in sorted(seen.items()) if len(paths) > 1]


def test_no_two_product_modules_share_a_name():
    twins = find_duplicate_module_names()
    assert twins == [], "one name, one module (rename one of each pair to say what it holds):\n" + \
        "\n".join(f"{name}: {', '.join(paths)}" for name, paths in twins)


def test_duplicate_name_checker_catches(tmp_path):
    for rel in ("parallel/families.py", "loaders/comfy/families.py", "parallel/tiling/__init__.py",
                "loaders/tiling.py", "nodes/__init__.py", "loaders/__init__.py", "tests/families.py",
                "benchmarks/tiling.py", "__main__.py", "loaders/__main__.py"):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text("")
    assert find_duplicate_module_names(tmp_path) == [
        ("families", ["loaders/comfy/families.py", "parallel/families.py"]),
        ("tiling", ["loaders/tiling.py", "parallel/tiling/"])]


# ------------------------------------------------------------------ (f) one-way imports inside the pack

PACK_DIRS = ("parallel", "loaders", "nodes")


def _module_of(path: Path, repo: Path) -> str:
    rel = path.relative_to(repo).with_suffix("")
    parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
    return ".".join(("sharddit", *parts))


def _pack_modules(repo: Path) -> dict:
    """``{module name: path}`` of every pack module under ``PACK_DIRS`` (packages by their name)."""
    return {_module_of(p, repo): p for d in PACK_DIRS for p in sorted((repo / d).rglob("*.py"))}


def _imported_modules(path: Path, modules: dict, repo: Path) -> list:
    """``[(line, module, name)]``: each pack module ``path`` imports, at module level or inside a
    function, with the name taken from it ('' when the module itself is imported)."""
    found = []
    for line, name in _pack_imports(path, repo):
        if name in modules:
            found.append((line, name, ""))
        elif name.rpartition(".")[0] in modules:
            found.append((line, name.rpartition(".")[0], name.rpartition(".")[2]))
    return found


def find_import_cycles(repo: Path = REPO) -> list:
    """Every loop of pack modules that import each other, function-level imports included (each
    loop once, as ``a -> b -> a``)."""
    modules = _pack_modules(repo)
    graph = {m: sorted({t for _, t, _ in _imported_modules(p, modules, repo) if t != m}) for m, p in modules.items()}
    cycles, state = set(), {}

    def visit(m, stack):
        state[m] = "open"
        stack.append(m)
        for t in graph.get(m, ()):
            if state.get(t) == "open":
                loop = stack[stack.index(t):]
                i = loop.index(min(loop))
                cycles.add(" -> ".join(loop[i:] + loop[:i] + [loop[i]]))
            elif t not in state:
                visit(t, stack)
        stack.pop()
        state[m] = "done"

    for m in graph:
        if m not in state:
            visit(m, [])
    return sorted(cycles)


def find_private_imports(repo: Path = REPO) -> list:
    """``from .x import _name`` across pack modules: a private name belongs to its own module."""
    modules = _pack_modules(repo)
    return [f"{path.relative_to(repo)}:{line}: {target}.{name}"
            for path in modules.values() for line, target, name in _imported_modules(path, modules, repo)
            if name.startswith("_") and not name.startswith("__")]


def _fake_pack(tmp_path, files: dict) -> Path:
    for rel, text in files.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    for d in PACK_DIRS:
        (tmp_path / d).mkdir(exist_ok=True)
    return tmp_path


def test_import_cycle_checker_catches_function_level_loops(tmp_path):
    repo = _fake_pack(tmp_path, {
        "loaders/sim/__init__.py": "", "loaders/sim/a.py": "from .b import plan\n",
        "loaders/sim/b.py": "def plan():\n    from .a import helper\n",
        "loaders/sim/c.py": "from .b import plan\n"})
    assert find_import_cycles(repo) == ["sharddit.loaders.sim.a -> sharddit.loaders.sim.b -> sharddit.loaders.sim.a"]


def test_import_cycle_checker_skips_annotation_only_imports(tmp_path):
    repo = _fake_pack(tmp_path, {
        "parallel/d/__init__.py": "", "parallel/d/lobby.py": "from .host import Session\n",
        "parallel/d/host.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .lobby import Lobby\n",
        "parallel/d/ranks.py": "import typing\nif typing.TYPE_CHECKING:\n    pass\nfrom .lobby import x\n"})
    assert find_import_cycles(repo) == []
    (repo / "parallel/d/host.py").write_text("def f():\n    from .lobby import Lobby\n")
    assert find_import_cycles(repo) == ["sharddit.parallel.d.host -> sharddit.parallel.d.lobby -> sharddit.parallel.d.host"]


def test_private_import_checker_catches(tmp_path):
    repo = _fake_pack(tmp_path, {
        "loaders/sim/__init__.py": "", "loaders/sim/a.py": "def f():\n    from .b import _plan, shown, __doc__\n",
        "loaders/sim/b.py": "def _plan(): pass\n", "parallel/_util.py": "", "parallel/x.py": "from . import _util\n"})
    assert find_private_imports(repo) == ["loaders/sim/a.py:2: sharddit.loaders.sim.b._plan"]


def test_pack_has_no_import_cycle_even_inside_functions():
    cycles = find_import_cycles()
    assert cycles == [], "pack modules must import one way (function-level imports too):\n" + "\n".join(cycles)


def test_no_module_imports_a_private_name_from_another():
    offenders = find_private_imports()
    assert offenders == [], "a private (_name) stays in its module; make it public where it is shared:\n" + \
        "\n".join(offenders)


# ------------------------------------------------------------------ (i) __all__ names what a module defines

# A module's ``__all__`` lists what it defines; a name it only imports is imported from where it is
# defined. A package ``__init__.py`` is exempt: handing names on is its job.
ALL_PENDING: dict[str, set] = {}


def _defined_names(tree: ast.Module) -> set:
    """Names bound at the top level of ``tree`` other than by an import (or inside ``if``/``try``)."""
    names, todo = set(), list(tree.body)
    while todo:
        node = todo.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)  # not its body: a name bound inside a function is not the module's
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names |= {n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)}
        elif isinstance(node, (ast.If, ast.Try, ast.With)):
            todo += [*node.body, *getattr(node, "orelse", ()), *getattr(node, "finalbody", ()),
                     *(s for h in getattr(node, "handlers", ()) for s in h.body)]
    return names


def find_reexports(repo: Path = REPO, pending: dict | None = None) -> list:
    """``["path: name"]`` for each name a product module's ``__all__`` lists but only imports."""
    pending = ALL_PENDING if pending is None else pending
    found = []
    for d in PACK_DIRS:
        for path in sorted((repo / d).rglob("*.py")):
            if path.name == "__init__.py":
                continue
            tree = ast.parse(path.read_text())
            listed = [ast.literal_eval(n.value) for n in tree.body if isinstance(n, ast.Assign)
                      and any(isinstance(t, ast.Name) and t.id == "__all__" for t in n.targets)]
            rel = path.relative_to(repo).as_posix()
            defined = _defined_names(tree) | pending.get(rel, set())
            found += [f"{rel}: {name}" for names in listed for name in names if name not in defined]
    return found


def test_reexport_checker_catches(tmp_path):
    repo = _fake_pack(tmp_path, {
        "parallel/units.py": "__all__ = ['GiB', 'format_gib']\nGiB = 1 << 30\ndef format_gib(b): pass\n",
        "loaders/plan/__init__.py": "from ...parallel.units import format_gib\n__all__ = ['format_gib']\n",
        "loaders/plan/findings.py": "from ...parallel.units import GiB, format_gib\n"
                                    "__all__ = ['Report', 'format_gib', 'LIMIT', 'shown']\nclass Report: pass\nLIMIT: int = 3\n"
                                    "def f():\n    shown = 1\n"})
    assert find_reexports(repo, {}) == ["loaders/plan/findings.py: format_gib", "loaders/plan/findings.py: shown"]


def test_all_lists_only_what_the_module_defines():
    offenders = find_reexports()
    assert offenders == [], ("a module's __all__ names what it defines; import these from the module that "
                             "defines them (a package __init__.py may hand names on):\n" + "\n".join(offenders))


# The sequence engine's collaborators arrive through its constructor, ``use_runner`` or
# ``set_split_check`` (issue 35 item 4); ``runner`` and a router's ``engine`` are read-only, and the
# others are private: an outside assignment would silently add an attribute the engine never reads.
ENGINE_SLOTS = {"should_stop", "split_check", "interrupt_exceptions", "runner", "engine", "_should_stop",
                "_split_check", "_interrupt_exceptions", "_runner", "_engine"}
ENGINE_OWNERS = {"parallel/sequence/engine.py", "parallel/blocks/routing.py"}


def find_engine_slot_assignments(repo: Path = REPO) -> list:
    """``["path:line name"]`` for each assignment to an engine slot on another object than ``self``,
    outside the engine and the router."""
    found = []
    for d in PACK_DIRS:
        for path in sorted((repo / d).rglob("*.py")):
            rel = path.relative_to(repo).as_posix()
            if rel in ENGINE_OWNERS:
                continue
            for node in ast.walk(ast.parse(path.read_text())):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(
                    node, (ast.AugAssign, ast.AnnAssign)) else []
                for t in targets:
                    if isinstance(t, ast.Attribute) and t.attr in ENGINE_SLOTS and not (
                            isinstance(t.value, ast.Name) and t.value.id == "self"):
                        found.append(f"{rel}:{node.lineno} {t.attr}")
    return found


def test_no_engine_slot_is_assigned_from_outside():
    assert find_engine_slot_assignments() == []


def test_engine_slot_checker_catches(tmp_path):
    repo = _fake_pack(tmp_path, {
        "loaders/comfy/shard/sharded_model.py": "engine.should_stop = f\nrouter.engine = e\nself.runner = r\n",
        "parallel/sequence/engine.py": "engine.runner = r\n",
    })
    assert find_engine_slot_assignments(repo) == ["loaders/comfy/shard/sharded_model.py:1 should_stop",
                                                  "loaders/comfy/shard/sharded_model.py:2 engine"]
