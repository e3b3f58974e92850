"""Resident blocks decided again per prompt (issue 34): each sampling run sets the engine's budgets
from the free memory of that run (``resident.apply_resident_budgets``), and ``parallel=auto``
prices `sequence` with the blocks those budgets keep (``auto_mode.AutoMode``), so a prompt whose
free memory changed decides again.

Wan 2.1 14B (ComfyUI's config) planned 20 + 20 over cuda:0 and cuda:1, a short cfg-1 latent
(832x480x5) over a 12 GB/s link: with room for the other GPU's 20 blocks nothing streams and
`sequence` pays (1.5x); with no room each block streams every step, slower than computing it, and
`auto` runs `blocks`. The engine is the real one (two CPU ranks of the MM toy); only its budgets
matter here.
"""
from types import SimpleNamespace

import pytest
import torch
from test_stream_order import _engine, _model

pytestmark = pytest.mark.comfy
GiB = 1 << 30
BLOCK = 702_788_608  # one Wan 14B block, bf16 (fake-GPU measured, test_resident_fake_gpu)


@pytest.fixture(scope="module")
def wan14b_config():
    from sharddit.loaders.comfyui_import import import_comfyui

    import_comfyui()
    import comfy.model_detection
    from sharddit.loaders.plan.presets import PRESETS

    return comfy.model_detection.model_config_from_unet_config(dict(PRESETS["wan2.1-t2v-14b"].unet_config))


def _inventory(free_gib):
    from sharddit.parallel.placement.inventory import DeviceInfo, Inventory

    return Inventory(tuple(DeviceInfo(f"cuda:{i}", "NVIDIA GeForce RTX 4090", 48 * GiB, int(free_gib * GiB))
                           for i in range(2)), "nvml")


def test_each_prompt_decides_again_from_its_free_memory(wan14b_config, caplog):
    from sharddit.loaders.comfy.shard.auto_mode import AutoMode
    from sharddit.loaders.comfy.shard.resident_budgets import apply_resident_budgets
    from sharddit.parallel.cost.memory import RankMemory
    from sharddit.parallel.cost.mode import ModeDecision
    from sharddit.parallel.placement.plan_types import BlockRange

    _, handle, engine = _engine(_model())
    plan = SimpleNamespace(block_ranges=[BlockRange("cuda:0", 0, 20), BlockRange("cuda:1", 20, 40)])
    plan.block_devices = lambda: ("cuda:0",) * 20 + ("cuda:1",) * 20
    state = SimpleNamespace(auto_mode=ModeDecision("sequence", "sequence: memory rule"), plan=plan,
                            footprint=SimpleNamespace(block_bytes=(BLOCK,) * 40), router=SimpleNamespace(engine=engine))
    auto = AutoMode(state, wan14b_config)
    rows = [RankMemory(f"cuda:{i}", 20 * BLOCK, 2 * BLOCK, 2 * GiB) for i in range(2)]
    x = (torch.empty(1, 16, 2, 60, 104, device="meta"),)
    said = []
    try:
        with caplog.at_level("INFO", logger="sharddit"):
            for free in (20, 2, 20):  # GiB free once the models are loaded, per prompt
                budgets = apply_resident_budgets(engine, rows, _inventory(free), GiB)
                said.append((budgets, auto(x, {})))
    finally:
        engine.close()
        handle.detach()
    room = int(20 * GiB - 2 * GiB - 2 * BLOCK - GiB)  # free - activations - ring - reserve
    assert said == [([room, room], "sequence"), ([0, 0], "blocks"), ([room, room], "sequence")], said
    lines = [r.getMessage() for r in caplog.records if "parallel auto for latent" in r.getMessage()]
    assert len(lines) == 2, lines  # the third prompt's budgets were seen before: its decision is reused
    assert "with every block resident on every GPU: nothing streamed after the first step" in lines[0], lines[0]
    assert lines[1].split(" -> ")[1].startswith("blocks: predicted"), lines[1]
