"""A sharded MODEL that ComfyUI's own memory manager loads honestly, one shard per device: step 3
of a sharding call (``pipeline``), which builds the shards a ``mode_decision.ShardPlan`` places.

How it plugs into ComfyUI 0.3.64 (no patching of ``comfy.model_management``):

- The main ``ModelPatcher`` (a clone of the incoming MODEL) keeps everything but the transformer
  blocks. ``add_object_patch("diffusion_model.<blocks>", proxies)`` swaps each block list for
  lightweight proxies that do not register the real blocks as submodules, so while the main
  patcher is patched in, ComfyUI neither loads nor counts the block weights with it. Its ``size``
  is set to the non-block bytes.
- Each planned device gets a ``ShardRoot`` module holding that device's real blocks under their
  original key names (``diffusion_model.blocks.N.*``) wrapped in its own
  ``ModelPatcher(load_device=that device)``; the shards are registered with
  ``set_additional_models``, so ``load_models_gpu`` loads each on its device with that device's
  accounting and lowvram fallback. The DiT never lands whole on one GPU.
- Under ComfyUI's dynamic VRAM (core 0.16+) the main and every shard are non-dynamic patchers over
  the same weights, each built by its class's constructor (``dynamic_vram`` says why).
- Weight patches (LoRA, ...) keep ComfyUI's key space: a ``PREPARE_SAMPLING`` wrapper copies the
  main patcher's patches for ``diffusion_model.<blocks>.N.*`` onto the shard holding block N just
  before ComfyUI loads the models, so patches added after sharding are followed too.
- A ``DIFFUSION_MODEL`` wrapper opens one routing scope per forward (constants copied once per
  device, cache released even when the forward raises, e.g. on interrupt).
- An ``ON_DETACH`` callback releases the shards when ComfyUI fully unloads the main patcher
  (``unload_all_models`` / ``POST /free`` only free the default device themselves).

Alternatives rejected: an ``ON_LOAD`` callback that moves blocks after load lands the whole model
on one GPU first and leaves ComfyUI's accounting wrong; a ModelPatcher subclass depends on
private internals that change between releases.
"""
from __future__ import annotations

import functools
import logging

import torch

import comfy.model_management as mm
from comfy.patcher_extension import CallbacksMP, WrappersMP

from ....parallel.blocks.routing import BlockRouter
from ....parallel.blocks.sharding import build_block_proxies
from ....parallel.sequence.engine import attach_sequence_engine
from ....parallel.placement.devices import DevicePlan
from .compile_guard import check_no_block_object_patches
from ..core.multigpu import check_incoming, refuse_full_copies
from ..remote.host_workers import attach_workers, decide_worker_weights, patch_versions
from ..core.dynamic_vram import new_shard_patcher, non_dynamic_clone
from .memory_report import MEMORY_KEY, MODE_KEY, REQUESTED_KEY, sequence_memory_wrapper
from .resident_budgets import drop_resident_wrapper
from .sequence_shares import describe_shares, rank_speeds
from ..core.component_placement import record_dit
from .hooks import (ATTACHMENT_KEY, SHARD_KEY, ShardRootEntry, ShardRuntime, ShardState, get_shard_state, keep_state,
                    prepare_sampling_wrapper, release_shards_on_detach, sync_shard_patches)
from .step_values import Devices, ModeChoice, ShardPlan, ShardRequest, Shards
from ..remote.worker_blocks import describer

log = logging.getLogger("sharddit")

__all__ = ["ShardRoot", "get_or_build_shards"]

class ShardRoot(torch.nn.Module):
    """One device's blocks, named exactly as in the full model (``diffusion_model.blocks.N``)."""

    sharddit_component = "dit_shard"  # how ShardDiT recognises its own loaded models

    def __init__(self, blocks_by_list: dict[str, dict[int, torch.nn.Module]], dtype: torch.dtype):
        super().__init__()
        self.diffusion_model = torch.nn.Module()
        for path, blocks in blocks_by_list.items():
            assert "." not in path, f"nested block list path {path!r} not supported"
            self.diffusion_model.add_module(path, torch.nn.ModuleDict({str(i): b for i, b in blocks.items()}))
        self._dtype = dtype
        self.device = None

    def get_dtype(self) -> torch.dtype:
        return self._dtype


def get_or_build_shards(request: ShardRequest, where: Devices, choice: ModeChoice) -> Shards:
    """Step 3 of a sharding call: the sharded clone of ``request.model`` for ``where``. The shard
    state the mode was decided from is reused (a clone of a MODEL already sharded so, or the state
    cached on its weights); a fresh plan is built here. ``request.model`` is not mutated."""
    model, facts = request.model, choice.facts
    existing = get_shard_state(model)
    if facts is existing:
        return Shards(model.clone(), existing)
    check_incoming(model, facts.plan.home_device)  # core's multi-GPU nodes (core_multigpu)
    # dynamic VRAM (core 0.16+): every patcher of a sharded MODEL is non-dynamic (dynamic_vram.py)
    base = _unshard(model) if existing is not None else non_dynamic_clone(model)
    check_no_block_object_patches(base, facts.layout.block_lists)
    state = keep_state(base, _build_state(base, where, facts)) if isinstance(facts, ShardPlan) else facts
    return Shards(_sharded_clone(base, state), state)


def _unshard(model):
    """A clone of a sharded model with ShardDiT's patches, shards, wrappers and callbacks removed
    (its refusal of core's full copies is replaced when the clone is sharded again)."""
    state = get_shard_state(model)
    m = model.clone()
    for path in state.proxies:
        m.object_patches.pop(f"diffusion_model.{path}", None)
    m.remove_additional_models(SHARD_KEY)
    m.remove_wrappers_with_key(WrappersMP.DIFFUSION_MODEL, ATTACHMENT_KEY)
    m.remove_wrappers_with_key(WrappersMP.PREPARE_SAMPLING, ATTACHMENT_KEY)
    m.remove_callbacks_with_key(CallbacksMP.ON_DETACH, ATTACHMENT_KEY)
    m.remove_attachments(ATTACHMENT_KEY)
    m.remove_attachments(MODE_KEY)
    m.remove_attachments(REQUESTED_KEY)
    m.remove_wrappers_with_key(WrappersMP.PREPARE_SAMPLING, MEMORY_KEY)
    m.remove_wrappers_with_key(WrappersMP.OUTER_SAMPLE, MEMORY_KEY)
    m.load_device = mm.get_torch_device()
    m.size = model.size + sum(mm.module_size(e.root) for e in state.roots)
    return m


def _build_state(base, where: Devices, planned: ShardPlan) -> ShardState:
    plan, blocks, block_bytes, remote = planned.plan, planned.blocks, planned.block_bytes, where.remote
    n_local = len(plan.block_ranges) - len(remote)
    keep_all = decide_worker_weights(where.devices, remote, plan, block_bytes, n_local) if remote else False
    record_dit(planned.footprint, DevicePlan.of_devices(r.device for r in plan.block_ranges))
    dit = base.get_model_object("diffusion_model")
    log.info("[ShardDiT] %s: %d blocks sharded over %r\n%s", type(dit).__name__, len(block_bytes), where.local,
             plan.to_text(planned.inventory))
    block_devices = [torch.device(d) for d in plan.block_devices()]
    assert len(block_devices) == len(blocks), f"plan covers {len(block_devices)} of {len(blocks)} blocks"
    home = torch.device(plan.home_device)
    router = BlockRouter(planned.layout, home)
    proxies = {}
    for path in planned.layout.block_lists:
        idx = [g for g, (p, _, _) in enumerate(blocks) if p == path]
        proxies[path] = torch.nn.ModuleList(
            build_block_proxies([blocks[g][2] for g in idx], [block_devices[g] for g in idx], home, router,
                                global_indices=idx, block_list=path))
    roots = tuple(_build_roots(blocks, plan, base.model_dtype(), base.offload_device, base))
    runtime = ShardRuntime()
    if planned.token_specs is not None:
        _attach_engine(base, dit, where, planned, router, proxies, runtime, keep_all)
    return ShardState(plan=plan, layout=planned.layout, router=router, proxies=proxies, roots=roots,
                      request_key=where.request_key, runtime=runtime, auto_mode=planned.auto_mode,
                      arch_name=planned.arch_name, remote=remote, blocks_only=planned.blocks_only,
                      footprint=planned.footprint, block_kinds=planned.block_kinds,
                      sequence_refusal=planned.sequence_refusal)


def _attach_engine(base, dit, where: Devices, planned: ShardPlan, router, proxies, runtime, keep_all) -> None:
    """The sequence engine over the plan's ranks; worker ranks (``where.remote``) join it last."""
    plan, blocks, remote = planned.plan, planned.blocks, where.remote
    ranks = [r.device for r in plan.block_ranges]  # a worker rank's host side is a proxy (its share: cpu)
    # The RAM-held share (a `cpu` entry) stays in ComfyUI's pageable tensors: GPU ranks stream it
    # through the ring's pinned bounce buffers (parallel/sequence/stream.py says why not pin it once:
    # ComfyUI's weight patches replace those tensors; pinning tens of GiB starves the host).
    engine = attach_sequence_engine(router, [p for pl in proxies.values() for p in pl], planned.token_specs, ranks,
                                    should_stop=mm.throw_exception_if_processing_interrupted,
                                    interrupt_exceptions=(mm.InterruptProcessingException,))
    speeds, why = rank_speeds(where.plan, ranks, planned.inventory, len(remote))
    engine.set_speeds(speeds)
    if speeds is not None:
        log.info("[ShardDiT] sequence shares of tokens and heads by %s: %s", why, describe_shares(ranks, speeds))
    if not remote:
        return
    n_local = len(plan.block_ranges) - len(remote)
    owners = {g: r for r, br in enumerate(plan.block_ranges) for g in range(br.start, br.stop)}
    keys = {g: f"diffusion_model.{path}.{i}." for g, (path, i, _) in enumerate(blocks)}
    paths = {g: f"{p}.{i}" for g, (p, i, _) in enumerate(blocks)}
    describe = describer(dit, base.model.model_config.unet_config, paths)  # workers build the blocks
    attach_workers(engine, where.devices, remote, n_local, owners, patch_versions(runtime, keys), keep_all, describe)
    log.info("[ShardDiT] worker shares%s: %s", " (every worker also keeps the others' blocks)" * keep_all, "; ".join(
        f"{name}/{dev} owns blocks {br.start}-{br.stop - 1} ({sum(planned.block_bytes[br.start:br.stop]) / 2**30:.2f} "
        "GiB, kept in this machine's RAM to send)" for (name, dev), br in zip(remote, plan.block_ranges[n_local:],
                                                                              strict=True)))


def _build_roots(blocks, plan, dtype, offload_device, base):
    """One ShardRoot and its template patcher per planned block range (a repeated device gets one
    shard per entry). Every shard patcher is a clone of its template and shares its weight backup,
    so the state can always restore the blocks' original weights, whichever clone patched them."""
    for r in plan.block_ranges:
        by_list: dict[str, dict[int, torch.nn.Module]] = {}
        for path, i, block in blocks[r.start:r.stop]:
            by_list.setdefault(path, {})[i] = block
        root = ShardRoot(by_list, dtype)
        root.sharddit_keys = frozenset(root.state_dict().keys())
        device = torch.device(r.device)
        yield ShardRootEntry(device, root, new_shard_patcher(base, root, device, offload_device))


def _sharded_clone(base, state: ShardState):
    m = base.clone()
    m.load_device = torch.device(state.plan.home_device)
    for path, proxies in state.proxies.items():
        m.add_object_patch(f"diffusion_model.{path}", proxies)
    # module_size reads state_dict(), which lists the blocks whether or not the proxies are in.
    m.size = mm.module_size(m.model) - sum(mm.module_size(e.root) for e in state.roots)
    shards = []
    for entry in state.roots:
        shards.append(entry.template.clone())
    m.set_additional_models(SHARD_KEY, shards)
    sync_shard_patches(m)
    m.set_attachments(ATTACHMENT_KEY, state)
    # the memory check first (outermost): it may refuse before ShardDiT's own wrapper unloads anything
    m.add_wrapper_with_key(WrappersMP.PREPARE_SAMPLING, MEMORY_KEY, sequence_memory_wrapper)
    m.add_wrapper_with_key(WrappersMP.PREPARE_SAMPLING, ATTACHMENT_KEY, prepare_sampling_wrapper)
    # resident blocks are a cache of one sampling run: dropped when it ends (loaders/comfy/shard/resident_budgets.py)
    m.add_wrapper_with_key(WrappersMP.OUTER_SAMPLE, MEMORY_KEY,
                           functools.partial(drop_resident_wrapper, lambda: getattr(state.router, "engine", None)))
    m.add_callback_with_key(CallbacksMP.ON_DETACH, ATTACHMENT_KEY, release_shards_on_detach)
    refuse_full_copies(m)  # core's multi-GPU nodes: no full copy of a sharded MODEL (core_multigpu)
    return m
