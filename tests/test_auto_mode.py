"""``parallel=auto`` at sampling time: the memory rule refined by the cost model per latent (pure).

Wan 2.1 14B shape from ComfyUI's config (the simulator preset); latents as ComfyUI's sampler
feeds the DiT: (batch, 16, latent frames, height / 8, width / 8), batch 2 = cond + uncond.
"""
import pytest

from sharddit.parallel.families import shape_from_spec
from sharddit.parallel.cost.mode import ModeDecision, decide_auto_for_latent, workload_from_latent

SEQ = ModeDecision("sequence", "sequence: 2 GPUs each hold their share plus two streamed blocks")
TWO = ["cuda:0", "cuda:1"]
NAMES = {"cuda:0": "NVIDIA GeForce RTX 4090", "cuda:1": "NVIDIA GeForce RTX 4090"}


@pytest.fixture(scope="module")
def wan14b():
    from sharddit.loaders.plan.presets import PRESETS

    return shape_from_spec(PRESETS["wan2.1-t2v-14b"])


def test_latent_maps_back_to_the_video_size(wan14b):
    work = workload_from_latent(wan14b, (2, 16, 21, 90, 160))
    assert (work.width, work.height, work.frames, work.batch) == (1280, 720, 81, 2)
    assert work.tokens == 21 * 45 * 80
    with pytest.raises(ValueError, match=r"\(1, 16, 90, 160\) is not \(batch, channels, frames"):
        workload_from_latent(wan14b, (1, 16, 90, 160))


@pytest.mark.parametrize("batch", [1, 2])
def test_720p_on_two_4090s_keeps_sequence_and_says_why(wan14b, batch):
    d = decide_auto_for_latent(SEQ, wan14b, (batch, 16, 21, 90, 160), TWO, [20, 20], NAMES)
    assert d.mode == "sequence"
    speedup = float(d.reason.split("predicted ")[1].split("×")[0])
    assert speedup >= (1.8 if batch == 1 else 1.9)
    assert "blocks 1.00×" in d.reason and "memory: sequence: 2 GPUs" in d.reason
    assert "link 12 GB/s assumed" in d.reason  # the stated default


def test_tiny_latent_on_a_slow_link_falls_back_to_blocks(wan14b):
    """One latent frame of 256x256 (256 tokens) over 0.5 GB/s: streaming a 0.65 GiB block takes
    longer than computing it, so sequence is slower than blocks and auto says so."""
    d = decide_auto_for_latent(SEQ, wan14b, (1, 16, 1, 32, 32), TWO, [20, 20], NAMES, link_gbps=0.5)
    assert d.mode == "blocks" and d.reason.startswith("blocks: predicted")
    assert "sequence 0." in d.reason  # its predicted speed-up, below 1


def test_memory_rule_blocks_stands(wan14b):
    mem = ModeDecision("blocks", "blocks: cuda:1 has 0.3 GiB left after its share")
    assert decide_auto_for_latent(mem, wan14b, (2, 16, 21, 90, 160), TWO, [20, 20], NAMES) is mem


def test_unknown_gpu_names_count_as_the_stated_default(wan14b):
    d = decide_auto_for_latent(SEQ, wan14b, (1, 16, 21, 90, 160), TWO, [20, 20], {"cuda:0": "spec"})
    assert d.mode == "sequence" and "per RTX 4090" in d.reason
