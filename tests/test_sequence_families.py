"""`sequence` on the 2026 families' layouts, on toys (pure torch, every CPU kind): MiniMax H3's packed
rows without a batch dimension and their modulation ranges (``TokenSpec.unbatched``, ``row_tables``),
Kandinsky 5's text blocks run whole before its visual blocks split (``TokenSpec.whole``), LTX-2.3's
(video, audio) pair with the audio whole on every rank and per-frame timesteps (``whole_parts``,
``frame_tables``, ``gather_kv``). Each against
the unsharded toy within the toy bound (a rank's rows are fewer GEMM rows than the whole sequence's);
the ComfyUI classes themselves are in test_minimax_h3_comfy.py and test_families_comfy.py.
"""
import pytest
import torch
from harness.numerics import assert_split_close
from harness.toy_families import (
    AV_SPEC,
    PACKED_SPEC,
    AVToy,
    PackedToy,
    TextThenVisualToy,
)
from sharddit.parallel.blocks.sharding import attach_block_sharding
from sharddit.parallel.blocks.routing import BlockLayout
from sharddit.parallel.sequence.engine import attach_sequence_engine
from sharddit.parallel.sequence.split import TokenSpec

PACKED = BlockLayout(("blocks",), (("x",),))
PACKED_SPECS = (TokenSpec(PACKED_SPEC, unbatched=True, row_tables=("mod_segments",)),)
TWO_LISTS = BlockLayout(("text_blocks", "visual_blocks"), (("x",), ("visual_embed",)))
AV = BlockLayout(("transformer_blocks",), (("x",),))
AV_SPECS = (TokenSpec(**AV_SPEC),)
TWO_LISTS_SPECS = (TokenSpec(whole=True), TokenSpec({"visual_embed": 1, "freqs": 2}))


def _shard(model, layout, specs, ranks):
    n = sum(len(getattr(model, p)) for p in layout.block_lists)
    handle = attach_block_sharding(model, layout, [ranks[g * len(ranks) // n] for g in range(n)], "cpu")
    proxies = [p for pl in handle.proxies.values() for p in pl]
    return handle, attach_sequence_engine(handle.router, proxies, specs, ranks, timeout_s=30)


def _split_and_whole(model, inputs, layout, specs, ranks):
    """(sequence output, unsharded output, handle, engine) of ``model(*inputs)`` on ``ranks`` CPU ranks."""
    with torch.no_grad():
        ref = model(*inputs)
    handle, engine = _shard(model, layout, specs, ["cpu"] * ranks)
    with torch.no_grad(), handle.router.forward_scope(sequence=True):
        out = model(*inputs)
    return out, ref, handle, engine


@pytest.mark.parametrize("ranks", [2, 3])
def test_packed_rows_split_like_the_whole_sequence(ranks):
    """5 text rows + 3 frames of 6 video rows = 23 rows over 2 or 3 ranks: the cuts fall inside the
    text range and inside frames, so the renumbered modulation ranges are exercised."""
    torch.manual_seed(0)
    model = PackedToy(dim=32, heads=4, n_blocks=4).eval()
    inputs = torch.randn(1, 3, 6, 8), torch.rand(1), torch.randn(1, 5, 16)
    out, ref, handle, engine = _split_and_whole(model, inputs, PACKED, PACKED_SPECS, ranks)
    assert_split_close(out, ref, what=f"packed rows over {ranks} ranks")
    st = engine.stats
    assert st.fallbacks == 0 and st.blocks_run == [4] * ranks and st.exchanges == [8] * ranks
    engine.close()
    handle.detach()


@pytest.mark.parametrize("ranks,batch", [(2, 1), (2, 2), (3, 2)])
def test_text_blocks_run_whole_and_visual_blocks_split(ranks, batch):
    torch.manual_seed(0)
    model = TextThenVisualToy(dim=32, heads=4).eval()
    inputs = torch.randn(batch, 11, 8), torch.rand(batch), torch.randn(batch, 5, 16)
    out, ref, handle, engine = _split_and_whole(model, inputs, TWO_LISTS, TWO_LISTS_SPECS, ranks)
    assert_split_close(out, ref, what=f"text then visual, {ranks} ranks, batch {batch}")
    st = engine.stats
    assert st.fallbacks == 0 and st.blocks_run == [4] * ranks  # the 4 visual blocks, on every rank
    assert handle.router.stats.blocks_run == 2  # the 2 text blocks, whole, on their owners
    engine.close()
    handle.detach()


@pytest.mark.parametrize("ranks,batch", [(2, 1), (3, 1), (3, 2), (2, 2)])
def test_video_split_audio_whole_like_the_whole_pair(ranks, batch):
    """3 frames of 6 video tokens: over 2 ranks the cut falls mid-frame (9 + 9: a row per token), over
    3 on frame boundaries (a row per frame); each frame has its own timestep, so a rank reading
    another frame's rows is seen. Both outputs (video, audio) against the unsharded toy. Per block a
    group exchanges 4 times: Ulysses q/k/v and output, then the video->audio attention's video
    keys/values by heads and its output."""
    torch.manual_seed(0)
    model = AVToy(dim=32, heads=4, n_blocks=3).eval()
    inputs = (torch.randn(batch, 3, 6, 8), torch.randn(batch, 5, 8)), torch.rand(batch, 3), torch.randn(batch, 4, 16)
    out, ref, handle, engine = _split_and_whole(model, inputs, AV, AV_SPECS, ranks)
    for a, b, what in zip(out, ref, ("video", "audio"), strict=True):
        assert_split_close(a, b, what=f"LTX-2.3-shaped {what}, {ranks} ranks, batch {batch}")
    st = engine.stats
    one_group = batch == 1 or ranks == 3
    assert st.fallbacks == 0 and st.blocks_run == [3] * ranks
    assert st.exchanges == ([12] * ranks if one_group else [0] * ranks), st.exchanges
    engine.close()
    handle.detach()


class _NotLocal:
    """A runner that is not ``LocalRanks`` (as ``DistRanks`` is not)."""

    def close(self):
        pass


def test_cross_modal_heads_over_worker_processes_run_whole():
    """The video->audio split (``TokenSpec.gather_kv``) runs on the engine's own threads only; with
    ranks in worker processes (any runner but ``LocalRanks``: ``DistRanks``) each block call runs
    whole (`blocks`), saying why: the unsharded result, bit for bit."""
    torch.manual_seed(0)
    model = AVToy(dim=32, heads=4, n_blocks=2).eval()
    inputs = (torch.randn(1, 2, 6, 8), torch.randn(1, 5, 8)), torch.rand(1, 2), torch.randn(1, 4, 16)
    with torch.no_grad():
        ref = model(*inputs)
    handle, engine = _shard(model, AV, AV_SPECS, ["cpu", "cpu"])
    engine.use_runner(_NotLocal())  # stands for DistRanks: never asked for anything but close
    with torch.no_grad(), handle.router.forward_scope(sequence=True):
        out = model(*inputs)
    assert all(torch.equal(a, b) for a, b in zip(out, ref, strict=True))
    assert engine.stats.fallbacks == 2 and handle.router.stats.blocks_run == 2
    engine.close()
    handle.detach()
