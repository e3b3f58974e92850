"""What a `sequence` rank holds on its device, per rank, before anything runs (pure).

The plan must be what the engine allocates (issue 21), so every term below is one the engine
really makes, counted the way it makes it:

- **weights**: the blocks the rank's device owns, plus the DiT's non-block part on the home device.
- **prefetch**: ``sequence/stream.BlockStream`` keeps a ring of two buffers *per block shape* (its key:
  the block's class and tensor shapes) for the blocks the rank does not own, from first use until
  the engine closes. HunyuanVideo's double and single blocks are two shapes: four buffers on a rank
  that streams both kinds; a kind the rank streams only once needs one buffer.
- **activations**: measured, not guessed. ComfyUI's Wan 2.1 14B, LTX-Video 13B and HunyuanVideo 13B
  (0.3.64 classes on ``meta``) ran one `sequence` forward on 2 and 4 fake GPUs at 480p and 720p,
  cfg 1 and cfg > 1, with the real engine (threads, Ulysses exchanges, ring) under the fake-GPU
  memory tracker (``parallel/simulate.MemoryTracker``). Each rank's peak, less its ring, fits
  ``local × (block + ulysses × (g-1)/g) + home × (batch hidden × home_hidden + rope)`` where
  ``local`` is the rank's own hidden state (its samples × its tokens [+ the joint text tokens] ×
  width × bytes), ``g`` the ranks sharing its batch group (the Ulysses exchange: local q/k/v, the
  received parts, their concatenation and the output live at once; nothing when ``g`` = 1), and the
  home rank also holds the whole batch's hidden state (the DiT's input and the gathered output) and
  the rotary tables of every token. The factors (``ACTIVATION_FACTORS``) are the least upper
  bound of those rank peaks per family and block code (ComfyUI 0.3.64 and 0.29), with a margin
  for thread orders; ``tests/test_memory_plan_fake_gpu.py``
  checks every case again: measured total within 10 % of this plan and never above it.
  Measured (GiB, rank 1, activations without the ring; Wan 2.1 14B): 480p cfg 1 on 2 GPUs 1.74,
  cfg > 1 2.85; 720p cfg 1 on 4 GPUs 2.19, cfg > 1 on 2 GPUs 6.57. HunyuanVideo 13B 720p x 129
  cfg > 1 on 2 GPUs: 14.4 (its single blocks hold 7 hidden states in ``linear1`` alone).
- **exchange staging**: the thread exchange hands tensors between ranks without staging copies
  beyond the received parts, which the Ulysses factor already holds. The pipelined exchange of GPU
  ranks (``sequence/ulysses``, heads in 4 chunks; the fake-GPU runs above take the unpipelined one)
  holds at most two chunks' q/k/v and one chunk's attention input at a time: measured on fake GPUs
  with the chunks forced, Wan 14B 480p x 33 on 4 GPUs, rank 1's activations 0.3 GiB against 0.4
  (cfg 1) and 0.6 against 0.7 (cfg > 1), so the factors bound it too.

Not modelled (callers keep ``reserve_vram_gb`` for them): the CUDA context, allocator rounding and
fragmentation, cuBLAS workspaces. Pinned host bounce buffers are host RAM, not VRAM.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..sequence.split import plan_groups, rank_slices, share_ranges
from ..units import GiB, MiB, format_gib
from ..errors import InputError

__all__ = [
    "ACTIVATION_FACTORS",
    "ActivationFactors",
    "RankMemory",
    "compute_prefetch_bytes",
    "compute_sequence_activations",
    "format_bytes",
    "format_shortfalls",
    "lean_pass_batch",
    "plan_sequence_memory",
]


@dataclass(frozen=True)
class ActivationFactors:
    """Peak activation bytes of one `sequence` rank, in units of hidden states (see module doc)."""

    block: float
    """Per byte of the rank's own hidden state: the block's widest moment (FFN, or linear1)."""
    ulysses: float
    """Per byte of the rank's own hidden state, times (g-1)/g: the attention exchange's buffers."""
    home_hidden: float
    """Home rank only, per byte of the whole batch's hidden state (input, gathered output)."""
    rope: float
    """Home rank only, per token x width x 4 bytes (fp32 rotary tables of every token)."""
    joint_text: bool = False
    """Text tokens travel with the image tokens through every block (HunyuanVideo)."""


ACTIVATION_FACTORS: dict[str, ActivationFactors] = {
    # least upper bounds of the measured rank peaks (module doc) on ComfyUI 0.3.64 and 0.29, +3 % for
    # thread orders not seen (two ranks doing the same work peaked 9 % apart), rounded up to 0.05
    # Wan's home_hidden 1.05, not 0.75: at cfg > 1 on two ranks (cond alone on the home rank, uncond
    # alone on the other) the other rank's output sometimes reaches home during home's own peak: home
    # then measured 3.50 GiB (480p) and 8.06 GiB (720p) against the 0.75 plan's 3.44 and 7.93 (in 1 of 3
    # to 6 runs, ComfyUI 0.3.64; 0.84 of it otherwise); 1.05 plans 3.62 and 8.36, 3.5 % and 3.8 % above (a CI run
    # failed on this thread order)
    "wan": ActivationFactors(block=9.4, ulysses=6.25, home_hidden=1.05, rope=0.05),
    # ``<family>/fused_ffn``: the FFN runs through core's ``linear_input_act`` (ComfyUI 0.33;
    # ``families.Family.code_variant``), its up-projection alive through the down-projection. Measured
    # on 0.33, a rank with its own batch group (g = 1), activations / own hidden state: Wan 2.1 14B
    # 9.52 (720p cfg > 1, 2 GPUs: 2.97 GiB against 9.4's 2.94 planned), LTX-Video 13B 14.02 (720p
    # cfg > 1, 2 GPUs: 1.50 GiB against 12.4's 1.33); +3 %, rounded up to 0.05
    "wan/fused_ffn": ActivationFactors(block=9.8, ulysses=6.25, home_hidden=1.05, rope=0.05),
    "ltxv": ActivationFactors(block=12.4, ulysses=2.85, home_hidden=3.1, rope=0.05),
    "ltxv/fused_ffn": ActivationFactors(block=14.45, ulysses=2.85, home_hidden=3.1, rope=0.05),
    "hunyuan_video": ActivationFactors(block=22.35, ulysses=1.05, home_hidden=0.75, rope=0.3, joint_text=True),
    # HunyuanVideo whose single blocks free q/k/v before the MLP (``del qkv``: ComfyUI 0.29, not 0.3.64;
    # ``families.activation_variant``): 720p x 129 cfg > 1 on 2 GPUs 9.7 GiB per rank instead of 14.4
    "hunyuan_video/lean": ActivationFactors(block=14.65, ulysses=12.3, home_hidden=1.25, rope=0.05,
                                            joint_text=True),
    # MiniMax H3 (ComfyUI 0.33, 50 blocks cut to 4, bf16, batch 1: ComfyUI never batches its conds) at
    # 848x480 and 1344x768, 124 frames, on 2 and 4 fake GPUs, per byte of a rank's rows (its video
    # tokens + the 256 text tokens; the audio rows, under 3 %, are in the margin): not-home ranks 15.53 /
    # 15.43 (g = 2), 16.34 / 16.55 (g = 4), so block 13.91 and ulysses 4.48 bound both sizes; home holds
    # 1.01-1.05 batch hidden states more (the input and the gathered output); +3 %, rounded up to 0.05
    # Kandinsky 5 (ComfyUI 0.33, visual blocks cut to 4; text blocks run whole), Lite and Pro at 848x480
    # and 1280x720 x 121, 2 and 4 fake GPUs, cfg 1 and > 1, per byte of a rank's visual rows: g = 1
    # 7.13-7.15, g = 2 11.14-11.15 (ulysses 8.0), g = 4 12.15-12.17 (6.7); home 0.55-0.99 batch hidden
    # states more (Lite's, the rotary tables weigh more beside its 1792 width); +3 %, rounded up to 0.05;
    # home_hidden 1.1, not 1.05: Lite on 4 GPUs at cfg > 1, its home rank measured 0.016 (480p) and 0.007
    # (720p) batch hidden states above 1.05's plan in 2 of some 20 CI runs (thread order)
    "kandinsky5": ActivationFactors(block=7.35, ulysses=8.25, home_hidden=1.1, rope=0.05),
    "minimax_h3": ActivationFactors(block=14.35, ulysses=4.6, home_hidden=1.1, rope=0.05, joint_text=True),
    # LTX-2.3 (ComfyUI 0.33, 48 blocks cut to 4, bf16; the video tokens split, the audio whole on every
    # rank) at 768x512 and 1280x704 x 121, 2 and 4 fake GPUs, cfg 1 and > 1, per byte of a rank's video
    # rows (the audio, ~1 % of them, and the video->audio attention's keys/values by heads are in the
    # figures): g = 1 14.14-14.31, g = 2 14.27-14.64, g = 4 15.53-16.21 (block 14.31 and ulysses 2.54
    # bound all); home 1.95-3.63 batch hidden states more; +3 %, rounded up to 0.05
    "ltxav": ActivationFactors(block=14.75, ulysses=2.65, home_hidden=3.75, rope=0.05),
}


@dataclass(frozen=True)
class RankMemory:
    """One `sequence` rank's bytes on its device: planned here, or measured by the dry run's fake
    forward (``loaders/plan/fake_sequence``), which also reports ``resident``."""

    device: str
    weights: int
    prefetch: int
    activations: int
    resident: int = 0
    """Resident copies of streamed blocks the rank holds (``SequenceEngine.keep_resident``)."""

    @property
    def total(self) -> int:
        return self.weights + self.prefetch + self.activations + self.resident


def compute_prefetch_bytes(block_bytes, block_devices, device: str, block_kinds=None, ring: int = 2,
                           whole=None) -> int:
    """Bytes of the ring buffers a rank on ``device`` fills: per block kind it streams (blocks on
    another device), ``min(ring, how many it streams)`` buffers of that kind's largest block.
    ``block_kinds``: one hashable per block (its shape); None: blocks of equal bytes are one kind.
    ``whole``: per block, True when it runs whole on its owner (``TokenSpec.whole``: never streamed)."""
    kinds = list(block_kinds) if block_kinds is not None else list(block_bytes)
    whole = list(whole) if whole is not None else [False] * len(kinds)
    streamed: dict = {}
    for nbytes, dev, kind, alone in zip(block_bytes, block_devices, kinds, whole, strict=True):
        if str(dev) != str(device) and not alone:
            count, top = streamed.get(kind, (0, 0))
            streamed[kind] = (count + 1, max(top, int(nbytes)))
    return sum(min(ring, count) * top for count, top in streamed.values())


def compute_sequence_activations(family: str, width: int, tokens: int, batch: int, n_ranks: int,
                                 text_tokens: int = 0, act_bytes: int = 2, home_rank: int = 0,
                                 heads: int = 0, factors: ActivationFactors | None = None,
                                 speeds=None) -> list[int]:
    """Peak activation bytes per rank (rank order) of one `sequence` forward: ``tokens`` image tokens
    per sample, ``batch`` samples (2: cond + uncond, split first), ``n_ranks`` ranks. ``heads``
    (0: split evenly): a rank that attends more than 1/g of the heads (uneven split, as
    ``sequence/ulysses`` makes it) holds that much more of every token in the exchange. ``factors``:
    another model's measured factors instead of ``family``'s (``benchmarks/gpu_check.py``'s toy)."""
    f = factors if factors is not None else ACTIVATION_FACTORS.get(family)
    if f is None:
        raise InputError(f"no measured activation factors for model {family!r}: "
                         f"known {', '.join(ACTIVATION_FACTORS)}")
    text = text_tokens if f.joint_text else 0
    out = [0] * n_ranks
    for rs in rank_slices(plan_groups(batch, n_ranks, speeds), tokens):  # ``speeds``: the engine's shares
        g = len(rs.group.ranks)
        samples = rs.group.batch[1] - rs.group.batch[0]
        local = samples * (rs.tokens[1] - rs.tokens[0] + text) * width * act_bytes
        share = 1.0
        if heads > 0 and g > 1:
            h0, h1 = share_ranges(heads, g, rs.group.shares)[rs.position]
            share = (h1 - h0) * g / heads
        act = local * (f.block + (f.ulysses * share * (g - 1) / g if g > 1 else 0.0))
        if rs.rank == home_rank:
            act += f.home_hidden * batch * (tokens + text) * width * act_bytes + f.rope * tokens * width * 4
        out[rs.rank] = int(act)
    return out


def plan_sequence_memory(family: str, width: int, tokens: int, batch: int, ranks, block_bytes, block_devices,
                         home: str, home_bytes: int, block_kinds=None, text_tokens: int = 0,
                         act_bytes: int = 2, heads: int = 0, factors: ActivationFactors | None = None,
                         whole=None, speeds=None) -> list[RankMemory]:
    """Per rank (``ranks``: one device each, in rank order): weights, ring buffers, activations;
    ``whole``: ``compute_prefetch_bytes``'s; ``speeds``: the engine's (a faster rank's larger share)."""
    ranks = [str(d) for d in ranks]
    home = str(home)
    home_rank = ranks.index(home) if home in ranks else -1
    acts = compute_sequence_activations(family, width, tokens, batch, len(ranks), text_tokens, act_bytes, home_rank,
                                        heads, factors, speeds)
    out = []
    for r, dev in enumerate(ranks):
        weights = sum(int(b) for b, d in zip(block_bytes, block_devices, strict=True) if str(d) == dev)
        weights += int(home_bytes) if dev == home else 0
        out.append(RankMemory(dev, weights, compute_prefetch_bytes(block_bytes, block_devices, dev, block_kinds,
                                                                   whole=whole), acts[r]))
    return out


def lean_pass_batch(batched, one_pass, usable: dict, batch: int, pass_batch: int) -> int | None:
    """``pass_batch`` where the plan at the whole ``batch`` (``batched`` rows: cond and uncond
    together) does not fit ``usable`` but one pass's (``one_pass`` rows at ``pass_batch``) does:
    then `sequence` runs lean (``sequence/lean``). None where the batched split fits, where lean
    would not fit either (the caller's own refusal or fallback stands), or ``batch <= pass_batch``."""
    if batch <= pass_batch or not format_shortfalls(batched, usable):
        return None
    return None if format_shortfalls(one_pass, usable) else pass_batch


def format_bytes(n: float) -> str:
    """GiB with one decimal; MiB below 0.1 GiB, so a small model's shortfall never reads 0.0 GiB."""
    return f"{format_gib(n)} GiB" if abs(n) >= GiB / 10 else f"{n / MiB:.1f} MiB"


def format_shortfalls(rows, usable: dict) -> str:
    """'cuda:1 needs 21.4 GiB, has 20.0 GiB usable: 1.4 GiB missing' for each rank that does not
    fit (``usable``: device -> bytes, None: unknown, not checked); '' when every rank fits."""
    f = format_bytes
    parts = []
    for m in rows:
        room = usable.get(m.device)
        if room is not None and m.total > room:
            parts.append(f"{m.device} needs {f(m.total)} (weights {f(m.weights)} + streamed blocks {f(m.prefetch)} "
                         f"+ activations {f(m.activations)}), has {f(room)} usable: {f(m.total - room)} missing")
    return "; ".join(parts)
