"""The block ring's CUDA order rules, checked on CPU through ``RecordingOps`` (pure, seconds).

A HunyuanVideo-like toy (two block kinds of different shapes) runs in `sequence` mode on two CPU
ranks that the recording layer calls ``cuda:0`` and ``cuda:1``. Its blocks are owned by ``cuda:0``
(doubles 0-1, patched on the owner's stream just before the forward), by the RAM-held share in
pageable memory (doubles 2-5), by ``cuda:1`` (singles 0-1) and by pinned host memory (singles 2-3),
so each rank streams blocks of both kinds from GPU, pageable and pinned owners. The log must show,
per block: copy(g+1) queued after compute(g) was launched, compute(g) ordered after copy(g), every
buffer refilled only after its reader, every host->GPU copy reading pinned memory, a ring per
block kind; and removing any one of ``seq_stream.ORDER_WAITS`` must make the race check fail.
"""
import pytest
import torch
from harness.toy_seq import MMDouble, MMSingle, SeqToyMMDiT

from sharddit.parallel.sequence import stream as seq_stream
from sharddit.parallel.sequence.engine import attach_sequence_engine
from sharddit.parallel.sequence.ops import flat_size
from sharddit.parallel.sequence.record import RecordingOps
from sharddit.parallel.sequence.split import TokenSpec
from sharddit.parallel.sequence.stream import ORDER_WAITS, BlockStream, without_wait
from sharddit.parallel.sequence.threads import RankThreads
from sharddit.parallel.blocks.sharding import attach_block_sharding
from sharddit.parallel.blocks.routing import BlockLayout

MM = BlockLayout(("double_blocks", "single_blocks"), (("img", "txt"), ("x",)))
MM_SPEC = (TokenSpec({"img": 1, "pe": 2}, replicated_streams=("txt",), tail_stream="txt",
                     must_be_none=("modulation_dims_img",)),
           TokenSpec({"x": 1, "pe": 2}, tail_stream="txt", must_be_none=("modulation_dims",)))
RANKS = ("cuda:0", "cuda:1")
OWNERS = {"double_blocks": ["cuda:0"] * 2 + ["cpu"] * 4, "single_blocks": ["cuda:1"] * 2 + ["cpu-pinned"] * 2}


def _model():
    torch.manual_seed(0)
    return SeqToyMMDiT(dim=32, heads=4, n_double=6, n_single=4).eval()


def _inputs():
    torch.manual_seed(1)
    return torch.randn(1, 11, 8), torch.rand(1), torch.randn(1, 5, 32)


def _engine(model, rec=None):
    """(blocks by list, sharding handle, sequence engine) on two CPU ranks; with ``rec`` the blocks
    sit on ``OWNERS``' places and the ranks' streams are recorded as ``cuda:0`` and ``cuda:1``."""
    n = len(model.double_blocks) + len(model.single_blocks)
    blocks = {path: list(getattr(model, path)) for path in OWNERS}
    if rec is not None:
        for path, places in OWNERS.items():
            for block, place in zip(blocks[path], places, strict=True):
                rec.put(block, place)
    handle = attach_block_sharding(model, MM, ["cpu"] * n, "cpu")
    engine = attach_sequence_engine(handle.router, [p for pl in handle.proxies.values() for p in pl], MM_SPEC,
                                    ["cpu", "cpu"], timeout_s=30)
    if rec is not None:
        engine.streams = [BlockStream("cpu", ops=rec, place=p) for p in RANKS]
    return blocks, handle, engine


def _forward(model, rec=None, forwards=1):
    """Sequence forwards on two CPU ranks (recorded as two GPUs when ``rec`` is given): the output,
    the engine's block streams and the engine."""
    blocks, handle, engine = _engine(model, rec)
    streams = engine.streams
    try:
        for _ in range(forwards):
            if rec is not None:  # ComfyUI patching the GPU owners' weights just before the forward
                for path, places in OWNERS.items():
                    for block, place in zip(blocks[path], places, strict=True):
                        if place.startswith("cuda"):
                            rec.kernel(rec.current_stream(place), writes=list(block.parameters()), label="patch")
            with torch.no_grad(), handle.router.forward_scope(sequence=True):
                out = model(*_inputs())
    finally:
        engine.close()  # releases the rings (recorded)
        handle.detach()
    return out, streams, engine


def test_order_rules_hold_and_numerics_match_the_plain_ring():
    plain, _, _ = _forward(_model())
    rec = RecordingOps()
    out, streams, engine = _forward(_model(), rec, forwards=2)
    assert torch.equal(out, plain)  # the same copies and GEMM shapes: bit for bit
    assert rec.violations() == []
    assert engine.stats.bytes_streamed[0] > 0 and engine.stats.bytes_streamed[1] > 0
    log = rec.log
    for place in RANKS:
        computes = [(i, o) for i, o in enumerate(log) if o.kind == "compute" and o.actor == f"{place}/current"]
        copies = [(i, o) for i, o in enumerate(log) if o.kind == "copy" and o.actor.startswith(f"{place}/side")]
        assert len(computes) >= 2 * 8 and copies
        for ci, comp in computes:
            g = int(comp.label.split()[1])
            mine = [(i, o) for i, o in copies if o.label == f"copy {g}" and i < ci]
            assert mine and rec._before(mine[-1][1], comp), f"{place}: compute {g} not ordered after its copy"
            nxt = [i for i, o in copies if o.label == f"copy {g + 1}" and i > ci]
            before = [i for i, o in copies if o.label == f"copy {g + 1}" and mine[-1][0] < i < ci]
            assert not before, f"{place}: copy {g + 1} queued before compute {g} was launched"
            if g + 1 < 10 and _streamed(place, g + 1):
                assert nxt, f"{place}: block {g + 1} never copied after compute {g}"
    for o in log:
        if o.kind == "copy":
            assert o.src_place != "cpu", f"{o.label} read pageable memory"
    assert rec.ops_of("pin") and rec.ops_of("host_copy")  # the RAM-held share went through the bounce


def _streamed(place, g):
    owners = OWNERS["double_blocks"] + OWNERS["single_blocks"]
    return owners[g] != place


def test_each_block_kind_has_its_own_two_buffers():
    rec = RecordingOps()
    model = _model()
    _, streams, _ = _forward(model, rec)
    # released at close; a second ring shows the layout while held
    ring = BlockStream("cpu", ops=rec, place="cuda:9")
    for g, block in enumerate(list(model.double_blocks) + list(model.single_blocks)):
        ring.module_for(g, block)
    kinds = {key[0]: len(bufs) for key, bufs in ring._buffers.items()}
    assert kinds == {MMDouble: 2, MMSingle: 2}
    held = ring.held()
    per = {k: sum(t.numel() * t.element_size() for t in b.parameters()) for k, b in
           ((MMDouble, model.double_blocks[0]), (MMSingle, model.single_blocks[0]))}
    assert held["device"] == 2 * per[MMDouble] + 2 * per[MMSingle]
    assert held["pinned"] == 2 * per[MMDouble]  # only the pageable doubles need a bounce


@pytest.mark.parametrize("wait", ORDER_WAITS)
def test_removing_one_wait_makes_the_race_check_fail(wait):
    rec = RecordingOps()
    with without_wait(wait):
        _forward(_model(), rec, forwards=2)
    assert rec.violations(), f"no race found with {wait!r} removed"
    assert wait not in seq_stream._disabled


def test_without_wait_names_the_waits():
    with pytest.raises(ValueError, match="side_waits_owner"):
        with without_wait("no_such_wait"):
            pass


class _NoBounce(RecordingOps):
    """A ring that would copy straight from pageable memory."""

    def needs_bounce(self, t, dst_place):
        return False


def test_a_copy_from_pageable_memory_is_flagged():
    rec = _NoBounce()
    _forward(_model(), rec)
    assert any("pageable" in v for v in rec.violations())
    assert not rec.ops_of("pin")


def test_worker_threads_run_under_the_main_threads_autocast():
    """Autocast is per thread: a block queued under ComfyUI's ``torch.autocast`` must compute in its
    dtype on the worker too, and a block queued outside it must not."""
    pool = RankThreads(["cpu"], timeout_s=10)
    lin = torch.nn.Linear(4, 4)

    def probe():
        return torch.is_autocast_enabled("cpu"), torch.get_autocast_dtype("cpu"), lin(torch.randn(2, 4)).dtype
    try:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            inside = pool.wait(pool.submit(0, probe), 0)
        outside = pool.wait(pool.submit(0, probe), 0)
    finally:
        pool.close()
    assert inside == (True, torch.bfloat16, torch.bfloat16)
    assert outside[0] is False and outside[2] == torch.float32


class _NoDeepCopy(list):
    """A patch list (ComfyUI's holds every LoRA tensor of the model) that must be shared, not copied."""

    def __deepcopy__(self, memo):
        raise AssertionError("the ring deep-copied a patch")


def test_a_reused_buffer_carries_only_its_own_blocks_patches():
    """ComfyUI's lowvram LoRA patches (``weight_function``) are per layer: a buffer refilled with a
    block that has none must lose the patch of the block it held before (block 0's LoRA applied to
    block 2 was a silent wrong result), and one that has one must get exactly that one."""
    rec = RecordingOps()
    blocks = [torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 4)) for _ in range(4)]
    for b in blocks:
        rec.put(b, "cuda:0")
    patch0, patch3 = _NoDeepCopy([lambda w: w * 2]), [lambda w: w * 3]
    blocks[0][1].weight_function = patch0
    blocks[0][1].comfy_cast_weights = True
    blocks[3][0].bias_function = patch3
    ring = BlockStream("cpu", ops=rec, place="cuda:1")
    mods = []
    for g, block in enumerate(blocks):
        mods.append(ring.module_for(g, block))
        ring.done_with(mods[-1], g)
        if g == 0:
            assert mods[0][1].weight_function is patch0 and "weight_function" not in mods[0][0].__dict__
    assert mods[2] is mods[0] and mods[3] is mods[1]  # two buffers, each refilled
    for layer in (0, 1):
        for attr in ("weight_function", "bias_function", "comfy_cast_weights"):
            assert attr not in mods[2][layer].__dict__, f"block 0's {attr} left on block 2's layer {layer}"
    assert mods[3][0].bias_function is patch3 and "weight_function" not in mods[3][1].__dict__
    ring.begin_forward({})
    again = ring.module_for(0, blocks[0])
    assert again[1].weight_function is patch0 and again[1].comfy_cast_weights is True
    del blocks[0][1].weight_function  # ComfyUI unpatched the LoRA: the next forward's copy has none
    ring.begin_forward({})
    assert "weight_function" not in ring.module_for(0, blocks[0])[1].__dict__


@pytest.mark.parametrize("pinned_first", [True, False])
def test_the_bounce_is_decided_per_tensor(pinned_first):
    """A block partly in pinned memory (ComfyUI pins some tensors): only its pageable tensors go
    through the bounce buffer, its pinned ones are read where they are, whichever comes first."""
    rec = RecordingOps()
    block = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 4))
    rec.put(block, "cpu")
    rec.put(block[0] if pinned_first else block[1], "cpu-pinned")
    ring = BlockStream("cpu", ops=rec, place="cuda:1")
    module = ring.module_for(0, block)
    assert rec.violations() == []  # no copy read pageable memory
    staged = [o for o in rec.log if o.kind == "host_copy"]
    assert len(staged) == 1 and len(staged[0].reads) == 2, "exactly the pageable layer's weight and bias staged"
    assert all(torch.equal(a, b) for a, b in zip(module.parameters(), block.parameters(), strict=True))
    assert ring.held()["pinned"] == flat_size(list(block.parameters()))  # one flat buffer for the block
    ring.release()
    assert rec.ops_of("unpin")


def _resident_run(model, rec, budget, change=None, forwards=3):
    """``forwards`` recorded forwards with each rank keeping up to ``budget`` bytes resident; after
    the first, ``change(blocks)`` may patch an owner's block (in place, or by replacing a tensor).
    Per forward: (output, streamed bytes per rank)."""
    blocks, handle, engine = _engine(model, rec)
    engine.keep_resident([budget, budget])
    out = []
    try:
        for f in range(forwards):
            if f == 1 and change is not None:
                with torch.no_grad():
                    change(blocks)
            with torch.no_grad(), handle.router.forward_scope(sequence=True):
                y = model(*_inputs())
            out.append((y, list(engine.stats.bytes_streamed)))  # the stats are the forward's once it ended
    finally:
        engine.close()
        handle.detach()
    return out, engine


def test_resident_copies_stream_nothing_after_the_first_forward():
    """Issue 34: a rank with room keeps the blocks it streams. The first forward copies them; later
    forwards copy nothing and give the same output bit for bit; the order rules still hold; closing
    the engine frees them."""
    rec = RecordingOps()
    runs, engine = _resident_run(_model(), rec, budget=1 << 30)
    plain = _forward(_model())[0]
    assert all(torch.equal(o, plain) for o, _ in runs)
    assert all(b > 0 for b in runs[0][1]) and runs[1][1] == [0, 0] and runs[2][1] == [0, 0], [s for _, s in runs]
    assert rec.violations() == []
    assert all(s.held()["resident"] == 0 for s in engine.streams)  # released at close


@pytest.mark.parametrize("how", ["in place", "replaced"])
def test_a_changed_block_is_copied_again(how):
    """ComfyUI patches a block's weights between prompts (a LoRA): in place, or by replacing the
    tensor. The resident copy of that block, and only that one, is copied again: the output equals a
    model changed the same way and run on the plain ring."""
    def change(blocks):
        w = blocks["double_blocks"][0].img_o.weight  # owned by cuda:0: cuda:1 keeps a copy of it
        if how == "in place":
            w.add_(0.05)
        else:
            blocks["double_blocks"][0].img_o.weight = torch.nn.Parameter(w + 0.05, requires_grad=False)
    rec = RecordingOps()
    runs, _ = _resident_run(_model(), rec, budget=1 << 30, change=change)
    ref_model = _model()
    with torch.no_grad():
        change({"double_blocks": list(ref_model.double_blocks)})
    ref = _forward(ref_model)[0]
    nbytes = sum(t.numel() * t.element_size() for t in _model().double_blocks[0].parameters())
    assert torch.equal(runs[1][0], ref) and torch.equal(runs[2][0], ref)
    assert runs[1][1] == [0, nbytes] and runs[2][1] == [0, 0], [s for _, s in runs]


def test_a_small_budget_keeps_what_fits_and_streams_the_rest():
    rec = RecordingOps()
    model = _model()
    single = sum(t.numel() * t.element_size() for t in model.single_blocks[0].parameters())
    runs, _ = _resident_run(model, rec, budget=2 * single)
    plain = _forward(_model())[0]
    assert all(torch.equal(o, plain) for o, _ in runs)
    first, later = runs[0][1], runs[2][1]
    assert all(0 < b < a for a, b in zip(first, later, strict=True)), (first, later)
