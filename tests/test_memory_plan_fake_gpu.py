"""The `sequence` memory plan is what the engine allocates (issue 21): fake-GPU peaks within 10 % of
the plan and never above it.

ComfyUI's own Wan 2.1 14B, HunyuanVideo 13B and LTX-Video 13B classes (``meta``, bf16), blocks
planned over 2 and 4 fake GPUs, one `sequence` forward with the real engine (worker threads,
Ulysses exchanges, the per-shape prefetch ring) at 480p and 720p, cfg 1 (batch 1) and cfg > 1
(cond + uncond), under the simulator's memory tracker (``parallel/simulate.MemoryTracker``):
every storage counted on the fake device that made it. Per rank the measured peak (weights +
activations + ring buffers) is compared with ``cost_memory.plan_sequence_memory``.

The forward runs with the depth cut to 4 blocks (``DEPTH``) so the 24 cases fit a CI minute: blocks of one list are alike, so a rank's activation peak is that of the full
model (full-depth Wan 2.1 14B measured the same or lower: 720p cfg > 1 on 2 GPUs, home rank 6.75
GiB against 6.75-7.40 GiB cut). On the cut model the weights and ring buffers measured must equal
the plan's exactly; the totals compared are the full model's: its planned weights and ring per rank
(exact sums of block bytes, as just checked) plus the activation peak measured, against the plan.
The home rank's peak depends on thread order (seen 6.75 and 7.40 GiB for one case): the plan covers
the worst seen. Totals are dominated by weights, so the plan's Ulysses term is also checked alone
(``test_the_plans_ulysses_term_bounds_the_exchange_measured``, issue 30: the term x 0.7 passed the
totals for Wan and HunyuanVideo); measured at 480p it is 0.78-0.84 of the plan's for Wan, 0.70-0.97
for HunyuanVideo and 0.73-0.96 for LTX-Video.
"""
from dataclasses import replace

import pytest

pytestmark = pytest.mark.comfy
GiB = 1 << 30

SIZES = {"wan2.1-t2v-14b": {"480p": (832, 480, 81), "720p": (1280, 720, 81)},
         "hunyuanvideo-13b": {"480p": (848, 480, 129), "720p": (1280, 720, 129)},
         "ltxv-13b": {"480p": (768, 512, 121), "720p": (1280, 704, 121)},
         "minimax-h3": {"480p": (848, 480, 124), "720p": (1344, 768, 124)},
         "kandinsky5-lite": {"480p": (848, 480, 121), "720p": (1280, 720, 121)},
         "ltx-2.3": {"480p": (768, 512, 121), "720p": (1280, 704, 121)}}
DEPTH = {"wan2.1-t2v-14b": lambda n: {"num_layers": 4}, "ltxv-13b": lambda n: {"num_layers": 4},
         "minimax-h3": lambda n: {"num_layers": 4}, "kandinsky5-lite": lambda n: {"num_visual_blocks": 4},
         "ltx-2.3": lambda n: {"num_layers": 4},
         "hunyuanvideo-13b": lambda n: {"depth": n // 2, "depth_single_blocks": n // 2}}
"""The cut model per rank count: 4 blocks (HunyuanVideo: one block per rank, half double, half single).
With 2 blocks on 2 ranks the home rank's peak rose above the full model's (its first and last block
overlap the DiT's input and gathered output): 3.76 GiB at 480p cfg > 1 against 2.88 with 4 or 40."""


@pytest.fixture(scope="module")
def sim():
    from sharddit.loaders.comfyui_import import import_comfyui

    import_comfyui()
    from sharddit.loaders.plan import dry_run as simulator
    from sharddit.loaders.plan import fake_sequence as simulator_sequence
    from sharddit.loaders.plan import presets

    return presets, simulator, simulator_sequence


@pytest.fixture(scope="module")
def contexts(sim):
    return {}


def _context(sim, contexts, model, res, n, full=False):
    """(cut or full-depth) context over ``n`` fake 141 GiB GPUs, its block devices and home (the full
    model as the planner places it; the cut one evenly, so every rank runs and streams)."""
    from sharddit.parallel.placement.devices import DevicePlan
    from sharddit.parallel.placement.inventory import inventory_from_spec
    from sharddit.parallel.placement.plan_types import PlacementRequest
    from sharddit.loaders.plan.setup import check_simulation

    presets, simulator, _ = sim
    if not presets.comfyui_has(presets.PRESETS[model].requires):
        pytest.skip(f"{presets.PRESETS[model].requires} is absent from this ComfyUI (added after ComfyUI 0.3.64)")
    key = (model, "full" if full else n)
    if key not in contexts:  # one meta model per depth; the size is a setting of the run
        spec = presets.resolve_model(model)
        if not full:
            spec = replace(spec, unet_config={**spec.unet_config, **DEPTH[model](n)})
        contexts[key] = simulator.context_of(check_simulation(spec, "cpu", *SIZES[model][res]))
    devices = [f"cuda:{i}" for i in range(n)]
    ctx = replace(contexts[key], size=SIZES[model][res],
                  request=PlacementRequest(devices=DevicePlan.of_devices(devices), reserve_vram_gb=1.0),
                  inventory=inventory_from_spec(",".join(f"{d}=141GiB" for d in devices)))
    if not full:  # the cut blocks split evenly by count, home on cuda:0
        nb = len(ctx.block_bytes)
        return ctx, [f"cuda:{i * n // nb}" for i in range(nb)], "cuda:0"
    from sharddit.loaders.plan.block_plan import plan_blocks

    plan, err, block_devices, home = plan_blocks(ctx, 0)
    assert err is None and home == "cuda:0"
    return ctx, block_devices, home


def _measured(sim, contexts, model, res, n, cfg):
    """The fake-GPU peaks per rank of the cut model's forward (kept for the other tests of the module)."""
    key = ("measured", model, res, n, cfg)
    if key not in contexts:
        ctx, block_devices, home = _context(sim, contexts, model, res, n)
        contexts[key] = sim[2].run_fake_sequence_forward(ctx, 1 if cfg == "cfg1" else 2, block_devices, home)
    return contexts[key]


# MiniMax H3 runs one condition at a time (ComfyUI never batches its conds): its cfg > 1 is cfg 1 twice
PEAK_CASES = [(m, r, n, c) for m in SIZES for r in ("480p", "720p") for n in (2, 4) for c in ("cfg1", "cfg6")
              if not (m == "minimax-h3" and c == "cfg6")]


@pytest.mark.parametrize(("model", "res", "n", "cfg"), PEAK_CASES)
def test_sequence_peak_within_ten_percent_of_plan(sim, contexts, model, res, n, cfg):
    seq = sim[2]
    batch = 1 if cfg == "cfg1" else 2
    ctx, block_devices, home = _context(sim, contexts, model, res, n)
    cut = seq.plan_sequence_peaks(ctx, batch, block_devices, home)
    measured = _measured(sim, contexts, model, res, n, cfg)
    assert [p.device for p in cut] == [m.device for m in measured]
    full_ctx, full_devices, full_home = _context(sim, contexts, model, res, n, full=True)
    planned = seq.plan_sequence_peaks(full_ctx, batch, full_devices, full_home)
    for c, p, m in zip(cut, planned, measured, strict=True):
        assert (m.weights, m.prefetch) == (c.weights, c.prefetch), (c, m)  # exact on the cut model
        assert m.activations <= c.activations
        total = p.weights + p.prefetch + m.activations  # the full model's weights and ring, as planned
        said = (f"{p.device}: measured {total / GiB:.2f} GiB (activations {m.activations / GiB:.2f}), "
                f"planned {p.total / GiB:.2f} (activations {p.activations / GiB:.2f})")
        assert total <= p.total, said
        assert total >= 0.9 * p.total, said


def test_hunyuan_ring_holds_both_block_shapes(sim, contexts):
    """HunyuanVideo cut to 2 double + 3 single blocks: cuda:0 owns the doubles, cuda:1 two singles,
    cuda:2 the last single. cuda:2 streams both kinds and fills four buffers (two of each shape);
    the plan counts the same, where "two of the largest block" counted two doubles."""
    from sharddit.loaders.plan.setup import check_simulation

    presets, simulator, seq = sim
    if "ring" not in contexts:
        spec = presets.resolve_model("hunyuanvideo-13b")
        spec = replace(spec, unet_config={**spec.unet_config, "depth": 2, "depth_single_blocks": 3})
        contexts["ring"] = simulator.context_of(check_simulation(spec, "cpu", 848, 480, 129))
    ctx = contexts["ring"]
    devices = ["cuda:0", "cuda:0", "cuda:1", "cuda:1", "cuda:2"]
    double, single = ctx.block_bytes[0], ctx.block_bytes[-1]
    assert double > 2 * single
    measured = seq.run_fake_sequence_forward(ctx, 1, devices, "cuda:0")
    planned = seq.plan_sequence_peaks(ctx, 1, devices, "cuda:0")
    assert [m.prefetch for m in measured] == [p.prefetch for p in planned] == [
        2 * single, 2 * double + single, 2 * double + 2 * single]
    assert all(m.activations <= p.activations for m, p in zip(measured, planned, strict=True))


ULYSSES_CASES = ((2, "cfg1", 2), (4, "cfg6", 2), (4, "cfg1", 4))
"""(ranks, cfg, ranks per batch group g) of the cut model: a group of g > 1 ranks runs the Ulysses
exchange; ``2, "cfg6"`` gives every rank a sample of its own (g = 1: the block term alone)."""


@pytest.mark.parametrize("model", [m for m in SIZES if m != "minimax-h3"])  # H3: the next test
def test_the_plans_ulysses_term_bounds_the_exchange_measured(sim, contexts, monkeypatch, model):
    """The totals above are dominated by weights, and a plan term too small can hide under another
    too large: here the Ulysses term alone (what a rank of a group of g > 1 holds beyond the block
    term) is measured and bounded by the plan's. On each rank that is not home (home also holds the
    whole batch): the block term is measured where g = 1 (per byte of the rank's hidden state),
    and what a g > 1 rank holds beyond that block term is its exchange, which the plan's Ulysses
    term must cover and not exceed twice."""
    from sharddit.parallel.cost import memory

    seq = sim[2]

    def plan(n, cfg, ulysses=True):
        ctx, block_devices, home = _context(sim, contexts, model, "480p", n)
        with monkeypatch.context() as mp:
            if not ulysses:
                for k, f in list(memory.ACTIVATION_FACTORS.items()):
                    mp.setitem(memory.ACTIVATION_FACTORS, k, replace(f, ulysses=0.0))
            return seq.plan_sequence_peaks(ctx, 1 if cfg == "cfg1" else 2, block_devices, home)

    from sharddit.parallel.families import activation_variant
    from sharddit.parallel.placement.sizing import get_blocks

    ctx0 = _context(sim, contexts, model, "480p", 2)[0]
    variant = activation_variant(ctx0.spec.family, get_blocks(ctx0.dit, ctx0.layout)[-1])
    # LTX-Video with core's fused FFN (ComfyUI 0.33, ``ltxv/fused_ffn``): the FFN's peak (up-projection
    # alive through the down-projection) is higher than attention plus its exchange, so a rank's peak
    # holds no exchange buffer (measured 0.001 GiB beyond the block term, 2 ranks cfg 1): the plan's
    # term is then a margin the peak does not reach, and only its upper bound can be checked here.
    # LTX-2.3 (``ltxav``, the same FFN): its peak falls in the exchange or in the FFN by thread order
    # (4 ranks cfg > 1, rank 1: 0.031 and 0.007 GiB beyond the block term in two runs of the same case)
    exchange_at_peak = variant not in ("ltxv/fused_ffn", "ltxav")
    if variant == "hunyuan_video":
        # HunyuanVideo as ComfyUI 0.3.64 runs it (single blocks keep q/k/v through their MLP): the rank's
        # peak falls in the MLP or in the exchange by thread order (0.151 and 0.000 GiB beyond the block
        # term measured in two runs of the same case), so the exchange cannot be told apart from the
        # block term by peaks; the plan's total (block + Ulysses) is what holds, checked by
        # test_sequence_peak_within_ten_percent_of_plan. On 0.29 and 0.33 (``hunyuan_video/lean``) it can.
        # Here: each non-home rank of a g > 1 group stays within block + Ulysses terms together.
        for n, cfg, g in ULYSSES_CASES:
            measured, full = _measured(sim, contexts, model, "480p", n, cfg), plan(n, cfg)
            for r in range(1, n):
                assert measured[r].activations <= full[r].activations, f"{model} {n} ranks {cfg} rank {r}"
        return
    alone = _measured(sim, contexts, model, "480p", 2, "cfg6")[1]
    block = alone.activations / plan(2, "cfg6", ulysses=False)[1].activations  # measured / planned block term
    assert 0.8 <= block <= 1.0, f"block term measured {block:.3f} of the plan's"
    for n, cfg, g in ULYSSES_CASES:
        measured, full, zero = _measured(sim, contexts, model, "480p", n, cfg), plan(n, cfg), plan(n, cfg, False)
        for r in range(1, n):
            planned = full[r].activations - zero[r].activations
            exchange = measured[r].activations - block * zero[r].activations
            said = (f"{model} {n} ranks {cfg} (g = {g}) rank {r}: Ulysses term measured {exchange / GiB:.3f} GiB, "
                    f"planned {planned / GiB:.3f} GiB")
            assert planned > 0 and exchange <= planned, said
            if exchange_at_peak:
                assert exchange >= 0.5 * planned, said


@pytest.mark.parametrize("res", ["480p", "720p"])
def test_h3_plans_block_and_ulysses_terms_apart(sim, contexts, res):
    """MiniMax H3 has no rank with a sample of its own (batch 1 always), so its two terms are told
    apart by group size: a not-home rank holds ``local x (block + ulysses x (g-1)/g)``; from g = 2 and
    g = 4 the measured Ulysses term is ``4 x (per-byte peak at g=4 - at g=2)``. Each measured term
    within the plan's and above half of it (the Ulysses factor x 0.7 fails here; the totals above
    would not see it)."""
    from sharddit.parallel.cost.memory import ACTIVATION_FACTORS
    from sharddit.parallel.families import shape_from_spec
    from sharddit.parallel.sequence.split import even_ranges

    per_byte = {}
    for n in (2, 4):
        ctx = _context(sim, contexts, "minimax-h3", res, n)[0]
        shape = shape_from_spec(ctx.spec)
        tokens, text = shape.image_tokens(*SIZES["minimax-h3"][res]), ctx.spec.geometry.context_tokens
        a, b = even_ranges(tokens, n)[1]
        per_byte[n] = _measured(sim, contexts, "minimax-h3", res, n, "cfg1")[1].activations / ((b - a + text) * shape.width * 2)
    f = ACTIVATION_FACTORS["minimax_h3"]
    ulysses = 4 * (per_byte[4] - per_byte[2])
    block = per_byte[2] - ulysses / 2
    said = f"{res}: measured block {block:.2f}, ulysses {ulysses:.2f}; planned {f.block}, {f.ulysses}"
    assert 0.5 * f.ulysses <= ulysses <= f.ulysses, said
    assert 0.9 * f.block <= block <= f.block, said
