"""``AutoMode`` (the DiT wrapper's ``parallel=auto``) with ComfyUI's own Wan 2.1 14B config.

The shard state is the part AutoMode reads (memory decision, block ranges); the model config is
ComfyUI's, detected from the preset's unet config. This machine has no GPU, so the inventory has
no names and the stated default GPU is used.
"""
from types import SimpleNamespace

import pytest
import torch

pytestmark = pytest.mark.comfy


@pytest.fixture(scope="module")
def wan14b_config():
    from sharddit.loaders.comfyui_import import import_comfyui

    import_comfyui()
    import comfy.model_detection
    from sharddit.loaders.plan.presets import PRESETS

    return comfy.model_detection.model_config_from_unet_config(dict(PRESETS["wan2.1-t2v-14b"].unet_config))


def _state(mode):
    from sharddit.parallel.cost.mode import ModeDecision
    from sharddit.parallel.placement.plan_types import BlockRange

    plan = SimpleNamespace(block_ranges=[BlockRange("cuda:0", 0, 20), BlockRange("cuda:1", 20, 40)])
    return SimpleNamespace(auto_mode=ModeDecision(mode, f"{mode}: memory rule"), plan=plan)


def test_auto_decides_per_latent_shape_and_logs_once(wan14b_config, caplog):
    from sharddit.loaders.comfy.shard.auto_mode import AutoMode

    auto = AutoMode(_state("sequence"), wan14b_config)
    x = torch.empty(2, 16, 21, 90, 160, device="meta")
    with caplog.at_level("INFO", logger="sharddit"):
        assert auto((x, None, None), {}) == "sequence"
        assert auto((x, None, None), {}) == "sequence"
    lines = [r.getMessage() for r in caplog.records if "parallel auto for latent" in r.getMessage()]
    assert len(lines) == 1 and lines[0].startswith("[ShardDiT] parallel auto for latent 2x16x21x90x160 -> sequence: predicted")
    assert "RTX 4090" in lines[0]  # no GPU names here: the stated default


def test_memory_rule_blocks_is_kept(wan14b_config):
    from sharddit.loaders.comfy.shard.auto_mode import AutoMode

    auto = AutoMode(_state("blocks"), wan14b_config)
    assert auto((torch.empty(2, 16, 21, 90, 160, device="meta"),), {}) == "blocks"


def _core_here():
    import os
    from pathlib import Path

    root = Path(os.environ["COMFYUI_PATH"])
    split = (root / "comfy" / "multigpu.py").exists() and (root / "comfy_extras" / "nodes_multigpu.py").exists()
    return split, "class ModelPatcherDynamic" in (root / "comfy" / "model_patcher.py").read_text()


WAN14B_BYTES = 28_600_000_000  # the whole DiT, bf16 (home ~0.4 GiB)


@pytest.mark.parametrize("memory", ["sequence", "blocks"])
def test_log_names_core_options_as_fast_on_this_comfyui(wan14b_config, caplog, memory):
    """No GPU here: free memory unknown counts as room, so core's CFG split (2 conds on 2 GPUs, a full
    copy each) is as fast as sequence at cfg > 1, and one GPU with dynamic VRAM (everything resident)
    as fast as blocks. On 0.3.64 neither exists and nothing is said. The pick stays ShardDiT's."""
    from sharddit.loaders.comfy.shard.auto_mode import AutoMode

    split, dynamic = _core_here()
    auto = AutoMode(_state(memory), wan14b_config, memory=None, dit_bytes=WAN14B_BYTES, home_bytes=400 << 20)
    with caplog.at_level("INFO", logger="sharddit"):
        assert auto((torch.empty(2, 16, 21, 90, 160, device="meta"),), {}) == memory
    (line,) = [r.getMessage() for r in caplog.records if "parallel auto for latent" in r.getMessage()]
    said_split = "core's CFG split predicted 2.00× (fits: full copy 26.6 GiB per GPU) — as fast as sequence; " \
                 "use it if you prefer core"
    said_dynamic = "one GPU with dynamic VRAM predicted 1.00× (fits: whole model resident) — as fast as blocks"
    assert (said_split in line) == (split and memory == "sequence"), line
    assert (said_dynamic in line) == (dynamic and memory == "blocks"), line
    if not (split or dynamic):
        assert "core" not in line.split(" -> ", 1)[1], line
