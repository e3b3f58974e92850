"""Tiled decode engine (parallel/tiling/geometry.py, parallel/tiling/runner.py): pure, CPU.

Properties are checked without ComfyUI; agreement with core's ``tiled_scale_multidim`` (positions
and full output, bit for bit) is the one ``comfy`` test and imports core's function.
"""
import math
import threading
import time

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sharddit.parallel import tiling

WAN_T = (lambda a: max(0, a * 4 - 3), 2, 2)  # Wan-style time (4t-3 frames), space x2 (small for CPU)
WAN_I = (4, 2, 2)
FAST = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])


class ToyDecoder(torch.nn.Module):
    """Conv3d to 3 channels, then frames 1 + 4 * (t - 1) and space x2 like ``WAN_T``."""

    def __init__(self, channels=4, seed=0):
        super().__init__()
        torch.manual_seed(seed)
        self.conv = torch.nn.Conv3d(channels, 3, 3, padding=1)

    def forward(self, x):
        y = self.conv(x).repeat_interleave(2, 3).repeat_interleave(2, 4)
        return torch.cat([y[:, :, :1], y[:, :, 1:].repeat_interleave(4, 2)], 2)


class Counting:
    """Wraps a decoder; records batch sizes, input shapes and calling threads."""

    def __init__(self, fn, sleep=0.0):
        self.fn, self.sleep, self.calls, self.threads = fn, sleep, [], set()

    def __call__(self, x):
        self.calls.append(tuple(x.shape))
        self.threads.add(threading.get_ident())
        if self.sleep:
            time.sleep(self.sleep * (1 + (len(self.calls) * 7919) % 3))
        return self.fn(x)


def tile_dependent(x):
    """Decoded value depends on the tile's start (coordinates encoded in channels 0-2)."""
    y = x[:, :3].repeat_interleave(2, 3).repeat_interleave(2, 4)
    y = torch.cat([y[:, :, :1], y[:, :, 1:].repeat_interleave(4, 2)], 2)
    return torch.sin(y + 0.37 * x[:, :3, :1, :1, :1])


def coords(shape):
    """Latent whose channels 0-3 hold t, h, w and the batch index, so tiles know where they are."""
    b, c, t, h, w = shape
    grid = torch.stack(torch.meshgrid(torch.arange(t), torch.arange(h), torch.arange(w), indexing="ij")).float()
    out = torch.zeros(shape)
    out[:, :3] = grid
    out[:, 3] = torch.arange(b).view(b, 1, 1, 1).float()
    return out


@st.composite
def layouts(draw):
    """Random shapes and tiles; Wan-style time gets core's own limits (tile >= 2, overlap >= 1)."""
    wan = draw(st.booleans())
    tile = tuple(draw(st.integers(2 if wan and d == 0 else 1, 6)) for d in range(3))
    overlap = tuple(draw(st.integers(1 if wan and d == 0 else 0, t - 1)) for d, t in enumerate(tile))
    shape = (draw(st.integers(1, 2)), 4) + tuple(draw(st.integers(1, 13)) for _ in range(3))
    return shape, tiling.TileSpec.build(tile, overlap, WAN_T if wan else 2, WAN_I if wan else None)


def weight_map(shape, spec):
    """Sum of feather masks over all tiles (``whole`` tiles count 1)."""
    out = torch.zeros((shape[0], 1) + spec.out_shape(shape, 1)[2:])
    feathers = [spec.feather(d) for d in range(3)]
    for t in tiling.plan_tiles(shape, spec):
        size = tuple(spec.out_len(d, n) for d, n in enumerate(t.size))
        o = out[t.batch:t.batch + 1]
        for d, (s, n) in enumerate(zip(t.out_start, size)):
            o = o.narrow(d + 2, s, n)
        o.add_(1.0 if t.whole else tiling.feather_mask(size, feathers))
    return out


@FAST
@given(layouts())
def test_tiles_cover_every_voxel_inside_bounds(layout):
    shape, spec = layout
    tiles = tiling.plan_tiles(shape, spec)
    out_shape = spec.out_shape(shape, 1)
    for t in tiles:
        for d in range(3):
            assert 0 <= t.start[d] and t.start[d] + t.size[d] <= shape[d + 2] and t.size[d] >= 1
            assert t.out_start[d] + spec.out_len(d, t.size[d]) <= out_shape[d + 2]
    assert [t.index for t in tiles] == list(range(len(tiles)))
    if all(shape[d + 2] > 0 for d in range(3)):
        assert weight_map(shape, spec).min().item() > 0


@FAST
@given(layouts(), st.floats(-3, 3, allow_nan=False))
def test_weights_normalise(layout, value):
    shape, spec = layout
    plan = tiling.plan_decode(shape, spec, 3, 3)
    const = lambda x: torch.full((x.shape[0], 3) + spec.out_shape(x.shape, 3)[2:], value)  # noqa: E731
    out = tiling.run_tiled(torch.zeros(shape), plan, [const])
    assert out.shape == spec.out_shape(shape, 3)
    assert torch.allclose(out, torch.full_like(out, value), atol=1e-5)


@FAST
@given(st.integers(1, 40), st.integers(1, 9), st.integers(0, 8))
def test_dim_tiles_span_the_dimension(size, tile, overlap):
    if overlap >= tile:
        return
    spans = tiling.dim_tiles(size, tile, overlap)
    assert spans[0][0] == 0 and max(s + n for s, n in spans) == size
    for (s0, n0), (s1, _) in zip(spans, spans[1:]):
        assert s0 < s1 <= s0 + n0 - overlap or n0 < tile  # advance, keep the overlap
    assert all(n == tile for s, n in spans if s + tile <= size)


def test_feather_mask_ramps_both_ends():
    m = tiling.feather_mask((9, 5), (3, 8))[0, 0]
    assert torch.allclose(m[:, 2], torch.tensor([1 / 3, 2 / 3, 1, 1, 1, 1, 1, 2 / 3, 1 / 3]))
    assert torch.equal(m[4], torch.ones(5))  # feather 8 >= 5: core skips that dimension


@pytest.mark.parametrize("batch", [1, 2, 3, 5, 100])
def test_decoder_calls_drop_to_ceil_group_over_batch(batch):
    shape, spec = (2, 4, 5, 9, 7), tiling.TileSpec.build((2, 4, 4), (1, 1, 1), WAN_T, WAN_I)
    groups = tiling.group_tiles(tiling.plan_tiles(shape, spec))
    dec = Counting(ToyDecoder())
    plan = tiling.plan_decode(shape, spec, 3, batch)
    tiling.run_tiled(torch.randn(shape), plan, [dec])
    assert len(dec.calls) == sum(math.ceil(len(g) / batch) for g in groups) == len(plan.batches)
    assert sum(c[0] for c in dec.calls) == sum(len(g) for g in groups)
    assert len(groups) > 1 and (batch > 1 or len(dec.calls) == sum(len(g) for g in groups))
    assert max(c[0] for c in dec.calls) <= batch


def test_two_cpu_replicas_equal_one_device():
    shape, spec = (2, 4, 5, 9, 7), tiling.TileSpec.build((2, 4, 4), (1, 2, 1), WAN_T, WAN_I)
    x = torch.randn(shape, generator=torch.Generator().manual_seed(1))
    one = tiling.run_tiled(x, tiling.plan_decode(shape, spec, 3, 1), [ToyDecoder()])
    decs = [Counting(ToyDecoder(), sleep=0.002), Counting(ToyDecoder(), sleep=0.001)]
    two = tiling.run_tiled(x, tiling.plan_decode(shape, spec, 3, 1), decs, devices=["cpu", "cpu"])
    assert torch.equal(one, two)  # same tiles, same blend order, whatever the arrival order
    assert all(len(d.threads) == 1 for d in decs) and decs[0].threads != decs[1].threads
    assert all(d.calls for d in decs)
    batched = tiling.run_tiled(x, tiling.plan_decode(shape, spec, 3, 3), [ToyDecoder(), ToyDecoder()], ["cpu", "cpu"])
    assert (batched - one).abs().max().item() <= 1e-5  # batched convolutions may round differently


def test_whole_sample_is_decoded_without_mask():
    shape, spec = (2, 4, 2, 3, 3), tiling.TileSpec.build((4, 4, 4), (1, 1, 1), WAN_T, WAN_I)
    x, dec = torch.randn(shape), ToyDecoder()
    plan = tiling.plan_decode(shape, spec, 3, 2)
    assert len(plan.batches) == 1 and all(t.whole for t in plan.tiles)
    with torch.no_grad():
        assert torch.equal(tiling.run_tiled(x, plan, [dec]), dec(x))


def test_interrupt_between_batches_stops_and_decoder_stays_usable():
    shape, spec = (1, 4, 5, 9, 7), tiling.TileSpec.build((2, 4, 4), (1, 1, 1), WAN_T, WAN_I)
    x, dec = torch.randn(shape), Counting(ToyDecoder(), sleep=0.01)
    plan = tiling.plan_decode(shape, spec, 3, 1)
    progress, checks = [], []

    def check():
        checks.append(1)
        if len(progress) >= 2:
            raise KeyboardInterrupt("stop")

    with pytest.raises(KeyboardInterrupt):
        tiling.run_tiled(x, plan, [dec, dec], ["cpu", "cpu"], on_batch=lambda d, t: progress.append((d, t)),
                         check_interrupt=check)
    assert len(dec.calls) < len(plan.batches) and progress[:2] == [(1, len(plan.batches)), (2, len(plan.batches))]
    assert not [t for t in threading.enumerate() if t.name.startswith("sharddit-vae")]
    ref = tiling.run_tiled(x, plan, [ToyDecoder()])
    assert torch.equal(tiling.run_tiled(x, plan, [dec]), ref)


def test_worker_error_is_reraised_and_workers_stop():
    shape, spec = (1, 4, 5, 9, 7), tiling.TileSpec.build((2, 4, 4), (1, 1, 1), WAN_T, WAN_I)
    calls = []

    def failing(x):
        calls.append(1)
        if len(calls) == 3:
            raise RuntimeError("CUDA out of memory (simulated)")
        return ToyDecoder()(x)

    with pytest.raises(RuntimeError, match="simulated"):
        tiling.run_tiled(torch.randn(shape), tiling.plan_decode(shape, spec, 3, 1), [failing])
    assert not [t for t in threading.enumerate() if t.name.startswith("sharddit-vae")]


@pytest.mark.parametrize("tile,overlap,match", [((2, 4, 4), (2, 1, 1), "overlap 2 >= tile 2"),
                                                ((2, 4, 4), (1, 5, 1), "overlap 5 >= tile 4"),
                                                ((0, 4, 4), (0, 1, 1), "tile >= 1")])
def test_bad_tiles_raise_with_numbers(tile, overlap, match):
    with pytest.raises(ValueError, match=match):
        tiling.plan_tiles((1, 4, 5, 9, 7), tiling.TileSpec.build(tile, overlap, WAN_T, WAN_I))


def test_causal_time_without_overlap_raises_instead_of_gaps():
    spec = tiling.TileSpec.build((2, 4, 4), (0, 1, 1), WAN_T, WAN_I)  # core would leave NaN frames 5..7
    with pytest.raises(ValueError, match="positions 5..7 of dim 0 undecoded"):
        tiling.plan_tiles((1, 4, 5, 4, 4), spec)
    # fits one tile: no gap, one whole tile covering the sample, decoded as core does (no mask)
    assert [(t.index, t.batch, t.start, t.size, t.out_start, t.whole) for t in tiling.plan_tiles((1, 4, 2, 4, 4), spec)] \
        == [(0, 0, (0, 0, 0), (2, 4, 4), (0, 0, 0), True)]


@pytest.mark.parametrize("frames_per_latent,space", [(8, 32), (4, 16)])  # LTX-2 (8t-7, x32), HunyuanVideo 1.5 (4t-3, x16)
def test_causal_video_vaes_of_2026_tile_every_frame(frames_per_latent, space):
    """Core's VAEDecodeTiled forces temporal tile >= 2, overlap >= 1: then every frame is decoded."""
    k = frames_per_latent
    spec = tiling.TileSpec.build((2, 3, 3), (1, 1, 1), (lambda a: max(0, a * k - (k - 1)), space, space), (k, space, space))
    shape = (1, 4, 6, 5, 4)
    assert spec.out_shape(shape, 3) == (1, 3, 5 * k + 1, 5 * space, 4 * space)
    weights = weight_map(shape, spec)
    assert weights.min() > 0  # no output voxel left undecoded
    with pytest.raises(ValueError, match=f"positions {k + 1}..{2 * k - 1} of dim 0 undecoded"):
        tiling.plan_tiles(shape, tiling.TileSpec.build((2, 3, 3), (0, 1, 1), spec.upscale, spec.index))


def test_bad_shapes_and_batch_sizes_raise():
    spec = tiling.TileSpec.build((2, 4, 4), (1, 1, 1), WAN_T, WAN_I)
    with pytest.raises(ValueError, match="has 4 dims"):
        tiling.plan_tiles((1, 4, 9, 7), spec)
    for bad in (0, -1, 1.5):
        with pytest.raises(ValueError, match="tile_batch_size"):
            tiling.plan_decode((1, 4, 5, 9, 7), spec, 3, bad)
    with pytest.raises(ValueError, match="do not match"):
        tiling.run_tiled(torch.zeros(1, 4, 5, 9, 8), tiling.plan_decode((1, 4, 5, 9, 7), spec, 3, 1), [ToyDecoder()])


@pytest.mark.comfy
@FAST
@given(layouts(), st.integers(1, 4))
def test_agrees_with_core_tiled_scale_multidim(layout, batch):
    from harness.comfy_env import load_comfy

    load_comfy()
    import comfy.utils

    shape, spec = layout
    if spec.upscale[0] != 2:
        dec = tile_dependent
    else:  # integer time scale x2
        def dec(x):
            y = x[:, :3].repeat_interleave(2, 2).repeat_interleave(2, 3).repeat_interleave(2, 4)
            return torch.sin(y + 0.37 * x[:, :3, :1, :1, :1])
    x = coords(shape)
    seen = []
    core = comfy.utils.tiled_scale_multidim(
        x, lambda s: (seen.append((int(s[0, 3, 0, 0, 0]),) + tuple(int(v) for v in s[0, :3, 0, 0, 0])
                                  + (tuple(s.shape[2:]),)), dec(s))[1],
        tile=spec.tile, overlap=spec.overlap, upscale_amount=spec.upscale, out_channels=3,
        index_formulas=spec.index)
    assert seen == [(t.batch,) + t.start + (t.size,) for t in tiling.plan_tiles(shape, spec)]
    got = tiling.run_tiled(x, tiling.plan_decode(shape, spec, 3, batch), [dec, dec], ["cpu", "cpu"])
    assert got.shape == core.shape and torch.equal(got, core)


# ----------------------------------------------------------------------------- decoder devices
def test_decoder_devices_bounded_by_work_and_memory():
    from sharddit.parallel.tiling.replicas import (MAX_DECODE_DEVICES, check_decode_device_count,
                                                   select_decoder_devices)

    mib = 2**20
    # 500 cpu entries, one decoder call: only the VAE itself decodes.
    kept, out = select_decoder_devices(["cpu"] * 500, [0] + [100 * mib] * 499, 1, {"cpu": 10**12})
    assert kept == [0] and len(out) == 499 and out[0] == ("cpu", "only 1 decoder call to make")
    # 3 calls but room for one 100 MiB copy on cpu: the 3rd entry is left out for memory.
    kept, out = select_decoder_devices(["cpu", "cpu", "cpu"], [0, 100 * mib, 100 * mib], 3, {"cpu": 150 * mib})
    assert kept == [0, 1] and out == [("cpu", "a VAE copy needs 100 MiB, 50 MiB free")]
    # cuda:1 has no room, cuda:2 has: cuda:2 takes the place.
    kept, out = select_decoder_devices(["cuda:0", "cuda:1", "cuda:2"], [0, 100 * mib, 100 * mib], 2,
                                       {"cuda:0": 0, "cuda:1": mib, "cuda:2": 200 * mib})
    assert kept == [0, 2] and out[0][0] == "cuda:1"
    check_decode_device_count(MAX_DECODE_DEVICES)
    with pytest.raises(ValueError, match="500 entries"):
        check_decode_device_count(500)
