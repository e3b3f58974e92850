"""Resident blocks on fake GPUs (issue 34): the budgets ComfyUI's side sets from free memory
(``loaders/comfy/shard/resident_budgets.resident_budgets``) decide how many streamed blocks each rank keeps, and
the peak measured with them stays within the GPU.

ComfyUI's Wan 2.1 14B class cut to 8 blocks (bf16, 0.7 GB each), planned 4 + 4 over two fake GPUs,
one cfg-1 `sequence` forward at 832x480x33 with the real engine under the simulator's memory
tracker (as test_memory_plan_fake_gpu). Each GPU's size is chosen so that, with the model loaded,
its free memory leaves room beside the plan (weights, activations, ring, 1 GiB reserve) for less
than one, two and a half, or all four of the blocks it streams: tight, half, full.
"""
from dataclasses import replace

import pytest

pytestmark = pytest.mark.comfy
GiB = 1 << 30
SIZE = (832, 480, 33)
DEVICES = ["cuda:0"] * 4 + ["cuda:1"] * 4


@pytest.fixture(scope="module")
def wan8():
    from sharddit.loaders.comfyui_import import import_comfyui

    import_comfyui()
    from sharddit.loaders.plan import dry_run as simulator
    from sharddit.loaders.plan import presets
    from sharddit.loaders.plan.setup import check_simulation

    spec = presets.resolve_model("wan2.1-t2v-14b")
    spec = replace(spec, unet_config={**spec.unet_config, "num_layers": 8})
    return simulator.context_of(check_simulation(spec, "cpu", *SIZE))


def _gpus(rows, room_blocks: float, block: int):
    """An inventory where each rank's GPU, with its weights loaded, has room for ``room_blocks``
    blocks beside the plan's activations, ring and reserve."""
    from sharddit.parallel.placement.inventory import DeviceInfo, Inventory

    infos = []
    for r in rows:
        total = r.weights + r.activations + r.prefetch + GiB + int(room_blocks * block)
        infos.append(DeviceInfo(r.device, "NVIDIA GeForce RTX 4090", total, total - r.weights))
    return Inventory(tuple(infos), "nvml")


@pytest.mark.parametrize("room,kept", [(0.5, 0), (2.5, 2), (4.2, 4)], ids=["tight", "half", "full"])
def test_resident_counts_follow_free_memory_and_the_peak_stays_within(wan8, room, kept):
    from sharddit.loaders.comfy.shard.resident_budgets import resident_budgets
    from sharddit.loaders.plan.fake_sequence import (
        plan_sequence_peaks,
        run_fake_sequence_forward,
    )
    from sharddit.parallel.cost.resident import resident_per_rank

    ctx = replace(wan8, size=SIZE)
    block = ctx.block_bytes[0]
    rows = plan_sequence_peaks(ctx, 1, DEVICES, "cuda:0")
    inventory = _gpus(rows, room, block)
    budgets = resident_budgets(rows, inventory, GiB, {})
    assert [len(k) for k in resident_per_rank(ctx.block_bytes, DEVICES, ["cuda:0", "cuda:1"], budgets)] == [kept] * 2
    measured = run_fake_sequence_forward(ctx, 1, DEVICES, "cuda:0", resident=budgets)
    for m, r, b in zip(measured, rows, budgets, strict=True):
        assert m.resident == kept * block, (m, b)  # the engine kept what the rule says
        usable = inventory.get(m.device).total_bytes - GiB
        said = f"{m.device}: measured {m.total / GiB:.2f} GiB of {usable / GiB:.2f} usable ({m})"
        assert m.total <= usable, said
        assert m.activations <= r.activations, said  # the plan's activations cover the measured ones
