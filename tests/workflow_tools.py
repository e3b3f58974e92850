"""Helpers for the shipped workflows (``workflows/*.json``): node tables, schema reading, UI → API.

Pure Python (no ComfyUI, no torch): used by ``tests/test_workflows.py`` (CI),
``tests/test_workflows_comfy.py`` (against real ComfyUI) and ``tests/build_workflows.py`` (writes
the JSON files).

- ``CORE_NODES``: the checked-in list of core ComfyUI (>= 0.3.64) nodes the workflows use, with
  their inputs in schema order (widgets and sockets) and outputs. The ``comfy`` tests compare it
  with the real ``NODE_CLASS_MAPPINGS``.
- ``sharddit_schemas()``: our nodes' inputs read from ``nodes/*.py`` ``define_schema`` with ``ast``
  (no import), helpers from ``nodes/common_inputs.py`` resolved.
- ``ui_to_api()``: what the ComfyUI frontend sends for a UI-format workflow (widgets_values mapped
  to input names, the seed's ``control_after_generate`` value dropped, links as ``[id, slot]``).
"""
from __future__ import annotations

import ast
import json
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
WORKFLOWS_DIR = REPO / "workflows"
# API twins: below the template folder, so ComfyUI does not offer them as templates.
API_DIR = WORKFLOWS_DIR / "api"
NODES_DIR = REPO / "nodes"

WIDGET_TYPES = {"INT", "FLOAT", "STRING", "BOOLEAN", "COMBO"}
# Frontend-only nodes: in UI workflows, never sent to the server (absent from API twins).
FRONTEND_ONLY = {"Note", "MarkdownNote"}
# Values of the widget the frontend adds after an input with control_after_generate.
CONTROL_VALUES = {"fixed", "increment", "decrement", "randomize"}


@dataclass(frozen=True)
class Input:
    name: str
    type: str                 # INT FLOAT STRING BOOLEAN COMBO, or a socket type (MODEL, CLIP, ...)
    control: bool = False     # control_after_generate (frontend adds a fixed/randomize widget)
    optional: bool = False
    default: object = None
    min: float | None = None
    max: float | None = None
    options: tuple | None = None   # literal combo options when known
    folder: str | None = None      # combo of folder_paths.get_filename_list(folder)
    multiline: bool = False        # STRING shown as a text box (taller than a one-line widget)

    @property
    def is_widget(self) -> bool:
        return self.type in WIDGET_TYPES


@dataclass(frozen=True)
class NodeSpec:
    node_id: str
    inputs: tuple
    outputs: tuple = ()             # (name, type) per output slot
    output_node: bool = False
    extra: dict = field(default_factory=dict, compare=False)
    since: str = "0.3.64"           # the oldest ComfyUI the tests have this node in (COMFY_VERSIONS)

    def input(self, name: str) -> Input:
        for i in self.inputs:
            if i.name == name:
                return i
        raise KeyError(f"{self.node_id} has no input {name!r}")

    @property
    def widgets(self) -> list:
        return [i for i in self.inputs if i.is_widget]

    @property
    def sockets(self) -> list:
        return [i for i in self.inputs if not i.is_widget]


def _core(node_id, inputs, outputs, output_node=False, since=None, api_also=None):
    parsed = []
    for text in inputs.split():
        optional = text.endswith("?")
        text = text.rstrip("?")
        control = text.endswith("*")
        multiline = text.endswith("+")
        name, typ = text.rstrip("*+").split(":")
        parsed.append(Input(name, typ, control=control, optional=optional, multiline=multiline))
    outs = tuple(tuple(o.split(":")) if ":" in o else (o, o) for o in outputs.split())
    return NodeSpec(node_id, tuple(parsed), outs, output_node, since=since or COMFY_VERSIONS[0],
                    extra={"api_also": api_also} if api_also else {})


# The ComfyUI versions the tests run (tests/README.md): a node's ``since`` and a workflow's
# ``min_comfyui`` are one of them. A node with since "0.29.0" is absent from 0.3.64 (checked by
# test_workflows_comfy.py on 0.3.64) and present in 0.29.0 (one with since "0.33.0" is absent from
# 0.29.0 and present in 0.33.0); when it came in between, the tests
# cannot tell, so the workflows claim no more than what was run.
COMFY_VERSIONS = ("0.3.64", "0.29.0", "0.33.0")


def version_tuple(version: str) -> tuple:
    """"0.3.64" -> (0, 3, 64); a suffix after the numbers ("0.29.0+cu") is ignored."""
    import re

    parts = []
    for piece in version.split("."):
        digits = re.match(r"\d+", piece)
        if digits is None:
            break
        parts.append(int(digits.group()))
        if digits.end() < len(piece):  # "0+cu128": the version ends here
            break
    if not parts:
        raise ValueError(f"not a ComfyUI version: {version!r} (expected e.g. '0.29.0')")
    return tuple(parts)


# Core ComfyUI 0.3.64 nodes used by the workflows: inputs in INPUT_TYPES order (required, then
# optional); `*` = control_after_generate, `+` = multiline, `?` = optional. Checked against the real
# NODE_CLASS_MAPPINGS by tests/test_workflows_comfy.py::test_core_node_table_matches_comfyui. A
# newer ComfyUI may append optional inputs (0.29: CreateVideo's `bit_depth`) and outputs (0.29:
# SaveVideo returns its VIDEO): the workflows stay valid, and the check allows exactly that.
CORE_NODES = {n.node_id: n for n in [
    _core("CheckpointLoaderSimple", "ckpt_name:COMBO", "MODEL CLIP VAE"),
    _core("DualCLIPLoader", "clip_name1:COMBO clip_name2:COMBO type:COMBO device:COMBO?", "CLIP"),
    _core("CLIPTextEncode", "text:STRING+ clip:CLIP", "CONDITIONING"),
    _core("ModelSamplingSD3", "model:MODEL shift:FLOAT", "MODEL"),
    _core("EmptyHunyuanLatentVideo", "width:INT height:INT length:INT batch_size:INT", "LATENT"),
    _core("EmptyLTXVLatentVideo", "width:INT height:INT length:INT batch_size:INT", "LATENT"),
    _core("LTXVConditioning", "positive:CONDITIONING negative:CONDITIONING frame_rate:FLOAT",
          "positive:CONDITIONING negative:CONDITIONING"),
    _core("LTXVScheduler", "steps:INT max_shift:FLOAT base_shift:FLOAT stretch:BOOLEAN terminal:FLOAT latent:LATENT?",
          "SIGMAS"),
    _core("KSamplerAdvanced", "model:MODEL add_noise:COMBO noise_seed:INT* steps:INT cfg:FLOAT sampler_name:COMBO "
          "scheduler:COMBO positive:CONDITIONING negative:CONDITIONING latent_image:LATENT start_at_step:INT "
          "end_at_step:INT return_with_leftover_noise:COMBO", "LATENT"),
    _core("SamplerCustom", "model:MODEL add_noise:BOOLEAN noise_seed:INT* cfg:FLOAT positive:CONDITIONING "
          "negative:CONDITIONING sampler:SAMPLER sigmas:SIGMAS latent_image:LATENT",
          "output:LATENT denoised_output:LATENT"),
    _core("SamplerCustomAdvanced", "noise:NOISE guider:GUIDER sampler:SAMPLER sigmas:SIGMAS latent_image:LATENT",
          "output:LATENT denoised_output:LATENT"),
    _core("KSamplerSelect", "sampler_name:COMBO", "SAMPLER"),
    _core("BasicScheduler", "model:MODEL scheduler:COMBO steps:INT denoise:FLOAT", "SIGMAS"),
    _core("BasicGuider", "model:MODEL conditioning:CONDITIONING", "GUIDER"),
    _core("RandomNoise", "noise_seed:INT*", "NOISE"),
    _core("FluxGuidance", "conditioning:CONDITIONING guidance:FLOAT", "CONDITIONING"),
    _core("CreateVideo", "images:IMAGE fps:FLOAT audio:AUDIO?", "VIDEO"),
    # 0.33: `format` is a dynamic combo whose every option holds a `codec` combo ("format.codec"), and
    # the old `codec` stays as a hidden optional input. Saved widgets [prefix, format, codec] load as
    # format and format.codec on 0.33's frontend (which also queues the hidden codec); the API twin
    # carries both names (api_also: "format.codec" takes codec's value), which each ComfyUI takes.
    _core("SaveVideo", "video:VIDEO filename_prefix:STRING format:COMBO codec:COMBO", "", output_node=True,
          api_also={"format.codec": "codec"}),
    _core("CFGGuider", "model:MODEL positive:CONDITIONING negative:CONDITIONING cfg:FLOAT", "GUIDER"),
    # ComfyUI 0.29.0 (absent from 0.3.64): LTX-2's audio, HunyuanVideo 1.5's and Kandinsky 5's latents.
    # LTXVEmptyLatentAudio's frame_rate is a FLOAT widget that also takes an INT link (MultiType).
    _core("LTXVAudioVAELoader", "ckpt_name:COMBO", "VAE", since="0.29.0"),
    _core("LTXVEmptyLatentAudio", "frames_number:INT frame_rate:FLOAT batch_size:INT audio_vae:VAE", "LATENT",
          since="0.29.0"),
    _core("LTXVConcatAVLatent", "video_latent:LATENT audio_latent:LATENT", "latent:LATENT", since="0.29.0"),
    _core("LTXVSeparateAVLatent", "av_latent:LATENT", "video_latent:LATENT audio_latent:LATENT", since="0.29.0"),
    _core("LTXVAudioVAEDecode", "samples:LATENT audio_vae:VAE", "AUDIO", since="0.29.0"),
    _core("EmptyHunyuanVideo15Latent", "width:INT height:INT length:INT batch_size:INT", "LATENT", since="0.29.0"),
    _core("Kandinsky5ImageToVideo", "positive:CONDITIONING negative:CONDITIONING vae:VAE width:INT height:INT "
          "length:INT batch_size:INT start_image:IMAGE?",
          "positive:CONDITIONING negative:CONDITIONING latent:LATENT cond_latent:LATENT", since="0.29.0"),
    # MiniMax H3's graph: its audio VAE through core's loader and audio decode, its joint video + audio
    # latent (ComfyUI 0.33.0, comfy_extras/nodes_minimax_h3.py). VAEDecodeAudio is in 0.3.64's
    # comfy_extras/nodes_audio.py, which loads only where torchaudio is installed; the 0.3.64 the tests
    # run has none, so the oldest ComfyUI the tests have it in is 0.29.0.
    _core("VAELoader", "vae_name:COMBO", "VAE"),
    _core("VAEDecodeAudio", "samples:LATENT vae:VAE", "AUDIO", since="0.29.0"),
    _core("EmptyMiniMaxH3LatentAV", "width:INT height:INT length:INT", "LATENT", since="0.33.0"),
]}


# Display names (what the frontend writes as an untitled node's API ``_meta.title``); a core node
# not listed here has none and shows its id. The workflows carry 0.3.64's; NEWER_DISPLAY_NAMES are
# the names newer ComfyUI gave nodes since (0.29.0), a label only: titles do not affect a run.
CORE_DISPLAY_NAMES = {"CheckpointLoaderSimple": "Load Checkpoint", "CLIPTextEncode": "CLIP Text Encode (Prompt)",
                      "KSamplerAdvanced": "KSampler (Advanced)", "CreateVideo": "Create Video",
                      "SaveVideo": "Save Video", "LTXVAudioVAELoader": "Load LTXV Audio VAE",
                      "LTXVEmptyLatentAudio": "LTXV Empty Latent Audio", "LTXVAudioVAEDecode": "LTXV Audio VAE Decode",
                      "EmptyHunyuanVideo15Latent": "Empty HunyuanVideo 1.5 Latent", "VAELoader": "Load VAE",
                      "VAEDecodeAudio": "VAE Decode Audio", "EmptyMiniMaxH3LatentAV": "Empty MiniMax H3 AV Latent"}
NEWER_DISPLAY_NAMES = {"DualCLIPLoader": "Load CLIP (Dual)", "EmptyHunyuanLatentVideo": "Empty HunyuanVideo 1.0 Latent",
                       "BasicGuider": "Basic Guider", "CFGGuider": "CFG Guider",
                       "LTXVConcatAVLatent": "Concat AV Latent", "LTXVSeparateAVLatent": "Separate AV Latent"}  # 0.33


def display_name(spec: NodeSpec) -> str:
    return spec.extra.get("display_name") or CORE_DISPLAY_NAMES.get(spec.node_id, spec.node_id)


# ----------------------------------------------------------------------------- node sizes
# The frontend (1.27.10) never draws a node smaller than its computeSize(): one 20 px row per
# socket input or output (at least one row), 24 px per widget (54 per multiline text box) and a
# 14 px margin under the widgets (6 when there are none). A node saved smaller is grown on load
# and then covers whatever sits below it. tests/test_browser_ui.py checks this rule against the
# real frontend's computeSize() for every node of every shipped workflow.
SLOT_H, WIDGET_H, MULTILINE_H, TITLE_H = 20, 24, 54, 30


def min_node_height(spec: NodeSpec) -> int:
    """Height (below the 30 px title bar) the frontend gives a node of this schema at least."""
    rows = max(len(spec.sockets), len(spec.outputs), 1)
    widgets = sum(MULTILINE_H if i.multiline else WIDGET_H * (2 if i.control else 1) for i in spec.widgets)
    return rows * SLOT_H + widgets + (14 if widgets else 6)


def node_box(node: dict, table: dict) -> list:
    """``[x, y, w, h]`` a UI-format node covers on the canvas: its title bar and at least its real height."""
    spec = table.get(node["type"])
    h = max(node["size"][1], min_node_height(spec)) if spec is not None else node["size"][1]
    return [node["pos"][0], node["pos"][1] - TITLE_H, node["size"][0], h + TITLE_H]


# ----------------------------------------------------------------------------- our schemas (ast)
_IO_TYPES = {"Int": "INT", "Float": "FLOAT", "String": "STRING", "Boolean": "BOOLEAN", "Combo": "COMBO",
             "Model": "MODEL", "Clip": "CLIP", "Vae": "VAE", "Latent": "LATENT", "Image": "IMAGE",
             "Conditioning": "CONDITIONING", "Sigmas": "SIGMAS", "Noise": "NOISE", "Guider": "GUIDER",
             "Sampler": "SAMPLER"}


def _io_call_type(call: ast.Call) -> tuple[str, str] | None:
    """``io.Int.Input(...)`` → ("Int", "Input"), ``CheckedCombo(...)`` (nodes/common_inputs.py: a
    combo ComfyUI checks) → ("Combo", "Input"); anything else → None."""
    f = call.func
    if isinstance(f, ast.Name) and f.id == "CheckedCombo":
        return "Combo", "Input"
    if isinstance(f, ast.Attribute) and isinstance(f.value, ast.Attribute) and isinstance(f.value.value, ast.Name) \
            and f.value.value.id == "io":
        return f.value.attr, f.attr
    return None


class _Resolver:
    """Evaluates the few expression shapes define_schema uses: literals, module constants,
    ``folder_paths.get_filename_list("x")``, helper functions from common_inputs."""

    def __init__(self, module_consts: dict, helpers: dict):
        self.consts = module_consts
        self.helpers = helpers

    def value(self, node, env=None):
        env = env or {}
        if isinstance(node, ast.Name) and node.id in env:
            return env[node.id]
        if isinstance(node, ast.Name) and node.id in self.consts:
            return self.consts[node.id]
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            key = f"{node.value.id}.{node.attr}"
            if key in self.consts:
                return self.consts[key]
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get_filename_list":
            return ("folder", ast.literal_eval(node.args[0]))
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("list", "tuple") \
                and len(node.args) == 1:
            inner = self.value(node.args[0], env)
            return list(inner) if isinstance(inner, (list, tuple)) else None
        if isinstance(node, ast.BinOp):  # e.g. tooltip concatenation: not needed
            return None
        try:
            return ast.literal_eval(node)
        except (ValueError, TypeError, SyntaxError):
            return None

    def inputs(self, call: ast.Call, env=None) -> Input | None:
        env = env or {}
        io_type = _io_call_type(call)
        if io_type is None:
            name = call.func.id if isinstance(call.func, ast.Name) else None
            if name not in self.helpers:
                return None
            fn = self.helpers[name]
            params = [a.arg for a in fn.args.args]
            defaults = dict(zip(params[len(params) - len(fn.args.defaults):], fn.args.defaults))
            local = {p: self.value(d, env) for p, d in defaults.items()}
            for p, a in zip(params, call.args):
                local[p] = self.value(a, env)
            for kw in call.keywords:
                local[kw.arg] = self.value(kw.value, env)
            ret = next(n for n in ast.walk(fn) if isinstance(n, ast.Return))
            return self.inputs(ret.value, local)
        kind, attr = io_type
        if attr != "Input":
            return None
        kw = {k.arg: k.value for k in call.keywords}
        args = list(call.args)
        name = self.value(args[0], env) if args else self.value(kw.get("id"), env)
        opts = None
        folder = None
        if kind == "Combo":
            raw = self.value(args[1], env) if len(args) > 1 else self.value(kw.get("options"), env) if "options" in kw else None
            if isinstance(raw, tuple) and raw and raw[0] == "folder":
                folder = raw[1]
            elif isinstance(raw, (list, tuple)):
                opts = tuple(raw)
        get = lambda k: self.value(kw[k], env) if k in kw else None  # noqa: E731
        return Input(name=name, type=_IO_TYPES.get(kind, kind.upper()), control=bool(get("control_after_generate")),
                     optional=bool(get("optional")), default=get("default"), min=get("min"), max=get("max"),
                     options=opts, folder=folder, multiline=bool(get("multiline")))


def _module_consts(tree: ast.Module, prefix: str = "") -> dict:
    out = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            try:
                out[prefix + node.targets[0].id] = ast.literal_eval(node.value)
            except (ValueError, TypeError, SyntaxError):
                pass
    return out


def sharddit_schemas(nodes_dir: Path = NODES_DIR) -> dict:
    """``{node_id: NodeSpec}`` for every ``io.Schema(node_id=...)`` in ``nodes/*.py``, via ast."""
    helpers = {}
    common = nodes_dir / "common_inputs.py"
    if common.exists():
        for fn in ast.parse(common.read_text()).body:
            if isinstance(fn, ast.FunctionDef):
                helpers[fn.name] = fn
    consts = {}
    # shared defaults (DEFAULT_DEVICES, DEFAULT_RESERVE_VRAM_GB) that nodes/common_inputs.py imports
    consts.update(_module_consts(ast.parse((nodes_dir.parent / "parallel" / "placement" / "plan_types.py").read_text())))
    for mod in sorted((nodes_dir.parent / "loaders").rglob("*.py")):
        try:
            consts.update(_module_consts(ast.parse(mod.read_text()), prefix=f"{mod.stem}."))
        except SyntaxError:
            continue
    specs = {}
    for path in sorted(nodes_dir.rglob("*.py")):
        tree = ast.parse(path.read_text())
        resolver = _Resolver({**consts, **_module_consts(tree)}, helpers)
        for call in ast.walk(tree):
            if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute) and call.func.attr == "Schema"):
                continue
            kw = {k.arg: k.value for k in call.keywords}
            if "node_id" not in kw:
                continue
            node_id = ast.literal_eval(kw["node_id"])
            inputs = []
            for item in kw["inputs"].elts if isinstance(kw.get("inputs"), ast.List) else []:
                parsed = resolver.inputs(item) if isinstance(item, ast.Call) else None
                if parsed is None:
                    raise ValueError(f"{path.name}: cannot read an input of {node_id} statically: {ast.unparse(item)}")
                inputs.append(parsed)
            outputs = []
            for item in kw["outputs"].elts if isinstance(kw.get("outputs"), ast.List) else []:
                t = _io_call_type(item) if isinstance(item, ast.Call) else None
                typ = _IO_TYPES.get(t[0], t[0].upper()) if t else "*"
                label = next((ast.literal_eval(k.value) for k in item.keywords if k.arg == "display_name"), typ)
                outputs.append((label, typ))
            output_node = isinstance(kw.get("is_output_node"), ast.Constant) and bool(kw["is_output_node"].value)
            name = ast.literal_eval(kw["display_name"]) if isinstance(kw.get("display_name"), ast.Constant) else None
            specs[node_id] = NodeSpec(node_id, tuple(inputs), tuple(outputs), output_node,
                                      extra={"file": path.name, "display_name": name})
    return specs


def node_table(sharddit: dict | None = None) -> dict:
    """CORE_NODES plus our nodes (``sharddit_schemas()`` unless given)."""
    return {**CORE_NODES, **(sharddit_schemas() if sharddit is None else sharddit)}


# ----------------------------------------------------------------------------- workflows
def workflow_pairs(directory: Path = WORKFLOWS_DIR) -> list:
    """``[(name, ui_path, api_path)]`` for every ``<name>.json`` with its ``api/<name>_api.json``."""
    return [(ui.stem, ui, directory / "api" / f"{ui.stem}_api.json") for ui in sorted(directory.glob("*.json"))]


def min_comfyui(ui: dict) -> str:
    """The oldest ComfyUI a UI workflow says it needs: ``extra.sharddit.min_comfyui``."""
    try:
        return ui["extra"]["sharddit"]["min_comfyui"]
    except (KeyError, TypeError):
        raise ValueError("the workflow has no extra.sharddit.min_comfyui mark") from None


def needed_comfyui(ui: dict, table: dict) -> str:
    """The newest ``since`` among the nodes of a UI workflow (its node types in ``table``)."""
    return max((table[n["type"]].since for n in ui["nodes"] if n["type"] in table),
               key=version_tuple, default=COMFY_VERSIONS[0])


def load(path: Path) -> dict:
    return json.loads(Path(path).read_text())


def widget_map(spec: NodeSpec, widgets_values: list) -> dict:
    """Map a UI node's widgets_values onto input names (control_after_generate values dropped).

    Raises ValueError when the count does not fit the schema (optional trailing widgets may be
    absent)."""
    values = list(widgets_values)
    out = {}
    for inp in spec.widgets:
        if not values:
            if inp.optional:
                continue
            raise ValueError(f"{spec.node_id}: widgets_values too short, no value for {inp.name!r}")
        out[inp.name] = values.pop(0)
        if inp.control:
            if not values or values[0] not in CONTROL_VALUES:
                raise ValueError(f"{spec.node_id}: {inp.name!r} needs a control_after_generate value "
                                 f"({sorted(CONTROL_VALUES)}) right after it")
            values.pop(0)
    if values:
        raise ValueError(f"{spec.node_id}: {len(values)} widgets_values left over: {values!r}")
    return out


def ui_links(ui: dict) -> dict:
    """``{link_id: (origin_id, origin_slot, target_id, target_slot, type)}``."""
    return {link[0]: tuple(link[1:6]) for link in ui["links"]}


def ui_to_api(ui: dict, table: dict, include_muted: bool = False) -> dict:
    """The API-format prompt the frontend would queue for ``ui`` (active nodes only, unless
    ``include_muted``: then muted nodes too, to check their values)."""
    links = ui_links(ui)
    api = {}
    for node in ui["nodes"]:
        if node["type"] in FRONTEND_ONLY or (node.get("mode", 0) != 0 and not include_muted):
            continue
        spec = table[node["type"]]
        inputs = widget_map(spec, node.get("widgets_values") or [])
        for inp in node.get("inputs", []):
            if inp.get("link") is None:
                continue
            origin_id, origin_slot, _, _, _ = links[inp["link"]]
            inputs[inp["name"]] = [str(origin_id), origin_slot]
        ordered = {i.name: inputs[i.name] for i in spec.inputs if i.name in inputs}
        for name, source in spec.extra.get("api_also", {}).items():
            if source in ordered:
                ordered[name] = ordered[source]
        entry = {"inputs": ordered, "class_type": node["type"]}
        if node.get("title"):
            entry["_meta"] = {"title": node["title"]}
        api[str(node["id"])] = entry
    return api


def strip_meta(api: dict) -> dict:
    return {k: {"class_type": v["class_type"], "inputs": v["inputs"]} for k, v in api.items()}


def _type_name(typ) -> str:
    return "COMBO" if isinstance(typ, (list, tuple)) else str(getattr(typ, "value", typ))


def input_specs(input_types: dict, prefix: str = "") -> dict:
    """``{name: (spec, optional)}`` of a node's ``INPUT_TYPES`` / object_info ``input``, a dynamic
    combo's inputs under ``"combo.sub"`` (those of every option)."""
    out = {}
    for section in ("required", "optional"):
        for name, spec in (input_types.get(section) or {}).items():
            out[prefix + name] = (spec, section == "optional")
            opts = spec[1] if len(spec) > 1 and isinstance(spec[1], dict) else {}
            if _type_name(spec[0]) == "COMFY_DYNAMICCOMBO_V3":
                for option in opts.get("options", []):
                    out.update(input_specs(option.get("inputs") or {}, f"{prefix}{name}."))
    return out


def _optional_default(entry, value) -> bool:
    """An optional widget input at its default (a dynamic combo's default: its first option)."""
    if entry is None or not entry[1]:
        return False
    spec = entry[0]
    opts = spec[1] if len(spec) > 1 and isinstance(spec[1], dict) else {}
    if "default" in opts:
        return opts["default"] == value
    keys = [o.get("key") for o in opts.get("options", []) if isinstance(o, dict)]
    return _type_name(spec[0]) == "COMFY_DYNAMICCOMBO_V3" and keys[:1] == [value]


def comparable(api: dict, twin: dict, input_types) -> tuple:
    """``(api, twin)`` reduced to what this ComfyUI reads, for comparing a converted or queued
    prompt with its API twin: inputs this ComfyUI's class lacks are dropped from both (the twin's
    "format.codec" on 0.29), and an optional input at its default that only one side has (0.29's
    CreateVideo ``bit_depth`` filled in by a converter; 0.33's hidden SaveVideo ``codec``).
    ``input_types``: class_type -> ``INPUT_TYPES()`` (or object_info's ``input``)."""
    out_api, out_twin = {}, {}
    for nid in set(api) | set(twin):
        a, t = api.get(nid), twin.get(nid)
        if a is None or t is None or a["class_type"] != t["class_type"]:
            out_api[nid], out_twin[nid] = a, t
            continue
        specs = input_specs(input_types(a["class_type"]))

        def keep(name, value, other):
            return name in specs and (name in other or not _optional_default(specs.get(name), value))

        out_api[nid] = {**a, "inputs": {k: v for k, v in a["inputs"].items() if keep(k, v, t["inputs"])}}
        out_twin[nid] = {**t, "inputs": {k: v for k, v in t["inputs"].items() if keep(k, v, a["inputs"])}}
    return out_api, out_twin


def object_info_types(object_info: dict):
    """``comparable``'s ``input_types`` from a server's /object_info."""
    return lambda class_type: object_info[class_type]["input"]


def model_files(ui: dict) -> list:
    """``[(directory, name)]`` from the loaders' ``properties.models`` (what the frontend offers to download)."""
    out = []
    for node in ui["nodes"]:
        for m in node.get("properties", {}).get("models", []) or []:
            out.append((m["directory"], m["name"]))
    return out


def write_or_check(files: dict, argv, what: str) -> int:
    """A generator's ending: with ``--check`` list the committed files that differ from ``files``
    ({path: text}) and return 1 if any; else write them all. ``what`` names them in the message."""
    if "--check" in argv:
        stale = [str(p) for p, text in files.items() if not p.exists() or p.read_text() != text]
        print("\n".join(stale) or f"{what} up to date")
        return 1 if stale else 0
    for path, text in files.items():
        path.write_text(text)
        print("wrote", path)
    return 0
