"""gpu_check sections on the real `sequence` engine: ``sequence`` (numerics), ``syncs``, ``memory``,
``overlap``. Each returns ``(status, figures)``; on a machine without CUDA each runs its setup on
CPU at tiny sizes (``cpu,cpu``) and returns ``SKIP`` with what ran, or ``FAIL`` if its wiring broke.

Tolerances of ``sequence`` (max abs difference against the unsharded forward on the home device,
scaled by ``max(1, max |reference|)``; not yet measured on a GPU: re-state them from the first run):
- fp32 with TF32 off, GPU ranks only: 1e-4. A token split gives cuBLAS fewer rows per GEMM, so it
  may choose another kernel (another summation order): ~1e-6 relative per GEMM, a few through 4
  blocks; a wrong block, token range or exchange gives differences of order 1.
- fp32, ``cuda:0,cpu``: 2e-4: CPU and CUDA kernels also sum in different orders.
- bf16: 5e-2 (bf16 keeps 8 bits: one rounding step is 4e-3 relative, and a split moves roundings).
"""
from __future__ import annotations

import torch
from gpu_check_seq import (
    Sharded,
    build_model,
    count_syncs,
    inputs,
    max_diff,
    median_time,
    sync,
    toy_factors,
)
from harness.global_flags import restored

TOL = {("fp32", False): 1e-4, ("fp32", True): 2e-4, ("bf16", False): 5e-2, ("bf16", True): 5e-2}
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def _configs(cuda: bool):
    """(ranks, where) of the numerics and sync runs."""
    if cuda:
        return [(["cuda:0", "cuda:0"], "owners"), (["cuda:0", "cuda:0"], "pinned"), (["cuda:0", "cpu"], "split")]
    return [(["cpu", "cpu"], "owners"), (["cpu", "cpu"], "forced"), (["cpu", "cpu"], "split")]


def section_sequence(sz, cuda: bool):
    home = "cuda:0" if cuda else "cpu"
    figures, failed = [], []
    with restored():
        torch.backends.cuda.matmul.allow_tf32 = False  # fp32 compares ShardDiT, not TF32 rounding
        torch.backends.cudnn.allow_tf32 = False
        for ranks, where in _configs(cuda):
            mixed = len({torch.device(r).type for r in ranks}) > 1
            for dname, batch in (("fp32", 1), ("fp32", 2), ("bf16", 1)):
                model = build_model(sz.dim, sz.heads, sz.blocks, sz.ffn, DTYPES[dname], home)
                args = inputs(model, batch, sz.tokens, sz.text, home, DTYPES[dname])
                with torch.no_grad():
                    ref = model(*args)
                run = Sharded(model, ranks, where, home)
                try:  # the first forward fills the rings, the second reuses their buffers
                    outs = [run.forward(args), run.forward(args)]
                    streamed = run.streamed()
                finally:
                    run.close()
                diff = max(max_diff(out, ref) for out in outs) / max(1.0, ref.abs().max().item())
                limit = TOL[dname, mixed]
                ok = all(bool(torch.isfinite(out).all()) for out in outs) and diff <= limit
                remote = where != "owners" and (where != "split" or ranks[0] != ranks[1])
                streams_ok = all(s > 0 for s in streamed) if remote else sum(streamed) == 0
                tag = f"{','.join(ranks)} {where} {dname} b{batch}"
                if not ok:
                    failed.append(f"{tag} diff {diff:.2g} > {limit:g}")
                if not streams_ok:
                    failed.append(f"{tag} streamed {streamed} (expected {'every rank' if remote else 'none'})")
                figures.append(f"{tag} {'=' if diff == 0 else f'{diff:.1g}'}")
    tols = "tol fp32 1e-4 (cuda+cpu 2e-4), bf16 5e-2, relative to max|ref|"
    if failed:
        return "FAIL", "; ".join(failed) + f" ({tols})"
    text = f"{len(figures)} runs (2 forwards each) vs unsharded, {tols}: " + ", ".join(figures)
    return ("PASS", text) if cuda else ("SKIP", f"no CUDA: ran on cpu,cpu instead, wiring ok: {text}")


def section_syncs(sz, cuda: bool):
    """Synchronizing calls per block in the steady state (the third forward): target 0 for GPU
    ranks; ``cuda:0,cpu`` is informational (the CPU rank must wait for its GPU copies)."""
    home = "cuda:0" if cuda else "cpu"
    per_block, bad = [], []
    for ranks, where in _configs(cuda):
        model = build_model(sz.dim, sz.heads, sz.blocks, sz.ffn, torch.float32, home)
        args = inputs(model, 1, sz.tokens, sz.text, home, torch.float32)
        run = Sharded(model, ranks, where, home)
        try:
            run.forward(args)
            run.forward(args)
            sync(home)
            if cuda:
                n = count_syncs(lambda run=run, args=args: run.forward(args))
            else:
                run.forward(args)
                n = None
        finally:
            run.close()
        tag = f"{','.join(ranks)} {where}"
        if n is None:
            per_block.append(f"{tag} ran")
            continue
        per_block.append(f"{tag} {n / sz.blocks:.2f}/block")
        if n and "cpu" not in ranks:
            bad.append(tag)
    text = "syncs per block, steady state (target 0 on GPU ranks; cuda:0,cpu informational): " + ", ".join(per_block)
    if not cuda:
        return "SKIP", f"no CUDA: set_sync_debug_mode needs CUDA; the forwards ran on cpu,cpu: {', '.join(per_block)}"
    return ("FAIL" if bad else "PASS"), text


def plan_bytes(sz, ranks, block_bytes, block_devices, home, tokens, batch, act_bytes=2, factors=None):
    """(bytes the plan gives the ranks on ``home`` beyond resident weights, which function): the
    ring and activations of ``parallel/cost/memory.plan_sequence_memory``, what ShardDiT checks
    before it loads, with the toy's own factors (``gpu_check_seq.toy_factors``) unless given."""
    from sharddit.parallel.cost.memory import plan_sequence_memory

    rows = plan_sequence_memory("wan", sz.mem_dim, tokens, batch, ranks, block_bytes, block_devices, home, 0,
                                text_tokens=sz.mem_text, act_bytes=act_bytes,
                                factors=factors if factors is not None else toy_factors())
    return (sum(r.prefetch + r.activations for r in rows if r.device == home),
            "cost/memory.plan_sequence_memory with the toy's factors")


def _wan_width(sz, cuda: bool):
    home = "cuda:0" if cuda else "cpu"
    model = build_model(sz.mem_dim, sz.mem_heads, sz.mem_blocks, sz.mem_ffn, torch.bfloat16, home,
                        meta_init=cuda)
    return home, model, inputs(model, 1, sz.mem_tokens, sz.mem_text, home, torch.bfloat16)


def section_memory(sz, cuda: bool):
    from sharddit.parallel.blocks.routing import BlockLayout
    from sharddit.parallel.placement.sizing import compute_block_bytes

    home, model, args = _wan_width(sz, cuda)
    ranks = [home, home]
    where = "pinned" if cuda else "forced"
    block_bytes = compute_block_bytes(model, BlockLayout(("blocks",), (("x",),)))
    # dry: the rings are forced to stream blocks that sit on their own device: plan them as remote
    block_devices = ["cpu" if cuda else "remote"] * len(block_bytes)
    plan, how = plan_bytes(sz, ranks, block_bytes, block_devices, home, sz.mem_tokens, 1)
    run = Sharded(model, ranks, where, home)
    try:
        run.forward(args)  # first forward: threads, cuBLAS handles, ring buffers
        if cuda:
            sync(home)
            torch.cuda.reset_peak_memory_stats(home)
            base = torch.cuda.memory_allocated(home)
        run.forward(args)
        ring = run.ring_bytes()
        if cuda:
            sync(home)
            measured = torch.cuda.max_memory_allocated(home) - base + ring
    finally:
        run.close()
    gib = float(1 << 30)
    shape = (f"dim {sz.mem_dim}, {sz.mem_heads} heads, {len(block_bytes)} blocks of {block_bytes[0] / gib:.2f} GiB, "
             f"{sz.mem_tokens} tokens, bf16, ranks {','.join(ranks)} streaming every block")
    if not cuda:
        return "SKIP", (f"no CUDA: max_memory_allocated needs CUDA; tiny model ran on cpu,cpu ({shape}); "
                        f"plan {plan / 2**20:.2f} MiB from {how}, ring held {ring / 2**20:.2f} MiB")
    ratio = measured / plan if plan else float("inf")
    verdict = "PASS" if measured <= plan else "FAIL"
    near = "within 10 %" if ratio >= 0.9 else "plan > 10 % above the peak"
    return verdict, (f"peak {measured / gib:.2f} GiB (ring {ring / gib:.2f}) vs plan {plan / gib:.2f} GiB "
                     f"= {ratio:.2f} ({near}; target <= 1.00) [{shape}; plan from {how}]")


def first_copy_seconds(model, home, reps: int) -> float:
    """Time of one block's host->GPU copy from pinned RAM: a forward's first block is copied before
    it can run (nothing precedes it to overlap: the ring does not prefetch across forwards, since
    ComfyUI may patch the weights between steps), so that copy is the part of a streamed step that
    no overlap can hide."""
    block = model.blocks[0]
    pin = torch.device(home).type == "cuda"  # dry runs time a CPU copy (nothing to pin)
    src = [t.detach().to("cpu", copy=True) for t in block.parameters()]
    src = [t.pin_memory() for t in src] if pin else src
    dst = [torch.empty_like(t, device=home) for t in src]

    def copy():
        for d, s in zip(dst, src, strict=True):
            d.copy_(s, non_blocking=True)
    copy()
    return median_time(copy, home, max(3, reps))


def section_overlap(sz, cuda: bool):
    """Step time with every block streamed from pinned RAM (and from pageable RAM, informational)
    over the same model all resident: target <= 1.10 plus the first block's copy, which nothing
    can overlap (``first_copy_seconds``) over the resident step."""
    home, model, args = _wan_width(sz, cuda)
    ranks = [home, home]
    times = {}
    for where in (("owners", "pinned", "pageable") if cuda else ("owners", "forced")):
        run = Sharded(model, ranks, where, home)
        try:
            run.forward(args)  # warm-up
            times[where] = median_time(lambda run=run: run.forward(args), home, sz.reps)
        finally:
            run.close()
    streamed = "pinned" if cuda else "forced"
    ratio = times[streamed] / times["owners"]
    first = first_copy_seconds(model, home, sz.reps)
    target = 1.10 + first / times["owners"]
    text = ", ".join(f"{k} {v * 1e3:.1f} ms" for k, v in times.items()) + f", block 0 copy {first * 1e3:.1f} ms"
    if not cuda:
        return "SKIP", f"no CUDA: timed tiny cpu,cpu instead (ratio {ratio:.2f}, not meaningful): {text}"
    extra = f"; pageable {times['pageable'] / times['owners']:.2f} (informational)"
    return (("PASS" if ratio <= target else "FAIL"),
            f"streamed/resident {ratio:.3f} (target <= {target:.3f} = 1.10 + block 0's copy / resident step){extra}: "
            f"{text}")
