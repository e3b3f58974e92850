"""Predicted seconds per sampling step for each way of running a DiT on N GPUs (pure, no torch).

Every formula is written once, here. Units: FLOP, FLOP/s, bytes, bytes/s, seconds.
Shapes, GPU throughput and link bandwidth come from ``cost/inputs``.

Per block, on one device:
- compute  = FLOPs / device FLOP/s, with FLOPs = linear + attention:
  linear    = 2 × (image tokens on the device × image params + text tokens × text params)
  attention = 4 × L_attn² × width × (heads on the device / heads)   (self; L_attn = image
              tokens, + text tokens where text joins it) + 4 × device tokens × text tokens × width
              (cross-attention to text, Wan / LTXV)
- exchange = Ulysses all-to-all of q, k, v and output inside a group of g devices:
  4 × (g-1)/g × tokens/g × width × activation bytes, / link (3/4 of it q, k, v; 1/4 the output),
  + ``TRANSFER_LATENCY_S`` per transfer. The engine pipelines it by head chunks
  (``sequence/ulysses``: C = ``split.head_chunks``, ``PIPELINE_CHUNKS`` at most; 1 where
  ``pipelined`` is False: worker processes): each chunk's q/k/v and output is one transfer of 1/C
  of the bytes, on an exchange stream, in ``split.pipeline_schedule``'s order, while the compute
  stream runs each chunk's attention (self-attention FLOPs / C, below). ``exposed_exchange``
  replays that order with those durations: the exchange exposed is what the compute stream waits
  (the first chunk's q/k/v, and whatever of the rest does not fit behind the other chunks'
  attention); with C = 1 it is the whole exchange. Plus, for a block with an attention split by
  heads over whole queries (``BlockShape.gathered_kv_width``, the family's ``TokenSpec.gather_kv``:
  LTX-2's video->audio), the keys and values of the other devices' tokens for this device's heads:
  2 × (tokens - own tokens) × gathered width × own heads / heads × activation bytes, + 2 ×
  ``TRANSFER_LATENCY_S``, not chunked, so exposed whole (its second all-to-all, the whole queries'
  output rows, is a few hundred audio rows: left out)
- stream   = block weight bytes / link, for a block the device does not own and does not keep
  resident (``cost/resident``; prefetched a block ahead, so it hides behind compute). The link
  carries the streamed weights and the whole exchange; the compute stream waits only for the
  exposed exchange: block time = max(compute + exposed exchange, stream + exchange) (with C = 1:
  max(compute, stream) + exchange). Resident blocks are priced after the first step, which copies
  them once: a device with every block resident streams 0 bytes per step.
Per step (one sampler iteration: batch 1 at cfg 1, cond + uncond = 2 at cfg > 1):
- ``one_gpu``: every block on the first device, whole batch. Also the speed-up baseline: a
  hypothetical single GPU of the first device's kind even where the model does not fit on it.
- ``blocks``: each block on its owner, whole batch, one GPU busy at a time; the hidden state hops
  at the N-1 boundaries and back home (N hops, not overlapped).
- ``sequence``: batch split first into device groups (cfg > 1), tokens inside a group; devices of
  a group wait for each other at every exchange; plus scattering / gathering the hidden state
  from the home device once per step.
Not modelled: embeddings and the head (< 1 % of FLOPs), per-step Python/sampler overhead, VAE
and text encoder, lower efficiency of smaller per-device matmuls, link contention between pairs.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

from ..sequence.split import (
    PIPELINE_CHUNKS,
    even_ranges,
    head_chunks,
    pipeline_schedule,
    share_ranges,
)
from .inputs import (
    DEFAULT_HOST_LINK_GBPS,
    EFFICIENCY,
    GPU_PEAK_TFLOPS,
    BlockShape,
    ModelShape,
    gpu_flops,
    link_bandwidth,
    normalize_gpu_name,
)
from ..errors import InputError
from ..units import format_gib

__all__ = [
    "BASELINES",
    "STRATEGIES",
    "TRANSFER_LATENCY_S",
    "Hardware",
    "StrategyCost",
    "Workload",
    "block_flops",
    "block_shapes",
    "estimate_blocks",
    "estimate_core_cfg_split",
    "estimate_costs",
    "estimate_dynamic_vram",
    "estimate_one_gpu",
    "estimate_sequence",
    "estimate_sequence_lean",
    "exposed_exchange",
    "hardware_from_options",
]

TRANSFER_LATENCY_S = 50e-6
"""Fixed cost of one transfer (launch, event wait, host staging), seconds."""
STRATEGIES = ("one_gpu", "blocks", "sequence")
BASELINES = ("dynamic_vram", "core_cfg_split")
"""Core ComfyUI's own options on the same GPUs (``cost/baselines``): shown beside ShardDiT's modes,
never picked by ``auto``."""


@dataclass(frozen=True)
class Hardware:
    """The DiT devices of one run and the link between them."""

    flops: tuple[float, ...]
    """Effective FLOP/s of each device, in device order; the first is the one-GPU baseline."""
    link_bytes_per_s: float
    """Bandwidth of one device-to-device copy (P2P/NVLink, or staged through host memory)."""
    names: tuple[str, ...] = ()
    """Device names for the text (e.g. ``RTX 4090``)."""
    note: str = ""
    """Where the numbers come from (printed under the strategy rows)."""
    host_link_bytes_per_s: float = DEFAULT_HOST_LINK_GBPS * 1e9
    """Pinned host memory to the first device (weights streamed by dynamic VRAM)."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "flops", tuple(float(f) for f in self.flops))
        if not self.flops or min(self.flops) <= 0 or not all(map(math.isfinite, self.flops)):
            raise InputError(f"flops {self.flops} must be one positive FLOP/s per device: "
                             "pass a GPU name from the table or a measured throughput")
        if not (math.isfinite(self.link_bytes_per_s) and self.link_bytes_per_s > 0):
            raise InputError(f"link_bytes_per_s {self.link_bytes_per_s!r} must be > 0: pass e.g. --link-gbps 12")


@dataclass(frozen=True)
class Workload:
    """One sampling step's work: the model and the latent it runs on."""

    shape: ModelShape
    width: int
    height: int
    frames: int
    cfg: float = 1.0
    """Guidance scale; > 1 means cond + uncond every step (batch 2), which sequence mode splits."""
    weight_bytes: float = 2.0
    """Bytes per weight as stored and streamed (bf16 2, fp8 1)."""
    activation_bytes: int = 2
    """Bytes per activation element (bf16 / fp16 compute)."""

    def __post_init__(self) -> None:
        for name in ("cfg", "weight_bytes", "activation_bytes"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
                raise InputError(f"{name} {value!r} must be a number > 0 (cfg 1 = no uncond; bf16 weights 2 bytes, fp8 1)")
        self.shape.image_tokens(self.width, self.height, self.frames)  # checks the size

    @property
    def batch(self) -> int:
        return 2 if self.cfg > 1 else 1

    @property
    def tokens(self) -> int:
        return self.shape.image_tokens(self.width, self.height, self.frames)


@dataclass(frozen=True)
class StrategyCost:
    """Prediction for one strategy. Seconds are per step on the critical (slowest) path."""

    strategy: str
    seconds_per_step: float
    speedup: float
    """One-GPU seconds / these seconds (one GPU of the first device's kind, hypothetical if the
    model does not fit on it)."""
    compute_s: float
    exchange_s: float
    """Ulysses all-to-all on the critical path: what the pipelined exchange leaves exposed
    (``exposed_exchange``)."""
    stream_s: float
    """Weight streaming NOT hidden behind compute."""
    hop_s: float
    """Hidden-state hops (blocks) or scatter/gather from the home device (sequence)."""
    bytes_per_device: int
    """Most bytes any device receives per step (weights streamed + exchanges + hops)."""
    note: str = ""
    streamed_bytes: int = 0
    """Most block weight bytes any device streams per step (sequence; 0 where every block is
    resident, ``cost/resident``)."""


def hardware_from_options(gpus: str | Sequence[str], n_devices: int = 1, measured_tflops=None,
                          link_gbps=None) -> Hardware:
    """Hardware from ``--gpu NAME`` (one name for ``n_devices`` devices, or a name per device, e.g.
    NVML names), or from ``measured_tflops`` (effective TFLOPS of a timed matmul, one for all or one
    per device; names then only label), and ``--link-gbps`` (None: the PCIe 4.0 no-P2P default)."""
    names = (gpus,) * n_devices if isinstance(gpus, str) else tuple(gpus)
    if measured_tflops is None:
        flops = [gpu_flops(name) for name in names]
        source = (f"{flops[0] / 1e12:.0f} effective TFLOPS per {names[0]} "
                  f"({GPU_PEAK_TFLOPS[normalize_gpu_name(names[0])]:g} dense bf16 × {EFFICIENCY:g})")
    else:
        tflops = [measured_tflops] * len(names) if isinstance(measured_tflops, (int, float)) else list(measured_tflops)
        if len(tflops) != len(names) or not all(isinstance(t, (int, float)) and t > 0 for t in tflops):
            raise InputError(f"measured_tflops {measured_tflops!r} must be one number > 0 (effective TFLOPS "
                             f"from a timed matmul) or one per device ({len(names)})")
        flops, source = [t * 1e12 for t in tflops], f"measured {', '.join(f'{t:g}' for t in tflops)} TFLOPS"
    bw, link_note = link_bandwidth(link_gbps)
    return Hardware(tuple(flops), bw, names, f"{source}; {link_note}")


def block_flops(b: BlockShape, s: ModelShape, dev_tokens: int, tokens: int, dev_heads: int) -> float:
    """FLOPs of one block for one sample on a device holding ``dev_tokens`` and ``dev_heads``."""
    t = s.text_tokens
    linear = 2 * (dev_tokens * b.image_params + t * b.text_params)
    cross = 4 * dev_tokens * t * s.width if b.cross_attention else 0
    return linear + self_attention_flops(b, s, tokens, dev_heads) + cross


def self_attention_flops(b: BlockShape, s: ModelShape, tokens: int, dev_heads: int) -> float:
    """FLOPs of one block's self-attention for one sample on a device holding ``dev_heads`` (all
    tokens, with the text where it joins them): what the Ulysses exchange can hide behind."""
    attn_len = tokens + (s.text_tokens if b.joint_text else 0)
    return 4 * attn_len ** 2 * s.width * dev_heads / s.heads


def exposed_exchange(attention_s: float, qkv_s: float, out_s: float, chunks: int) -> float:
    """Seconds one block's compute stream waits for its Ulysses exchange, pipelined in ``chunks``
    head chunks as the engine runs it: ``split.pipeline_schedule``'s steps replayed on two queues,
    the compute stream (each chunk's attention, ``attention_s / chunks``, after its q/k/v arrived)
    and the exchange stream (each chunk's q/k/v, ``qkv_s / chunks + TRANSFER_LATENCY_S``, once the
    compute stream reached the point where it was posted; each chunk's output,
    ``out_s / chunks + TRANSFER_LATENCY_S``, after that chunk's attention), in the host order of the
    steps. The block's attention ends when both queues are done; the exposed exchange is that time
    less the attention. ``chunks`` 1: ``qkv_s + out_s + 2 × TRANSFER_LATENCY_S``, the whole exchange."""
    a, x_in = attention_s / chunks, qkv_s / chunks + TRANSFER_LATENCY_S
    x_out = out_s / chunks + TRANSFER_LATENCY_S
    compute = link = 0.0
    arrived = {}
    for step, c in pipeline_schedule(chunks):
        if step == "qkv":  # posted with the compute stream at ``compute``; copies after what is queued
            link = max(link, compute) + x_in
            arrived[c] = link
        elif step == "attend":
            compute = max(compute, arrived[c]) + a
        else:  # its output, after its attention
            link = max(link, compute) + x_out
    return max(compute, link) - attention_s


def block_shapes(shape: ModelShape) -> list[BlockShape]:
    return [b for b in shape.blocks for _ in range(b.count)]


def _owners(n_blocks: int, n_devices: int, owned) -> list[int]:
    """Device index of each block from blocks-per-device counts (even split by default)."""
    counts = list(owned) if owned is not None else [
        n_blocks // n_devices + (1 if i < n_blocks % n_devices else 0) for i in range(n_devices)]
    if len(counts) != n_devices or sum(counts) != n_blocks or min(counts) < 0:
        raise InputError(f"owned {counts} must give blocks per device for {n_devices} devices summing "
                         f"to {n_blocks}: pass the plan's block counts in device order")
    return [d for d, c in enumerate(counts) for _ in range(c)]


def estimate_one_gpu(work: Workload, hw: Hardware) -> StrategyCost:
    """Every block on the first device with the whole batch."""
    s, n = work.shape, work.tokens
    flops = work.batch * sum(block_flops(b, s, n, n, s.heads) for b in block_shapes(s))
    t = flops / hw.flops[0]
    return StrategyCost("one_gpu", t, 1.0, t, 0.0, 0.0, 0.0, 0)


def estimate_blocks(work: Workload, hw: Hardware, owned=None) -> StrategyCost:
    """Each block on its owner, one device busy at a time; N hidden-state hops per step."""
    s, n, blocks = work.shape, work.tokens, block_shapes(work.shape)
    owners = _owners(len(blocks), len(hw.flops), owned)
    compute = sum(work.batch * block_flops(b, s, n, n, s.heads) / hw.flops[o] for b, o in zip(blocks, owners))
    hop_tokens = n + (s.text_tokens if any(b.joint_text for b in blocks) else 0)
    hop_bytes = work.batch * hop_tokens * s.width * work.activation_bytes
    hops = len(set(owners)) if len(set(owners)) > 1 else 0
    hop_s = hops * (hop_bytes / hw.link_bytes_per_s + TRANSFER_LATENCY_S)
    base = estimate_one_gpu(work, hw).seconds_per_step
    t = compute + hop_s
    return StrategyCost("blocks", t, base / t, compute, 0.0, 0.0, hop_s, hop_bytes if hops else 0)


def _groups(n_devices: int, batch: int) -> list[list[int]]:
    """Split the batch first: ``batch`` groups of devices (as even as possible), else one group."""
    k = min(batch, n_devices)
    sizes = [n_devices // k + (1 if i < n_devices % k else 0) for i in range(k)]
    starts = [sum(sizes[:i]) for i in range(k)]
    return [list(range(a, a + z)) for a, z in zip(starts, sizes)]


def _group_step(work: Workload, hw: Hardware, group: list[int], samples: float, owners, replicas: bool,
                weighted: bool = False, resident=None, pipelined: bool = True):
    """(compute, exposed stream, exposed exchange, bytes received, weight bytes streamed, head
    chunks) per device group; ``weighted``: token and head shares proportional to the devices' throughputs (as the
    engine's ``set_speeds``), else even (the largest share decides); ``resident``: per device, the
    indices of the blocks it keeps (``cost/resident``: not streamed); ``pipelined``: the exchange
    in head chunks (``exposed_exchange``), else whole."""
    s, n, g = work.shape, work.tokens, len(group)
    if weighted and g > 1:
        shares = [hw.flops[d] for d in group]
        tok = {d: b - a for d, (a, b) in zip(group, share_ranges(n, g, shares), strict=True)}
        head_ranges = share_ranges(s.heads, g, shares)
        hds = {d: b - a for d, (a, b) in zip(group, head_ranges, strict=True)}
    else:  # even: every device as the one with the most
        tok, hds = dict.fromkeys(group, math.ceil(n / g)), dict.fromkeys(group, math.ceil(s.heads / g))
        head_ranges = even_ranges(s.heads, g)
    chunks = head_chunks(head_ranges, PIPELINE_CHUNKS) if pipelined and g > 1 else 1
    x_bytes = {d: samples * 4 * (g - 1) / g * tok[d] * s.width * work.activation_bytes for d in group}
    x_s = {d: x_bytes[d] / hw.link_bytes_per_s + 2 * TRANSFER_LATENCY_S if g > 1 else 0.0 for d in group}
    total = [0.0, 0.0, 0.0]
    received, streamed = dict.fromkeys(group, 0.0), dict.fromkeys(group, 0.0)
    kept = [frozenset(k) for k in resident] if resident is not None else [frozenset()] * len(hw.flops)
    for i, (b, owner) in enumerate(zip(block_shapes(s), owners)):
        w_bytes = b.weight_params * work.weight_bytes
        kv_bytes, kv_s = _gathered_kv(work, hw, b, tok, hds, samples)
        worst = (-1.0, 0.0, 0.0, 0.0)
        for d in group:
            compute = samples * block_flops(b, s, tok[d], n, hds[d]) / hw.flops[d]
            streams = not replicas and d != owner and i not in kept[d]
            stream = w_bytes / hw.link_bytes_per_s + TRANSFER_LATENCY_S if streams else 0.0
            received[d] += x_bytes[d] + kv_bytes[d] + (w_bytes if streams else 0)
            streamed[d] += w_bytes if streams else 0
            x_wait = 0.0
            if g > 1:  # q, k, v: 3/4 of the bytes; the output: 1/4
                link_s = x_bytes[d] / hw.link_bytes_per_s
                attention = samples * self_attention_flops(b, s, n, hds[d]) / hw.flops[d]
                x_wait = exposed_exchange(attention, 0.75 * link_s, 0.25 * link_s, chunks)
            x_wait += kv_s[d]  # gathered keys/values (LTX-2's video->audio) are not chunked: all exposed
            # the link carries the weights and the whole exchange; compute waits for the exposed part
            exposed = max(0.0, stream + x_s[d] + kv_s[d] - (compute + x_wait))
            block = compute + x_wait + exposed  # max(compute + x_wait, stream + x_s + kv_s)
            if block > worst[0]:
                worst = (block, compute, exposed, x_wait)
        total = [total[0] + worst[1], total[1] + worst[2], total[2] + worst[3]]
    return total[0], total[1], total[2], max(received.values()), max(streamed.values()), chunks


def _gathered_kv(work: Workload, hw: Hardware, b: BlockShape, tok: dict, hds: dict, samples: float):
    """(bytes received, seconds) per device of the group for block ``b``'s keys/values gathered by heads
    (``sequence/ulysses.gathered_kv_attention``): each device receives, for its share of the heads, the
    keys and values of every token the others hold. Nothing where the block has none or the group is one."""
    if not b.gathered_kv_width or len(tok) < 2:
        return dict.fromkeys(tok, 0.0), dict.fromkeys(tok, 0.0)
    n, heads = work.tokens, work.shape.heads
    got = {d: samples * 2 * max(0, n - tok[d]) * b.gathered_kv_width * hds[d] / heads * work.activation_bytes
           for d in tok}
    return got, {d: got[d] / hw.link_bytes_per_s + 2 * TRANSFER_LATENCY_S for d in tok}


def estimate_sequence(work: Workload, hw: Hardware, owned=None, replicas: bool = False,
                      weighted: bool = False, resident=None, pipelined: bool = True) -> StrategyCost:
    """Batch split into groups, tokens split inside a group; ``replicas``: every device holds
    the whole model and streams nothing (core's CFG split is this with groups of one);
    ``weighted``: shares by each device's throughput (``_group_step``); ``resident``: per device
    (in ``hw`` order) the block indices it keeps beside its own (``cost/resident.resident_per_rank``),
    priced after the first step (nothing of them streamed); ``pipelined``: the exchange in head
    chunks beside the attention (the engine on GPU ranks of one process), else whole (worker
    processes: ``cost/workers``)."""
    s, n_dev = work.shape, len(hw.flops)
    owners = _owners(s.block_count, n_dev, owned)
    if resident is not None and len(resident) != n_dev:
        raise InputError(f"resident blocks for {len(resident)} devices, the hardware has {n_dev}: one set per rank")
    groups = _groups(n_dev, work.batch)
    samples = work.batch / len(groups)
    parts = [_group_step(work, hw, grp, samples, owners, replicas, weighted, resident, pipelined) for grp in groups]
    compute, stream, exchange, _, _, chunks = max(parts, key=lambda p: p[0] + p[1] + p[2])
    scatter = (n_dev - 1) / n_dev * work.batch * work.tokens * s.width * work.activation_bytes
    hop_s = 2 * scatter / hw.link_bytes_per_s + 2 * TRANSFER_LATENCY_S if n_dev > 1 else 0.0
    t = compute + stream + exchange + hop_s
    base = estimate_one_gpu(work, hw).seconds_per_step
    note = _bound_note(compute, stream, exchange, t, chunks if exchange else 1)
    streamed = int(max(p[4] for p in parts))
    if resident is not None and any(resident) and not replicas:
        kept = "every block resident, nothing streamed" if not streamed else \
            f"blocks kept resident, {streamed / 2 ** 30:.1f} GiB still streamed per step on the busiest GPU"
        note = f"{kept} after the first step; {note}"
    return StrategyCost("sequence", t, base / t, compute, exchange, stream, hop_s,
                        int(max(p[3] for p in parts) + scatter), note, streamed)


def estimate_sequence_lean(work: Workload, hw: Hardware, owned=None, weighted: bool = False,
                           resident=None, pipelined: bool = True) -> StrategyCost:
    """Lean `sequence` (``sequence/lean``): the batch's samples one after the other, each a whole
    `sequence` forward with its tokens over every device, so the weights stream once per pass
    (twice per step at cfg > 1) and each pass exchanges over all devices. Priced as ``batch``
    cfg-1 forwards; the speed-up stays against the one-GPU step of the whole batch."""
    one = replace(work, cfg=1.0)
    p = estimate_sequence(one, hw, owned, weighted=weighted, resident=resident, pipelined=pipelined)
    n = work.batch
    base = estimate_one_gpu(work, hw).seconds_per_step
    t = n * p.seconds_per_step
    return StrategyCost("sequence", t, base / t, n * p.compute_s, n * p.exchange_s, n * p.stream_s, n * p.hop_s,
                        n * p.bytes_per_device, f"lean: {n} passes per step, weights streamed {n}x; {p.note}",
                        n * p.streamed_bytes)


def _bound_note(compute: float, stream: float, exchange: float, total: float, chunks: int = 1) -> str:
    piped = f" (in {chunks} head chunks beside the attention)" if chunks > 1 else ""
    parts = (f"compute {compute / total:.0%}, exchange {exchange / total:.0%}{piped}, "
             f"exposed weight stream {stream / total:.0%}")
    if stream > 0.1 * total:
        return f"weight-bound ({parts}): streaming blocks takes longer than computing them"
    if exchange > 0.25 * total:
        return f"exchange-bound ({parts})"
    return parts


def estimate_costs(work: Workload, hw: Hardware, owned=None, replicas: bool = False,
                   resident=None, pipelined: bool = True) -> dict[str, StrategyCost]:
    """Every strategy for these devices (one GPU as the hypothetical baseline, always present);
    ``pipelined``: as ``estimate_sequence`` (False where a rank is not a GPU of this machine)."""
    out = {"one_gpu": estimate_one_gpu(work, hw)}
    if len(hw.flops) > 1:
        out["blocks"] = estimate_blocks(work, hw, owned)
        out["sequence"] = estimate_sequence(work, hw, owned, replicas, resident=resident, pipelined=pipelined)
    return out


def estimate_core_cfg_split(work: Workload, hw: Hardware) -> StrategyCost:
    """Cond and uncond on the first two devices, a full copy each; one device at cfg 1."""
    if work.batch < 2 or len(hw.flops) < 2:
        base = estimate_one_gpu(work, hw)
        why = "cfg 1: one cond per step, nothing to split (one GPU works)" if work.batch < 2 else "one GPU"
        return replace(base, strategy="core_cfg_split", note=why)
    pair = Hardware(hw.flops[:2], hw.link_bytes_per_s, hw.names[:2], hw.note, hw.host_link_bytes_per_s)
    seq = estimate_sequence(work, pair, replicas=True)
    base = estimate_one_gpu(work, hw).seconds_per_step
    return replace(seq, strategy="core_cfg_split", speedup=base / seq.seconds_per_step,
                   note="cond and uncond at once on two GPUs, a full copy each")


def estimate_dynamic_vram(work: Workload, hw: Hardware, resident_block_bytes: float, calls: int = 1) -> StrategyCost:
    """Every block on the first device; block weights past ``resident_block_bytes`` (filled in
    execution order) copied from pinned host memory in each of ``calls`` DiT calls per step."""
    if calls not in (1, 2) or work.batch % calls:
        raise InputError(f"calls {calls!r} must be 1 (cond+uncond together) or 2 (one after the other, cfg > 1)")
    s, n, budget = work.shape, work.tokens, max(0.0, float(resident_block_bytes))
    samples = work.batch / calls
    compute = exposed = streamed = 0.0
    for b in block_shapes(s):
        w = b.weight_params * work.weight_bytes
        resident = min(w, budget)
        budget -= resident
        c = samples * block_flops(b, s, n, n, s.heads) / hw.flops[0]
        copy = (w - resident) / hw.host_link_bytes_per_s + TRANSFER_LATENCY_S if w > resident else 0.0
        compute, exposed, streamed = compute + c, exposed + max(0.0, copy - c), streamed + w - resident
    t = calls * (compute + exposed)
    base = estimate_one_gpu(work, hw).seconds_per_step
    gb = hw.host_link_bytes_per_s / 1e9
    note = (f"streams {format_gib(calls * streamed)} GiB per step from pinned host RAM at {gb:g} GB/s, "
            f"{calls * exposed / t:.0%} of the step waiting for it" if streamed else "whole model resident")
    return StrategyCost("dynamic_vram", t, base / t, calls * compute, 0.0, calls * exposed, 0.0,
                        int(calls * streamed), note)
