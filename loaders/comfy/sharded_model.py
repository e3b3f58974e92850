"""A sharded MODEL that ComfyUI's own memory manager loads honestly, one shard per device.

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

from ...parallel.placement.devices import split_worker_devices, with_worker_shares
from ...parallel.placement.plan_types import DEFAULT_DEVICES, DEFAULT_RESERVE_VRAM_GB
from ...parallel.placement.planner import Footprint, PlacementRequest, plan_placement
from ...parallel.cost.mode import DEFAULT_PARALLEL, ModeDecision, check_parallel, decide_parallel
from ...parallel.blocks.routing import BlockRouter
from ...parallel.sequence.engine import attach_sequence_engine
from ...parallel.blocks.sharding import build_block_proxies, get_block_list
from ...parallel.placement.sizing import compute_block_bytes, compute_non_block_bytes
from .auto_mode import AutoMode
from .compile_guard import check_no_block_object_patches, guarded_routing_scope
from .core_multigpu import check_no_core_copies, note_incoming_device, original_patcher_init, refuse_full_copies
from .dynamic_vram import new_shard_patcher, non_dynamic_clone
from .memory_report import MEMORY_KEY, REQUESTED_KEY, block_kinds, sequence_memory_wrapper, sequence_refusal
from .distributed import attach_workers, check_workers, decide_worker_weights, patch_versions, resolve_auto_devices
from .placement import current_inventory, record_dit
from .shard_hooks import (ATTACHMENT_KEY, SHARD_KEY, ShardRootEntry, ShardRuntime, ShardState, get_shard_patchers,
                          get_shard_state, is_sharded, prepare_sampling_wrapper, release_roots,
                          release_shards_on_detach, sync_shard_patches)
from .specs import find_arch_spec, get_arch_spec
from .worker_blocks import describer

log = logging.getLogger("sharddit")

__all__ = ["ShardRoot", "ShardState", "get_parallel_mode", "get_shard_patchers", "get_shard_state",
           "is_current_state", "is_sharded", "set_parallel_mode", "shard_model", "sync_shard_patches", "unshard"]

_CACHE_ATTR = "_sharddit_states"


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


def shard_model(model, devices: str = DEFAULT_DEVICES, reserve_vram_gb: float = DEFAULT_RESERVE_VRAM_GB,
                inventory=None, parallel: str = DEFAULT_PARALLEL):
    """Return a sharded clone of ``model`` (a ComfyUI ModelPatcher); ``model`` is not mutated.

    Everything that can fail on user input (unknown architecture, bad device string, a plan that
    does not fit) fails here, before any weight moves. ``parallel``: ``auto``, ``blocks`` or
    ``sequence`` (``parallel_mode``); the shards are the same for every mode.
    """
    devices = resolve_auto_devices(devices, check_parallel(parallel),
                                   functools.partial(_local_auto_devices, model, reserve_vram_gb, inventory),
                                   functools.partial(_blocks_only, model))
    _, remote = split_worker_devices(devices)
    if remote:
        if parallel == "blocks":
            raise ValueError(f"[ShardDiT] devices {devices!r} names worker devices: they run parallel=sequence "
                             "only (set parallel to 'sequence' or 'auto')")
        check_workers(devices, remote)
    request_key = (str(devices).strip(), float(reserve_vram_gb))
    existing = get_shard_state(model)
    if existing is not None and existing.request_key == request_key:
        return set_parallel_mode(model.clone(), parallel)
    # dynamic VRAM (core 0.16+): every patcher of a sharded MODEL is non-dynamic (dynamic_vram.py)
    check_no_core_copies(model)
    base = unshard(model) if existing is not None else non_dynamic_clone(model)
    check_no_block_object_patches(base, get_arch_spec(base.get_model_object("diffusion_model")).block_lists)
    state = _get_or_build_state(base, devices, reserve_vram_gb, inventory, request_key)
    note_incoming_device(model, state.plan.home_device)
    return set_parallel_mode(_sharded_clone(base, state), parallel)


MODE_KEY = "sharddit_parallel"


def set_parallel_mode(m, parallel: str):
    """Bind ``m`` (a sharded clone, changed in place) to a parallel mode; returns ``m``."""
    state = get_shard_state(m)
    decision = _decide(state, parallel)
    m.set_attachments(MODE_KEY, decision)
    m.set_attachments(REQUESTED_KEY, check_parallel(parallel))
    m.remove_wrappers_with_key(WrappersMP.DIFFUSION_MODEL, ATTACHMENT_KEY)
    mode = decision.mode
    if check_parallel(parallel) == "auto" and (decision.mode == "sequence" or _compares_core(state, decision)):
        # the cost model decides per latent (and names core's own options when as fast)
        home, shards = m.model_size(), get_shard_patchers(m)
        whole = home + sum(s.model_size() for s in shards) if shards else 0  # 0: no comparison with core
        mode = AutoMode(state, m.model.model_config, _weight_bytes(state), memory=decision, dit_bytes=whole,
                        home_bytes=home)
    m.add_wrapper_with_key(WrappersMP.DIFFUSION_MODEL, ATTACHMENT_KEY,
                           functools.partial(guarded_routing_scope, state, mode))
    log.info("[ShardDiT] parallel %s -> %s", parallel, decision.reason)
    return m


def _compares_core(state: ShardState, decision) -> bool:
    """``auto`` kept `blocks` by the memory rule over two or more GPUs: ``AutoMode`` keeps it and says
    when core's own options would be as fast (per latent)."""
    return decision is state.auto_mode and len({r.device for r in state.plan.block_ranges
                                                if r.device.startswith("cuda")}) > 1


def _weight_bytes(state: ShardState) -> float:
    """Bytes per weight as streamed (fp8 1, bf16 2), from the first block's largest tensor."""
    block = next((p.real_block for pl in state.proxies.values() for p in pl), None)
    tensors = list(block.parameters()) if block is not None else []
    return float(max(tensors, key=lambda t: t.numel()).element_size()) if tensors else 2.0


def get_parallel_mode(model) -> ModeDecision | None:
    return model.get_attachment(MODE_KEY)


def _decide(state: ShardState, parallel: str) -> ModeDecision:
    parallel = check_parallel(parallel)
    if state.remote and state.router.engine is not None and parallel in ("auto", "sequence"):
        return ModeDecision("sequence", f"sequence: ranks on workers {', '.join(n for n, _ in state.remote)}")
    if state.router.engine is None and parallel != "blocks":
        return ModeDecision("blocks", f"blocks: {state.blocks_only}")
    if parallel == "auto":
        return state.auto_mode
    if parallel == "sequence" and state.sequence_refusal:
        raise ValueError(state.sequence_refusal)  # at load: before any weight moves
    return decide_parallel(parallel, state.plan, None, None)


def is_current_state(model) -> bool:
    """Whether ``model``'s shard state is still the live one for its weights (not replaced by a
    re-shard with other devices, whose blocks were then regrouped)."""
    state = get_shard_state(model)
    cache = model.model.__dict__.get(_CACHE_ATTR, {})
    return state is not None and cache.get(state.request_key) is state


def unshard(model):
    """A clone of a sharded model with ShardDiT's patches, shards, wrappers and callbacks removed."""
    state = get_shard_state(model)
    m = model.clone()
    if state is None:
        return m
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
    m.load_device = mm.get_torch_device()
    if hasattr(m, "cached_patcher_init"):  # core 0.23+: the loader's factory again (see core_multigpu)
        m.cached_patcher_init = original_patcher_init(model)
    m.size = model.size + sum(mm.module_size(e.root) for e in state.roots)
    return m


def _get_or_build_state(base, devices, reserve_vram_gb, inventory, request_key) -> ShardState:
    """States are cached on the BaseModel so re-sharding the same weights reuses the same shard
    modules: ComfyUI then sees clones (``is_clone``) and never holds two copies of a block."""
    cache = base.model.__dict__.setdefault(_CACHE_ATTR, {})
    state = cache.get(request_key)
    if state is None:
        state = _build_state(base, devices, reserve_vram_gb, inventory, request_key)
        for old in cache.values():  # one live shard set per weights: the new one regroups the blocks
            release_roots(old)
        cache.clear()
        cache[request_key] = state
    return state


def _build_state(base, devices, reserve_vram_gb, inventory, request_key) -> ShardState:
    devices, remote = split_worker_devices(devices)
    dit = base.get_model_object("diffusion_model")
    layout = get_arch_spec(dit)
    block_bytes = compute_block_bytes(dit, layout)
    non_block = compute_non_block_bytes(dit, layout)
    inventory = inventory if inventory is not None else current_inventory()
    footprint = _footprint(block_bytes, non_block)
    # with workers, each worker rank gets an equal share, kept here in RAM (a `cpu` entry) to send
    request = PlacementRequest(devices=with_worker_shares(devices, len(remote)), reserve_vram_gb=reserve_vram_gb)
    plan = plan_placement(inventory, footprint, request)
    n_local = len(plan.block_ranges) - len(remote)
    keep_all = decide_worker_weights(request_key[0], remote, plan, block_bytes, n_local) if remote else False
    blocks = [(path, i, b) for path in layout.block_lists for i, b in enumerate(_real_blocks(base, dit, path))]
    kinds = block_kinds(zip(blocks, block_bytes, strict=True))
    auto_mode = decide_parallel("auto", plan, footprint, inventory, request.reserve_bytes, kinds)
    refusal = sequence_refusal(plan, footprint, inventory, request.reserve_bytes, kinds)
    record_dit(footprint, ",".join(r.device for r in plan.block_ranges))
    log.info("[ShardDiT] %s: %d blocks sharded over %r\n%s", type(dit).__name__, len(block_bytes), devices,
             plan.to_text(inventory))

    block_devices = [torch.device(d) for d in plan.block_devices()]
    assert len(block_devices) == len(blocks), f"plan covers {len(block_devices)} of {len(blocks)} blocks"
    home = torch.device(plan.home_device)
    router = BlockRouter(layout, home)
    proxies = {}
    for path in layout.block_lists:
        idx = [g for g, (p, _, _) in enumerate(blocks) if p == path]
        proxies[path] = torch.nn.ModuleList(
            build_block_proxies([blocks[g][2] for g in idx], [block_devices[g] for g in idx], home, router,
                                global_indices=idx, block_list=path))
    roots = tuple(_build_roots(blocks, plan, base.model_dtype(), base.offload_device, base))
    arch = find_arch_spec(type(dit).__name__)
    token_specs, blocks_only = arch.sequence_specs(dit)
    if remote and token_specs is None:
        raise ValueError(f"[ShardDiT] {blocks_only}; worker devices in {request_key[0]!r} "
                         "need sequence mode: use this machine's devices only")
    if token_specs is None and arch.token_specs is not None:  # sequence refused for this model: say why
        log.warning("[ShardDiT] %s", blocks_only)
    runtime = ShardRuntime()
    if token_specs is not None:
        ranks = [r.device for r in plan.block_ranges]  # a worker rank's host side is a proxy (its share: cpu)
        # The RAM-held share (a `cpu` entry) stays in ComfyUI's pageable tensors: GPU ranks stream it
        # through the ring's pinned bounce buffers (parallel/sequence/stream.py says why not pin it once:
        # ComfyUI's weight patches replace those tensors; pinning tens of GiB starves the host).
        engine = attach_sequence_engine(router, [p for pl in proxies.values() for p in pl], token_specs, ranks)
        engine.should_stop = mm.throw_exception_if_processing_interrupted
        engine.interrupt_exceptions = (mm.InterruptProcessingException,)
        if remote:
            owners = {g: r for r, br in enumerate(plan.block_ranges) for g in range(br.start, br.stop)}
            keys = {g: f"diffusion_model.{path}.{i}." for g, (path, i, _) in enumerate(blocks)}
            paths = {g: f"{p}.{i}" for g, (p, i, _) in enumerate(blocks)}
            describe = describer(dit, base.model.model_config.unet_config, paths)  # workers build the blocks
            attach_workers(engine, request_key[0], remote, n_local, owners, patch_versions(runtime, keys), keep_all,
                           describe)
            log.info("[ShardDiT] worker shares%s: %s", " (every worker also keeps the others' blocks)" * keep_all,
                     "; ".join(
                f"{name}/{dev} owns blocks {br.start}-{br.stop - 1} ({sum(block_bytes[br.start:br.stop]) / 2**30:.2f} "
                "GiB, kept in this machine's RAM to send)" for (name, dev), br in zip(remote, plan.block_ranges[n_local:],
                                                                                      strict=True)))
    return ShardState(plan=plan, layout=layout, router=router, proxies=proxies, roots=roots,
                      request_key=request_key, runtime=runtime, auto_mode=auto_mode, arch_name=arch.name,
                      remote=remote, blocks_only=blocks_only, footprint=footprint, block_kinds=kinds,
                      sequence_refusal=refusal)


def _footprint(block_bytes, non_block: int) -> Footprint:
    return Footprint(block_bytes=tuple(block_bytes), dit_home_bytes=non_block,
                     dit_activation_bytes=_activation_headroom(block_bytes))


def _blocks_only(model) -> str:
    """Why ``model`` runs in blocks mode only ('' when sequence mode splits its architecture)."""
    dit = model.get_model_object("diffusion_model")
    return find_arch_spec(type(dit).__name__).sequence_specs(dit)[1]


def _local_auto_devices(model, reserve_vram_gb, inventory) -> str:
    """This machine's ``devices=auto`` choice as an explicit list: the planner's block-range
    devices, each once in order (``"cuda:0,cuda:1"``, ``"cpu"`` without a GPU)."""
    dit = model.get_model_object("diffusion_model")
    layout = get_arch_spec(dit)
    fp = _footprint(compute_block_bytes(dit, layout), compute_non_block_bytes(dit, layout))
    inventory = inventory if inventory is not None else current_inventory()
    plan = plan_placement(inventory, fp, PlacementRequest(devices="auto", reserve_vram_gb=reserve_vram_gb))
    return ",".join(dict.fromkeys(r.device for r in plan.block_ranges))


def _activation_headroom(block_bytes) -> int:
    """Activation room planned per DiT device at load time, before any latent is known: a floor.

    Two blocks' worth of weights: for Wan 2.1 14B (0.67 GiB per bf16 block) that is 1.3 GiB, the
    order of one 480p x 81 frame forward (2.9 GiB per device at batch 1, measured on fake GPUs;
    see TESTING.md). The plan is keyed by devices and reserve, not by latent, so it cannot grow
    with the tokens here; where the latent is known (ComfyUI's prepare_sampling) a `sequence` MODEL
    is planned again from its tokens, heads and dtype (``memory_report.latent_plan``): an explicit
    ``sequence`` that does not fit is refused there, and each shard reports its ring to ComfyUI.
    Larger videos in `blocks` mode need ``reserve_vram_gb`` or the ``plan`` dry run.
    """
    return 2 * max(block_bytes, default=0)


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
    m.add_callback_with_key(CallbacksMP.ON_DETACH, ATTACHMENT_KEY, release_shards_on_detach)
    refuse_full_copies(m)  # core's multi-GPU nodes: no full copy of a sharded MODEL (core_multigpu)
    return m


def _real_blocks(base, dit, path: str):
    """The real block list, even while a sharded clone has its proxies patched into the model."""
    backup = base.object_patches_backup.get(f"diffusion_model.{path}")
    return backup if backup is not None else get_block_list(dit, path)
