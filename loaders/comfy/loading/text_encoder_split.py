"""A text encoder over several devices in ComfyUI: its layer lists split by free memory.

Used when ``device`` is a list (``cuda:0,cuda:1``, ``cpu,cpu``, ``cuda:0,cpu``) or when ``auto``
finds no single device for the whole encoder (Gemma 3 12B, Qwen3-VL 32B on 12-24 GiB cards).
The layers are every ``layers`` ModuleList of the encoder (Gemma's, Qwen's, CLIP's); the rest
(embeddings, norms, projections) lives on the first device, "home", where ComfyUI's encoder code
puts the tokens. The split is ``parallel.placement.layer_split`` (the DiT blocks' rules) and runs
through ``parallel.blocks.layer_devices`` (each layer where its weights are).

ComfyUI holds the encoder as a CPU model (``load_device`` and ``offload_device`` ``cpu``): its
loader moves the encoder there whenever it loads it, and an ``ON_LOAD`` callback of the patcher
then puts each layer and home back on their devices; unloading moves everything to the CPU, which
frees the GPUs. Tokens are embedded on home (``run_tokens_on``), not on the load device. ComfyUI's memory manager does not see the GPU parts (they read as used memory in
the next plan's free-VRAM inventory). Core picks the same weight dtype for a CPU and a GPU text
encoder (``text_encoder_dtype``), so loading it as a CPU model first changes no number.
"""
from __future__ import annotations

import logging

import comfy.patcher_extension
import torch

from ....parallel.blocks.layer_devices import place_layers
from ....parallel.placement.devices import (
    DevicePlan,
    check_devices_exist,
    parse_component_device,
    parse_device_plan,
)
from ....parallel.placement.inventory import Inventory, read_inventory
from ....parallel.placement.layer_split import LayerSplit, plan_layer_split
from ....parallel.placement.plan_text import PlacementError
from ....parallel.placement.planner import plan_placement
from ....parallel.placement.plan_types import PlacementRequest
from ..core.component_placement import footprint_and_request, placed
from ....parallel.errors import InputError, reason_of

log = logging.getLogger("sharddit")

CALLBACK_KEY = "sharddit_text_encoder_split"

__all__ = ["apply_split", "check_text_encoder_device", "encoder_devices", "encoder_layers", "is_device_list", "plan_encoder_split",
           "run_tokens_on", "sizes", "split_loaded"]


TE_DEVICE_FORM = ("'auto', 'cpu' or 'cuda:N', or a list to split the encoder's layers over "
                  "(e.g. 'cuda:0,cuda:1', 'cuda:0,cpu', 'cpu,cpu')")


def is_device_list(device: str) -> bool:
    return isinstance(device, str) and "," in device


def check_text_encoder_device(device: str, inventory: Inventory | None = None) -> None:
    """Cheap checks of a text encoder's ``device`` input: a single device or a list, each existing.
    ValueError naming the value and what is accepted."""
    if not is_device_list(device):
        try:
            chosen = parse_component_device(device)
        except ValueError:
            raise InputError(f"device {device!r} is not valid; accepted: {TE_DEVICE_FORM}") from None
        listed = [] if chosen == "auto" else [chosen]
    else:
        listed = [e.device for e in encoder_devices(device).entries]
    if listed:
        inventory = inventory if inventory is not None else read_inventory()
        names = inventory.names if "cpu" in inventory.names else inventory.names + ("cpu",)
        check_devices_exist(listed, names, inventory.hidden_note)


LAYER_LISTS = ("layers", "block")  # Llama/Gemma/Qwen and CLIP: ``layers``; T5 and umT5: ``block``


def encoder_layers(module: torch.nn.Module) -> list[torch.nn.Module]:
    """Every layer of every ``layers`` / ``block`` ModuleList in ``module``, in module order, but
    a vision tower's (Gemma 3's ``vision_model``, Qwen-VL's ``visual``: not run for a text prompt,
    they stay home)."""
    layers = []
    for name, sub in module.named_modules():
        parts = name.split(".")
        if (isinstance(sub, torch.nn.ModuleList) and parts[-1] in LAYER_LISTS
                and not any(word in p for p in parts for word in ("vision", "visual"))):
            layers += list(sub)
    return layers


def _bytes(module: torch.nn.Module) -> int:
    return sum(t.numel() * t.element_size() for t in list(module.parameters()) + list(module.buffers()))


def rooms_for_encoder(inventory: Inventory, reserve_vram_gb: float) -> dict[str, int]:
    """Bytes each device may take for the encoder: free + held - reserve - what the plan already
    puts there (the DiT and the VAE ShardDiT placed, as ``component_placement`` pins them; with no DiT
    loaded yet, only the VAE)."""
    state = placed()
    if "dit" in state:
        footprint, request = footprint_and_request("text_encoder", 0, "auto", reserve_vram_gb, state)
        plan = plan_placement(inventory, footprint, request)
        loads = {load.device: load.weight_bytes + load.activation_bytes for load in plan.loads}
    else:
        loads = {state["vae"]["device"]: state["vae"]["bytes"]} if "vae" in state else {}
    reserve = PlacementRequest(reserve_vram_gb=reserve_vram_gb).reserve_bytes
    rooms = {g.device: g.available_bytes - reserve - loads.get(g.device, 0) for g in inventory.gpus}
    cpu = inventory.cpu
    if cpu is not None and cpu.total_bytes > 0:
        rooms["cpu"] = cpu.available_bytes - loads.get("cpu", 0)
    return rooms


def encoder_devices(device: str) -> DevicePlan:
    """A text encoder's ``device`` list (``'cuda:0,cpu'``) parsed once: this machine's devices only
    (ValueError naming the value and what a text encoder accepts)."""
    try:
        return parse_device_plan(device, workers=False)
    except ValueError as e:
        raise InputError(f"{reason_of(e)}; for a text encoder: {TE_DEVICE_FORM}") from None


def plan_encoder_split(layer_bytes, home_bytes: int, device: DevicePlan, inventory: Inventory,
                       reserve_vram_gb: float) -> LayerSplit:
    """The split for an encoder of these sizes on ``device`` (a list, or ``auto``)."""
    return plan_layer_split(layer_bytes, home_bytes, rooms_for_encoder(inventory, reserve_vram_gb), device)


def split_loaded(clip, device: str, inventory: Inventory, reserve_vram_gb: float) -> tuple[LayerSplit, int] | None:
    """Split ``clip`` (loaded as a CPU model) over ``device`` (a list, or ``auto``): (the split,
    bytes it leaves on the CPU), or None where ``auto`` keeps it whole on the CPU (no layer list,
    no GPU takes a layer, no room)."""
    explicit = is_device_list(device)
    layer_bytes, home_bytes = sizes(clip)
    if not layer_bytes:
        if explicit:
            raise InputError(f"this text encoder has no layer list to split (no 'layers' or 'block' "
                             f"ModuleList): give one device ('auto', 'cpu' or 'cuda:N') instead of {device!r}.")
        return None
    try:
        listed = encoder_devices(device) if explicit else DevicePlan(auto=True)
        split = plan_encoder_split(layer_bytes, home_bytes, listed, inventory, reserve_vram_gb)
    except PlacementError:
        if explicit:
            raise
        return None
    if not explicit and split.devices == ("cpu",):
        return None
    apply_split(clip, split)
    on_cpu = sum(b for b, d in zip(layer_bytes, split.layer_devices()) if d == "cpu")
    return split, on_cpu + (home_bytes if split.home == "cpu" else 0)


def apply_split(clip, split: LayerSplit) -> None:
    """Put ``clip``'s layers and home where ``split`` says, now and after every ComfyUI load."""
    model = clip.patcher.model
    layers = encoder_layers(model)
    devices = split.layer_devices()
    if len(devices) != len(layers):
        raise AssertionError(f"split of {len(devices)} layers for an encoder of {len(layers)}")

    def place(*_args) -> None:
        place_layers(layers, devices)
        _move_home(model, {id(layer) for layer in layers}, torch.device(split.home))

    place()
    clip.patcher.add_callback_with_key(comfy.patcher_extension.CallbacksMP.ON_LOAD, CALLBACK_KEY, place)
    run_tokens_on(model, torch.device(split.home))


def run_tokens_on(model: torch.nn.Module, device: torch.device) -> None:
    """Make ``model`` (a CLIP's ``cond_stage_model``) embed its tokens on ``device``: core's encode
    sets the execution device to the patcher's load device (the CPU for a split encoder), which
    would embed on the CPU and send every layer's hidden states through it. Only this instance's
    ``set_clip_options`` is wrapped (idempotent)."""
    original = getattr(model.set_clip_options, "__wrapped__", model.set_clip_options)

    def set_clip_options(options):
        if options.get("execution_device") is not None:
            options = {**options, "execution_device": device}
        return original(options)

    set_clip_options.__wrapped__ = original
    model.set_clip_options = set_clip_options


def sizes(clip) -> tuple[list[int], int]:
    """(bytes of each layer, bytes of the rest) of a loaded CLIP."""
    model = clip.patcher.model
    layer_bytes = [_bytes(layer) for layer in encoder_layers(model)]
    return layer_bytes, _bytes(model) - sum(layer_bytes)


def _move_home(module: torch.nn.Module, layer_ids: set, device: torch.device) -> None:
    """Move everything of ``module`` that is not one of the layers to ``device``."""
    if not any(id(m) in layer_ids for m in module.modules()):
        module.to(device)
        return
    for tensors in (module._parameters, module._buffers):
        for t in tensors.values():
            if t is not None and t.device != device:
                t.data = t.data.to(device)
    for child in module.children():
        if id(child) not in layer_ids:
            _move_home(child, layer_ids, device)
