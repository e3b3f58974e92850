"""Block weights as bytes for worker processes (parallel/distributed/weights.py), the worker shares of a
device list and the worker memory check (pure, CPU)."""
import pytest
import torch
from harness.toy_seq import SeqToyDiT
from sharddit.parallel.placement.devices import parse_device_plan
from sharddit.parallel.distributed.weights import (WeightLayout, WeightRing, bind_flat, block_tensors, empty_block,
                                           pack_block, same_version, skeleton, unpack_into, weights_version)
from sharddit.parallel.distributed.members import check_worker_room
from sharddit.parallel.distributed.ranks import even_owners, transfer_group


def _block():
    torch.manual_seed(0)
    return SeqToyDiT(dim=32, heads=4).eval().blocks[1]


def test_pack_then_bind_or_unpack_gives_the_same_block_bit_for_bit():
    block = _block()
    block.register_buffer("scale", torch.arange(3, dtype=torch.float16))  # a buffer of another dtype
    layout = WeightLayout(block)
    flat = pack_block(block, layout)
    assert flat.dtype == torch.uint8 and flat.numel() == layout.nbytes
    assert layout.nbytes >= sum(t.numel() * t.element_size() for t in block_tensors(block))
    skel = skeleton(block)
    assert all(t.device.type == "meta" for t in block_tensors(skel))
    x, e = torch.randn(1, 6, 32), torch.randn(1, 1, 3, 32)
    freqs, ctx = torch.ones(1, 6, 32), torch.randn(1, 5, 32)
    with torch.no_grad():
        want = block(x, e, freqs, ctx)
        for fill in (bind_flat, unpack_into):
            module = empty_block(skel, "cpu")
            if fill is bind_flat:
                bind_flat(module, flat, layout)
            else:
                unpack_into(flat, layout, module)
            assert all(torch.equal(a, b) for a, b in zip(block_tensors(module), block_tensors(block), strict=True))
            assert torch.equal(module(x, e, freqs, ctx), want)


def test_on_the_fly_patches_are_applied_when_packing_and_not_copied():
    """ComfyUI's lowvram LoRA (``weight_function``) is baked into the bytes; the skeleton carries
    no function (it would drag ComfyUI's whole patch dict along)."""
    block = _block()
    block.o.weight_function = [lambda w: w * 2]
    layout = WeightLayout(block)
    module = empty_block(skeleton(block), "cpu")
    assert "weight_function" not in module.o.__dict__ or module.o.weight_function == []
    unpack_into(pack_block(block, layout), layout, module)
    assert torch.equal(module.o.weight, block.o.weight * 2) and torch.equal(module.qkv.weight, block.qkv.weight)
    block.o.weight_function = [lambda w: w.half()]
    with pytest.raises(RuntimeError, match="changed a tensor to torch.float16"):
        pack_block(block, layout)


def test_weights_version_follows_in_place_changes_and_replacements():
    block = _block()
    v = weights_version(block)
    assert same_version(v, weights_version(block))
    with torch.no_grad():
        block.o.weight.add_(0.0)  # an in-place write, even of zero
    assert not same_version(v, weights_version(block))
    v = weights_version(block)
    block.o.weight = torch.nn.Parameter(block.o.weight.detach().clone())  # a patch that replaces the tensor
    assert not same_version(v, weights_version(block))
    assert not same_version(None, v) and same_version(("k", 1), ("k", 1))


def test_ring_reuses_two_buffers_per_block_shape():
    a, b = _block(), _block()
    layout = WeightLayout(a)
    ring = WeightRing("cpu", "cpu")
    slots = [ring.slot_for(i, skeleton(a), layout) for i in range(4)]
    assert slots[0] is slots[2] and slots[1] is slots[3] and slots[0] is not slots[1]
    assert ring.nbytes == 2 * layout.nbytes
    assert WeightLayout(b).key == layout.key


def test_owners_and_transfer_groups():
    assert even_owners([0, 1, 2, 3, 4], 2) == {0: 0, 1: 0, 2: 0, 3: 1, 4: 1}
    assert transfer_group(0, 1) == ("all", 0)  # the host sends its blocks to every worker
    assert transfer_group(1, 1) is None  # nobody else needs the only worker's blocks (the host has them)
    assert transfer_group(2, 3) == ("workers", 2)  # a worker sends its blocks to the other workers


def test_worker_shares_of_a_device_list():
    def shares(text):
        return parse_device_plan(text).with_worker_shares()

    assert shares("cuda:0,cuda:1,w1/cpu,w2/cpu").text == "cuda:0:1,cuda:1:1,cpu:1,cpu:1"
    assert shares("cuda:0:3,cuda:1:1,w1/cuda:0") == parse_device_plan("cuda:0:3,cuda:1:1,cpu:2")
    assert shares("cuda:0:3,cuda:1:1,w1/cuda:0").text == "cuda:0:3,cuda:1:1,cpu:2"
    assert shares("cpu").text == "cpu" and shares(" AUTO ").text == " AUTO " and shares("auto").auto
    assert shares("cuda:0, w1/cpu").members == () and parse_device_plan("cuda:0").with_worker_shares(2).text == (
        "cuda:0:1,cpu:1,cpu:1")
    with pytest.raises(ValueError, match="auto"):
        shares("auto,w1/cpu")


def test_worker_short_of_memory_is_named_with_the_gib_missing():
    gib = 2**30
    offers = {"w1": {"devices": {"cuda:0": 10 * gib}}, "w2": {"device": "cuda:1", "free": 30 * gib},
              "w3": {"devices": {"cpu": 0}}}
    needs = {"w1": (14 * gib, "blocks 20-39"), "w2": (14 * gib, "blocks 40-59"), "w3": (99 * gib, "x")}
    with pytest.raises(ValueError) as info:
        check_worker_room(needs, offers, {"w1": "cuda:0", "w2": "cuda:1", "w3": "cpu"})
    text = str(info.value)
    assert "w1 (cuda:0): needs 14.00 GiB (blocks 20-39), has 10.00 GiB free: 4.00 GiB missing" in text
    assert "w2" not in text and "w3" not in text  # room enough; free memory not stated
    assert "Add worker devices" in text
    check_worker_room({"w2": (14 * gib, "")}, offers, {"w2": "cuda:1"})


def test_workers_keep_every_block_only_when_every_one_has_room():
    from types import SimpleNamespace as R

    from sharddit.parallel.distributed.members import choose_worker_weights
    gib = 2**30
    blocks = [gib] * 8  # 8 GiB of blocks; a share of 4 + 4 blocks of room = 8 GiB, every block + 2 = 10 GiB
    remote = (("w1", "cuda:0"), ("w2", "cuda:0"))
    ranges = [R(start=4, stop=6), R(start=6, stop=8)]
    roomy = {"w1": {"devices": {"cuda:0": 12 * gib}}, "w2": {"device": "cuda:0", "free": 11 * gib}}
    tight = {**roomy, "w2": {"device": "cuda:0", "free": 9 * gib}}
    assert choose_worker_weights("auto", remote, ranges, blocks, roomy)[0] is True
    keep, why = choose_worker_weights("auto", remote, ranges, blocks, tight)
    assert keep is False and why.startswith("auto -> share")
    assert choose_worker_weights("share", remote, ranges, blocks, roomy)[0] is False
    with pytest.raises(ValueError, match=r"w2 \(cuda:0\): needs 10.00 GiB \(every block 8.00 \+.*1.00 GiB missing"):
        choose_worker_weights("all", remote, ranges, blocks, tight)
    short = {**roomy, "w1": {"devices": {"cuda:0": 5 * gib}}}
    with pytest.raises(ValueError, match=r"w1 \(cuda:0\): needs 6.00 GiB \(share 2.00 \+"):
        choose_worker_weights("auto", remote, ranges, blocks, short)
