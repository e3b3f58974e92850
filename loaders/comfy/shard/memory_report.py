"""`sequence` memory where ComfyUI decides what to free, checked when the latent is known.

ComfyUI 0.3.64 and 0.29 decide in ``load_models_gpu``: per device they free
``sum(model_memory_required) * 1.1 + extra`` (``model_memory_required`` is the patcher's
``model_size()`` while it is not loaded, the part not yet loaded otherwise), then give each model a
weight budget of the free memory less ``minimum_memory_required`` (``BaseModel.memory_required`` of
the whole latent: more than a `sequence` rank's share of the activations). Nothing there sees the
ring of streamed blocks (``sequence/stream.BlockStream``: two buffers per block shape a rank streams,
alive until the model is released). So before ComfyUI loads (a ``PREPARE_SAMPLING`` wrapper, the
outermost), for a MODEL that runs `sequence`:

- each shard patcher's ``size`` becomes its weights plus its rank's ring (``cost/memory``): ComfyUI
  then frees room for the ring on that device before it loads, as it does for weights. In `blocks`
  mode the size is the weights again. (A loaded shard then reports the ring as "not yet loaded",
  so a later load frees that much again on its device: more than needed, never less.)
- an explicit ``parallel=sequence`` is checked against the latent's plan (weights, ring and the
  activations of its tokens, ``cost/memory.plan_sequence_memory``) at the smallest batch ComfyUI
  may run (cond alone); where it does not fit it is refused naming the GiB missing per device,
  before anything moves.
"""
from __future__ import annotations

import logging
import math
import os

import comfy.model_management as mm
import torch

from ....parallel.cost.memory import RankMemory, format_shortfalls, lean_pass_batch, plan_sequence_memory
from ....parallel.families import activation_variant, family_of, shape_of_unet
from ....parallel.units import GiB
from ....parallel.cost.mode import decide_parallel
from ..core.component_placement import current_inventory
from .resident_budgets import apply_resident_budgets
from .hooks import get_shard_patchers, get_shard_state
from ....parallel.errors import InputError

log = logging.getLogger("sharddit")

__all__ = ["MEMORY_KEY", "MODE_KEY", "REQUESTED_KEY", "block_kinds", "latent_plan", "sequence_memory_wrapper", "sequence_refusal"]

MEMORY_KEY = "sharddit_memory"
MODE_KEY = "sharddit_parallel"
"""Attachment: the ``ModeDecision`` the mode was attached with (``attach_mode.attach_mode``)."""
LEAN_ENV = "SHARDDIT_SEQUENCE_LEAN"
REQUESTED_KEY = "sharddit_parallel_requested"
"""Attachment: the ``parallel`` the user asked for (``auto``, ``blocks``, ``sequence``)."""


def block_kinds(blocks) -> tuple:
    """One shape key per block (global order) as the plan counts ring buffers: (block list, bytes)."""
    return tuple((path, nbytes) for (path, _, _), nbytes in blocks)


def sequence_refusal(plan, footprint, inventory, reserve_bytes: int, kinds) -> str:
    """Why an explicit ``parallel=sequence`` does not fit this plan at load ('' when it does): the
    same room check as ``auto`` (``cost/mode.decide_parallel``), kept on the shard state so
    that ``mode_decision.choose_mode`` raises it before any weight moves."""
    try:
        decide_parallel("sequence", plan, footprint, inventory, reserve_bytes, kinds)
    except ValueError as err:
        return str(err)
    return ""


def sequence_memory_wrapper(executor, model, noise_shape, *args, **kwargs):
    """``PREPARE_SAMPLING`` wrapper (module doc); runs before ShardDiT's own load wrapper."""
    state = get_shard_state(model)
    decision = model.get_attachment(MODE_KEY)
    sequence = state is not None and decision is not None and decision.mode == "sequence" and not state.remote
    rows = latent_plan(model, state, noise_shape) if sequence else None
    if rows is not None and model.get_attachment(REQUESTED_KEY) == "sequence":
        _check_fits(state, rows, noise_shape)
    if state is not None:
        state.runtime.lean_pass_batch = _lean(model, state, noise_shape, rows) if rows is not None else None
    _count_rings(model, rows)
    out = executor(model, noise_shape, *args, **kwargs)
    engine = getattr(state.router, "engine", None) if rows is not None else None
    if engine is not None:  # the models are loaded now: the free memory left decides the resident blocks
        apply_resident_budgets(engine, rows, current_inventory(), int(state.request_key[1] * GiB),
                               get_shard_patchers(model))
    return out


def latent_plan(model, state, noise_shape, cfg_batch: bool = False) -> list[RankMemory] | None:
    """The plan per rank for one DiT call on a latent of ``noise_shape`` (cond alone; cond + uncond
    with ``cfg_batch``); None where the cost model has no shape for this model."""
    config = getattr(model.model, "model_config", None)
    unet = dict(getattr(config, "unet_config", {}) or {})
    try:
        family = family_of(unet, type(config).__name__)
        shape = shape_of_unet(type(config).__name__, unet)
    except (ValueError, KeyError, TypeError):
        return None
    if len(noise_shape) != 5 or state.footprint is None:
        return None
    b, _, t, h, w = (int(v) for v in noise_shape)
    pt, ph, pw = shape.patch
    tokens = math.ceil(t / pt) * math.ceil(h / ph) * math.ceil(w / pw)
    dtype = getattr(model.model, "manual_cast_dtype", None) or model.model_dtype()
    plan, fp = state.plan, state.footprint
    # the model's last block (HunyuanVideo 1.5 has no single blocks: its last list is empty)
    last = [p for path in state.layout.block_lists for p in state.proxies[path]][-1].real_block
    engine = getattr(state.router, "engine", None)
    specs = getattr(engine, "token_specs", None)  # lists run whole: no ring
    whole = [bool(specs and specs[i].whole) for i, path in enumerate(state.layout.block_lists)
             for _ in state.proxies[path]]
    return plan_sequence_memory(activation_variant(family, last), shape.width, tokens, b * (2 if cfg_batch else 1),
                                [r.device for r in plan.block_ranges], fp.block_bytes, plan.block_devices(),
                                plan.home_device, fp.dit_home_bytes, state.block_kinds, shape.text_tokens,
                                torch.empty((), dtype=dtype).element_size(), shape.heads, whole=whole,
                                speeds=getattr(engine, "speeds", None))


def _lean(model, state, noise_shape, rows) -> int | None:
    """The pass batch of lean `sequence` (``cost/memory.lean_pass_batch``): cond alone where cond and
    uncond together do not fit this latent on the GPUs; ``SHARDDIT_SEQUENCE_LEAN=1`` asks for it
    always (less memory, weights streamed once per pass). Logged once per sampling when chosen."""
    b = int(noise_shape[0])
    if os.environ.get(LEAN_ENV, "").strip() == "1":
        chosen, why = b, f"{LEAN_ENV}=1"
    else:
        inventory = current_inventory()
        reserve = int(float(state.request_key[1]) * GiB)
        usable = {d: inventory.get(d).available_bytes - reserve for d in inventory.names if d.startswith("cuda")}
        together = latent_plan(model, state, noise_shape, cfg_batch=True)
        chosen = lean_pass_batch(_per_device(together), _per_device(rows), usable, 2 * b, b) if together else None
        why = f"cond and uncond together do not fit: {format_shortfalls(_per_device(together), usable)}" \
            if chosen else ""
    if chosen:
        log.info("[ShardDiT] sequence lean at cfg > 1: cond, then uncond, each over every rank (%s)", why)
    return chosen


def _per_device(rows) -> list[RankMemory]:
    """Ranks sharing a device (``cuda:0,cuda:0``) added up: weights once, rings and activations each."""
    out: dict[str, RankMemory] = {}
    for r in rows:
        o = out.get(r.device)
        out[r.device] = r if o is None else RankMemory(r.device, o.weights, o.prefetch + r.prefetch,
                                                       o.activations + r.activations, o.resident + r.resident)
    return list(out.values())


def _check_fits(state, rows, noise_shape) -> None:
    inventory = current_inventory()
    reserve = int(float(state.request_key[1]) * GiB)
    usable = {d: inventory.get(d).available_bytes - reserve for d in inventory.names if d.startswith("cuda")}
    short = format_shortfalls(_per_device(rows), usable)
    if short:
        raise InputError(f"parallel 'sequence' does not fit latent {tuple(noise_shape)}: {short}. Fix: "
                         "parallel 'auto' or 'blocks', a smaller or shorter video, more devices, or a lower "
                         "reserve_vram_gb")


def _count_rings(model, rows) -> None:
    """Each shard's ``size``: its weights, plus its rank's ring when ``rows`` (sequence) are given.
    Shards and ranks are both in the plan's block-range order."""
    for i, shard in enumerate(get_shard_patchers(model)):
        ring = rows[i].prefetch if rows is not None and i < len(rows) else 0
        shard.size = mm.module_size(shard.model) + ring
