"""`sequence` shares by each GPU's speed (issue 34, part 2), through ShardDiT's KSampler in real ComfyUI.

``devices`` weights (``cpu:3,cpu:1``) make the first rank take 3/4 of the tokens and heads; the
sampled latent stays within the split bound of core's KSampler (each rank still gets one contiguous
token range). Without weights the shares follow the GPUs' throughputs by NVML name, or stay even.
"""
import logging

import pytest
import torch

pytestmark = pytest.mark.comfy


def test_device_weights_shape_the_sequence_split(env, tiny, caplog):
    from harness.numerics import COMFY_SPLIT_BOUND, assert_split_close
    from harness.sampling import family, load, ours, stock

    build, shape, extras = family(tiny, "wan21")
    model = load(env, build())
    latent = torch.zeros(shape)
    ref = stock(env, model, latent, extras, cfg=1.0)
    with caplog.at_level(logging.INFO, logger="sharddit"):
        got = ours(env, model, latent, extras, "cpu:3,cpu:1", cfg=1.0, parallel="sequence")
    (state,) = model.model.__dict__["_sharddit_states"].values()
    stats = state.router.engine.stats
    tokens = [b - a for a, b in stats.tokens]
    assert stats.fallbacks == 0 and tokens[0] == 3 * tokens[1], stats.tokens  # 16 tokens: 12 and 4
    assert "sequence shares of tokens and heads by the devices' weights: cpu 75%, cpu 25%" in caplog.text
    assert_split_close(got, ref, COMFY_SPLIT_BOUND, "Wan 2.1 on cpu:3,cpu:1")


def test_shares_follow_the_gpus_throughput_or_stay_even(env):
    from harness.comfy_env import pack_module

    shares = pack_module(env, "loaders.comfy.shard.sequence_shares")
    inv = pack_module(env, "parallel.placement.inventory")
    parse_device_plan = pack_module(env, "parallel.placement.devices").parse_device_plan
    gib = 1 << 30

    def inventory(*names):
        return inv.Inventory(tuple(inv.DeviceInfo(f"cuda:{i}", n, 32 * gib, 30 * gib) for i, n in enumerate(names)),
                             "nvml")

    speeds, why = shares.rank_speeds(parse_device_plan("cuda:0,cuda:1"), ["cuda:0", "cuda:1"],
                                     inventory("NVIDIA GeForce RTX 5090", "NVIDIA GeForce RTX 4090"))
    assert speeds is not None and abs(speeds[0] / speeds[1] - 209.5 / 165.2) < 1e-9, speeds
    assert "RTX 5090" in why
    for names in (("NVIDIA GeForce RTX 4090",) * 2, ("NVIDIA GeForce RTX 4090", "Some Future GPU")):
        assert shares.rank_speeds(parse_device_plan("auto"), ["cuda:0", "cuda:1"], inventory(*names))[0] is None, names
    assert shares.rank_speeds(parse_device_plan("cuda:0:1,cuda:1:2"), ["cuda:0", "cuda:1"], inventory("A", "B"))[0] == (1.0, 2.0)
    assert shares.rank_speeds(parse_device_plan("cpu,cpu"), ["cpu", "cpu"], None)[0] is None


def test_plan_prices_and_shows_shares_for_mixed_gpus(env, capsys):
    """`plan --gpu "RTX 5090,RTX 4090"` (one name per GPU): the sequence row is priced with shares by
    speed, the decision line says the shares and the gain over an even split, and the heavier rank's
    simulated activations are larger (it computes more tokens). A name count that matches neither
    one nor the GPUs is refused naming both forms."""
    import re

    from sharddit.loaders.cli.main import main

    args = ["plan", "--model", "wan2.1-t2v-14b", "--devices", "cuda:0=32GiB,cuda:1=24GiB", "--size", "832x480",
            "--frames", "81", "--cfg", "1"]
    assert main(args + ["--gpu", "RTX 5090,RTX 4090"]) in (0, 3)
    out = capsys.readouterr().out
    gain = re.search(r"shares by speed: cuda:0 56%, cuda:1 44% of the tokens and heads, predicted ([\d.]+)x an even "
                     r"split", out)
    assert gain and 1.05 < float(gain.group(1)) < 1.2, out
    rows = dict(re.findall(r"^(cuda:\d) \| +[\d.]+ \| +([\d.]+) \| +[\d.]+ \| +[\d.]+ \| +[\d.]+$", out, re.MULTILINE))
    assert float(rows["cuda:0"]) > float(rows["cuda:1"]), out
    assert main(args + ["--gpu", "RTX 4090"]) in (0, 3)
    assert "shares by speed" not in capsys.readouterr().out
    assert main(args + ["--gpu", "RTX 5090,RTX 4090,RTX 3090"]) == 2
    assert "one name for all, or one per GPU" in capsys.readouterr().err
