"""The ``devices`` input is parsed once (issue 35 item 2): ``parallel/placement/devices.parse_device_plan``
is the one parser; the node and CLI entry points below call it, and everything downstream takes the
``DevicePlan`` it returns. Read from the product's source (pure: no torch, no ComfyUI)."""
import ast
from collections import Counter
from pathlib import Path

import pytest

pytestmark = pytest.mark.no_blas  # no BLAS arithmetic: left out of the other-MKL_CBWR rerun in .ci/run

REPO = Path(__file__).resolve().parents[1]
PARSER_HOME = "parallel/placement/devices.py"

ENTRY_POINTS = {
    # file: how many calls of the one parser it makes, each where a ``devices`` input enters
    "loaders/cli/plan_command.py": 1,  # plan CLI: --devices checked before ComfyUI's import
    "loaders/comfy/loading/model_loading.py": 1,  # the loader nodes' validate_inputs
    "loaders/comfy/loading/text_encoder_split.py": 1,  # a text encoder's device list (no workers)
    "loaders/comfy/shard/pipeline.py": 1,  # shard_model: the Shard and loader nodes' devices
    "loaders/comfy/shard/sampling.py": 1,  # the KSampler's devices (its clone cache key)
    "loaders/comfy/vae/tiled_decode.py": 2,  # the VAE decode node: validate_inputs, then the decode
    "loaders/plan/setup.py": 1,  # the dry run's devices given as text (the Plan node's): a list or `auto`
}
MEMBERS_ONLY = {"parallel/cost/workers.py": 1}  # the plan CLI's spec with sizes: its host part is an inventory spec
OTHER_COMMA_LISTS = {
    # file: how many ``.split(",")`` of inputs that are not a ``devices`` string it makes
    "loaders/cli/worker_devices.py": 1,  # a worker's own --devices (single devices, no weights or members)
    "loaders/plan/text_encoders.py": 1,  # --gpu names
    "loaders/workflow/shard_transform.py": 1,  # a ComfyUI input type list ("MODEL,CLIP")
    "parallel/cluster/rank_actor.py": 1,  # an environment variable's module list
    "parallel/cost/inputs.py": 1,  # --gpu names
    "parallel/cost/workers.py": 1,  # the plan CLI's spec with sizes (NAME/DEVICE=SIZE)
    "parallel/placement/inventory.py": 1,  # an inventory spec (cuda:0=24GiB)
    "parallel/placement/visible.py": 1,  # CUDA_VISIBLE_DEVICES
}
RETIRED = {"parse_devices", "split_worker_devices"}  # the parsers the one parser replaced
TAKES_A_PLAN = {"PlacementRequest", "plan_layer_split", "rank_speeds", "resolve_decode_devices", "shard_model",
                "plan_encoder_split", "record_dit", "resolve_auto_devices"}


def product_files():
    files = [REPO / "__init__.py"]
    for room in ("nodes", "loaders", "parallel"):
        files += sorted((REPO / room).rglob("*.py"))
    return files


def _name(func) -> str:
    return func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""


def _joins_or_text(node) -> bool:
    """A joined string (``",".join(...)``) or a literal device string handed on."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return True
    return (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "join"
            and isinstance(node.func.value, ast.Constant) and node.func.value.value == ",")


def device_string_findings(source: str, rel: str) -> list[str]:
    """What in ``source`` (the file ``rel``) parses a devices string outside the one parser's allowed
    places, or hands a string on where a ``DevicePlan`` belongs."""
    found, counts = [], Counter()
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Call):
            continue
        name = _name(node.func)
        if name in RETIRED:
            found.append(f"{rel}:{node.lineno}: {name}() (parse_device_plan is the one parser)")
        elif name == "with_worker_shares" and isinstance(node.func, ast.Name):
            found.append(f"{rel}:{node.lineno}: with_worker_shares() on a string (DevicePlan.with_worker_shares)")
        elif name in ("parse_device_plan", "split_members"):
            counts[name] += 1
        elif (name == "split" and isinstance(node.func, ast.Attribute) and node.args
              and isinstance(node.args[0], ast.Constant) and node.args[0].value == ","):
            counts["split"] += 1
        if name in TAKES_A_PLAN:
            handed = list(node.args) + [k.value for k in node.keywords if k.arg in (None, "devices", "listed")]
            if any(_joins_or_text(a) for a in handed if a is not None):
                found.append(f"{rel}:{node.lineno}: a devices string handed to {name}() (give it a DevicePlan)")
    if rel != PARSER_HOME:
        for name, allowed in (("parse_device_plan", ENTRY_POINTS), ("split_members", MEMBERS_ONLY),
                              ("split", OTHER_COMMA_LISTS)):
            if counts[name] > allowed.get(rel, 0):
                what = 'split(",")' if name == "split" else f"{name}()"
                found.append(f"{rel}: {counts[name]} {what} (allowed here: {allowed.get(rel, 0)})")
    return found


def test_the_devices_string_is_parsed_once_where_it_enters():
    findings = []
    for path in product_files():
        rel = path.relative_to(REPO).as_posix()
        findings += device_string_findings(path.read_text(encoding="utf-8"), rel)
    assert findings == [], ("a devices string is parsed again or passed on as text; parse it once at the entry "
                            "point (parse_device_plan) and pass the DevicePlan:\n" + "\n".join(findings))


def test_the_allowlists_name_files_that_exist_and_still_need_it():
    """An entry point that no longer parses leaves the list (the list stays short and true)."""
    for allowed, name in ((ENTRY_POINTS, "parse_device_plan"), (MEMBERS_ONLY, "split_members")):
        for rel, n in allowed.items():
            source = (REPO / rel).read_text(encoding="utf-8")
            calls = sum(isinstance(c, ast.Call) and _name(c.func) == name for c in ast.walk(ast.parse(source)))
            assert calls == n, f"{rel} calls {name}() {calls} times, allowlisted {n}"


@pytest.mark.parametrize("source, rel, expected", [
    ("from .devices import parse_devices\nx = parse_devices(text)", "loaders/x.py", "parse_devices()"),
    ("local, remote = split_worker_devices(devices)", "parallel/x.py", "split_worker_devices()"),
    ("p = parse_device_plan(where.plan.text)", "loaders/comfy/shard/mode_decision.py", "parse_device_plan() (allowed"),
    ("a = parse_device_plan(d)\nb = parse_device_plan(d)", "loaders/comfy/shard/pipeline.py", "2 parse_device_plan()"),
    ("local = [p for p in devices.split(',')]", "loaders/comfy/shard/which_devices.py", 'split(",")'),
    ("r = with_worker_shares(local, 2)", "loaders/plan/dry_run.py", "with_worker_shares() on a string"),
    ("PlacementRequest(devices=','.join(gpus))", "loaders/plan/strategies.py", "handed to PlacementRequest()"),
    ("shard_model(model, ','.join(devices))", "loaders/cli/selftest/suite.py", "handed to shard_model()"),
    ("rank_speeds('cuda:0,cuda:1', ranks, inv)", "loaders/x.py", "handed to rank_speeds()"),
])
def test_the_checker_catches(source, rel, expected):
    assert any(expected in f for f in device_string_findings(source, rel)), device_string_findings(source, rel)


def test_the_checker_passes_the_typed_forms():
    source = ("plan = DevicePlan.of_devices(gpus)\nPlacementRequest(devices=plan)\n"
              "PlacementRequest(devices=where.plan.with_worker_shares())\nrank_speeds(where.plan, ranks, inv)\n")
    assert device_string_findings(source, "loaders/x.py") == []


def test_the_plan_cli_reads_its_devices_once():
    """``plan --devices`` is read once, in ``check_plan_args``: its worker part split off, the
    host part parsed (or read as imagined GPUs); ``run`` hands the values on, never the text."""
    tree = ast.parse((REPO / "loaders/cli/plan_command.py").read_text(encoding="utf-8"))
    funcs = {f.name: f for f in ast.walk(tree) if isinstance(f, ast.FunctionDef)}
    for reader in ("split_worker_spec", "parse_device_plan", "inventory_from_spec"):
        calls = [c for c in ast.walk(tree) if isinstance(c, ast.Call) and _name(c.func) == reader]
        assert len(calls) == 1, f"plan_command.py calls {reader}() {len(calls)} times"
        assert any(c is n for n in ast.walk(funcs["check_plan_args"]) for c in calls), f"{reader}() outside check_plan_args"
    handed = [c for c in ast.walk(funcs["run"]) if isinstance(c, ast.Call)
              for a in c.args if isinstance(a, ast.Attribute) and a.attr == "devices"
              and isinstance(a.value, ast.Name) and a.value.id == "args"]
    assert not handed, "run() hands the --devices text on"
