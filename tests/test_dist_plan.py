"""What `plan` says about worker devices and the network (parallel/cost/workers.py; pure, CPU, no ComfyUI)."""
import itertools
from types import SimpleNamespace as R

import pytest
from sharddit.parallel.families import shape_from_config
from sharddit.parallel.cost.model import Workload
from sharddit.parallel.distributed.members import choose_worker_weights
from sharddit.parallel.cost.workers import compute_network_step, compute_worker_needs, parse_net_gbps, split_worker_spec

GiB = 2**30
WAN14B = shape_from_config("wan2.1-14b", "wan", {"dim": 5120, "num_heads": 40, "ffn_dim": 13824, "num_layers": 40},
                           spatial=8, temporal=4, text_tokens=512)


def test_worker_spec_splits_host_devices_from_worker_devices_with_their_free_memory():
    assert split_worker_spec("cuda:0=24GiB,box2/cuda:0=20GiB,box3/cuda:1") == (
        "cuda:0=24GiB", (("box2", "cuda:0", 20 * GiB), ("box3", "cuda:1", None)))
    assert split_worker_spec("cuda:0,cuda:1") == ("cuda:0,cuda:1", ())
    with pytest.raises(ValueError, match=r"^\[ShardDiT\] devices 'cuda:0=24GiB,box2/cuda:0=lots': 'box2/cuda:0=lots': "
                                         r"size 'lots' is not a size like '24GiB'") as err:
        split_worker_spec("cuda:0=24GiB,box2/cuda:0=lots")
    assert str(err.value).count("[ShardDiT]") == 1, str(err.value)
    with pytest.raises(ValueError, match=r"lists only worker devices.*e\.g\. 'cpu,box2/cuda:0"):
        split_worker_spec("box2/cuda:0=24GiB")
    with pytest.raises(ValueError, match=r"'bad name/cuda:0' is not NAME/DEVICE"):
        split_worker_spec("cuda:0,bad name/cuda:0")


@pytest.mark.parametrize("mode", ["auto", "share", "all"])
def test_worker_needs_agree_with_the_check_that_refuses_the_prompt(mode):
    """Blocks of 1 GiB (8 of them); worker shares 4-5 and 6-7. Under `share` a worker must hold
    2 + 4 = 6 GiB, under `all` 8 + 2 = 10 GiB. For every mix of free memory, the plan's keep_all and
    GiB missing are those of ``dist_host.choose_worker_weights`` (which raises when one is short)."""
    blocks = [GiB] * 8
    ranges = [(4, 6), (6, 8)]
    for free1, free2 in itertools.product([5 * GiB, 6 * GiB, 9 * GiB, 10 * GiB, None], repeat=2):
        workers = (("w1", "cuda:0", free1), ("w2", "cuda:1", free2))
        keep_all, why, needs = compute_worker_needs(mode, workers, ranges, blocks)
        offers = {n: ({"devices": {d: f}} if f is not None else {}) for n, d, f in workers}
        remote = tuple((n, d) for n, d, _ in workers)
        short = [n for n in needs if not n.fits]
        assert [n.share_bytes for n in needs] == [2 * GiB, 2 * GiB]
        assert {n.need_bytes for n in needs} == {10 * GiB if keep_all else 6 * GiB}
        if short:
            with pytest.raises(ValueError) as err:
                choose_worker_weights(mode, remote, [R(start=a, stop=b) for a, b in ranges], blocks, offers)
            for n in short:
                assert f"{n.name} ({n.device}): needs {n.need_bytes / GiB:.2f} GiB" in str(err.value)
                assert f"{n.short_bytes / GiB:.2f} GiB missing" in str(err.value)
        else:
            assert choose_worker_weights(mode, remote, [R(start=a, stop=b) for a, b in ranges], blocks,
                                         offers) == (keep_all, why)


def test_auto_keeps_every_block_only_when_every_worker_states_room_for_it():
    blocks, ranges = [GiB] * 8, [(4, 8)]
    assert compute_worker_needs("auto", (("w1", "cuda:0", 10 * GiB),), ranges, blocks)[0] is True
    keep_all, why, (need,) = compute_worker_needs("auto", (("w1", "cuda:0", None),), ranges, blocks)
    assert not keep_all and why.startswith("auto -> share") and need.fits and need.free_bytes is None
    with pytest.raises(ValueError, match="'most' must be auto, share or all"):
        compute_worker_needs("most", (), [], blocks)


def _wan(cfg, width=832, height=480):
    return Workload(WAN14B, width, height, 81, cfg=cfg)


def test_network_per_step_is_the_blocks_not_owned_plus_the_scatter_at_cfg_above_1():
    """Host + one worker, 20 blocks each, cfg 5 (cond on the host, uncond on the worker: no
    exchange): the worker receives the host's 20 blocks (bf16) and half the hidden state
    (batch 2 x tokens x width x 2 bytes / 2)."""
    work = _wan(5.0)
    block = WAN14B.blocks[0].weight_params * 2
    scatter = work.batch * work.tokens * WAN14B.width * 2 / 2
    net = compute_network_step(work, [1e14, 1e14], [20, 20], False, 10)
    assert net.bytes_per_worker == int(20 * block + scatter)
    assert net.seconds == pytest.approx(net.bytes_per_worker * 8 / 10e9)
    assert 14.3e9 < net.bytes_per_worker < 14.5e9  # the README's 14.4 GB at 480p
    every = compute_network_step(work, [1e14, 1e14], [20, 20], True, 10)
    assert every.bytes_per_worker == int(scatter)  # every worker keeps every block: no weights per step


def test_network_at_cfg_1_adds_the_ulysses_exchange_of_every_block():
    work = _wan(1.0)
    x_per_block = 4 * (1 / 2) * -(-work.tokens // 2) * WAN14B.width * 2
    scatter = work.tokens * WAN14B.width * 2 / 2
    net = compute_network_step(work, [1e14, 1e14], [20, 20], True, 10)
    assert net.bytes_per_worker == int(40 * x_per_block + scatter)


def test_verdict_says_whether_the_link_or_the_gpus_set_the_pace():
    work = _wan(5.0)
    slow = compute_network_step(work, [1e15, 1e15], [20, 20], False, 10)
    assert slow.bound == "link" and slow.seconds > slow.compute_s
    assert slow.verdict.startswith(f"link-bound: {slow.seconds:.1f} s of network per step vs "
                                   f"~{slow.compute_s:.1f} s of compute at 10 Gbit/s")
    fast = compute_network_step(work, [1e13, 1e13], [20, 20], False, 10_000)
    assert fast.bound == "compute" and fast.verdict.startswith("compute-bound: ")
    assert fast.step_s >= fast.compute_s


@pytest.mark.parametrize("text", ["0", "-1", "fast", "inf"])
def test_bad_network_speed_names_the_value_and_an_example(text):
    with pytest.raises(ValueError, match=rf"network speed '{text}' must be a number of Gbit/s > 0, e\.g\. --net-gbps 10"):
        parse_net_gbps(text)
