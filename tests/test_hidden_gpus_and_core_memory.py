"""Pure side of issue 31's platform items: GPUs hidden from this process named in every device
error (ComfyUI on Windows shows one GPU unless started with ``--cuda-device all``), memory ComfyUI
can release counted as available, and the block ring's pinned-memory switch."""
import re
from dataclasses import replace

import pytest
import torch

from sharddit.parallel.placement.devices import check_devices_exist, parse_device_plan
from sharddit.parallel.placement.inventory import inventory_from_spec
from sharddit.parallel.placement.planner import plan_placement
from sharddit.parallel.placement.plan_types import Footprint, PlacementRequest
from sharddit.parallel.placement.plan_text import PlacementError
from sharddit.parallel.sequence import ops as seq_ops

pytestmark = pytest.mark.no_blas

G = 1 << 30
NOTE = ("NVML sees 3 GPUs, torch 1: RTX 3090 (NVML 1), RTX 3060 (NVML 2) hidden from this process "
        "(CUDA_VISIBLE_DEVICES '0'). To use them: start ComfyUI with --cuda-device all (...).")
ONE_SEEN = replace(inventory_from_spec("cuda:0=20GiB/24GiB,cpu=64GiB"), hidden_note=NOTE)


def test_a_missing_device_error_names_the_hidden_gpus_and_the_fix():
    with pytest.raises(ValueError) as err:
        check_devices_exist(["cuda:0", "cuda:1"], ("cuda:0", "cpu"), NOTE)
    text = str(err.value)
    assert text.startswith("[ShardDiT] device 'cuda:1' does not exist; this machine has cuda:0, cpu; "
                           "use one of cuda:0 or 'cpu'")
    assert "NVML sees 3 GPUs, torch 1: RTX 3090 (NVML 1)" in text and "--cuda-device all" in text
    assert text.count("[ShardDiT]") == 1, "the note joins the sentence, without a second prefix"
    with pytest.raises(ValueError) as plain:
        check_devices_exist(["cuda:1"], ("cuda:0", "cpu"))
    assert "NVML" not in str(plain.value)


def test_the_planner_names_hidden_gpus_for_a_missing_device_and_a_dit_that_does_not_fit():
    big = Footprint(block_bytes=(G,) * 40, dit_home_bytes=G, dit_activation_bytes=2 * G)
    with pytest.raises(ValueError, match=re.escape("--cuda-device all")):
        plan_placement(ONE_SEEN, big, PlacementRequest(devices=parse_device_plan("cuda:0,cuda:1")))
    with pytest.raises(PlacementError) as err:
        plan_placement(ONE_SEEN, big, PlacementRequest(reserve_vram_gb=0.0))
    assert "the DiT does not fit" in str(err.value)
    assert str(err.value).endswith("This machine has more GPUs than this process sees; to use them: start ComfyUI "
                                   "with --cuda-device all (...).")
    assert "NVML sees" not in str(err.value), "plan and the Plan node print the note itself once, above the plan"
    with pytest.raises(PlacementError) as plain:
        plan_placement(replace(ONE_SEEN, hidden_note=""), big, PlacementRequest(reserve_vram_gb=0.0))
    assert "more GPUs" not in str(plain.value)


def test_memory_comfyui_can_release_is_available_to_the_planner():
    """comfy-aimdo holds VRAM for ComfyUI that NVML counts as used: 10 GiB free + 14 GiB releasable
    holds a 20 GiB DiT that 10 GiB alone cannot."""
    inv = inventory_from_spec("cuda:0=10GiB/24GiB,cpu=64GiB")
    fp = Footprint(block_bytes=(G,) * 16, dit_home_bytes=G, dit_activation_bytes=2 * G)
    request = PlacementRequest(reserve_vram_gb=0.0)
    with pytest.raises(PlacementError):
        plan_placement(inv, fp, request)
    more = inv.with_releasable_bytes({"cuda:0": 14 * G})
    assert more.get("cuda:0").available_bytes == 24 * G and more.get("cpu").releasable_bytes == 0
    plan = plan_placement(more, fp, request)
    assert [(r.device, r.start, r.stop) for r in plan.block_ranges] == [("cuda:0", 0, 16)]
    both = more.with_held_bytes({"cuda:0": G})
    assert both.get("cuda:0").available_bytes == 25 * G, "held and releasable bytes add up"
    with pytest.raises(ValueError, match=re.escape("releasable bytes for ['cuda:3'], which are not in the inventory")):
        inv.with_releasable_bytes({"cuda:3": G})
    with pytest.raises(ValueError, match=re.escape("releasable bytes must be >= 0")):
        inv.with_releasable_bytes({"cuda:0": -1})


def test_the_ring_bounces_through_pinned_memory_only_when_allowed(monkeypatch):
    monkeypatch.setattr(seq_ops, "_PINNED", [True])
    t = torch.ones(3)
    for pin, bounce in ((True, True), (False, False)):
        ops = seq_ops.TorchOps(pin=pin)
        monkeypatch.setattr(ops, "is_async", lambda place: torch.device(place).type == "cuda")  # as on a GPU
        assert ops.needs_bounce(t, "cuda:0") is bounce, f"pin={pin}"
    assert seq_ops.TorchOps().pin is True
    seq_ops.set_pinned_memory(False)  # what --disable-pinned-memory makes the loaders do
    assert seq_ops.TorchOps().pin is False and not seq_ops.pinned_memory_allowed()


def test_the_windows_fix_names_both_of_cores_switches():
    """ComfyUI on Windows: all GPUs with --cuda-device all; with several visible its start-up warning
    also asks for --disable-pinned-memory (0.33), which the block ring then follows."""
    from sharddit.parallel.placement.visible import PhysicalGpu, hidden_gpus_note

    gpus = [PhysicalGpu(i, f"GPU {i}", 24 * G, 20 * G, f"GPU-{i}a", f"00000000:0{i + 1}:00.0") for i in range(2)]
    note = hidden_gpus_note(gpus, gpus[:1], 1, "0", windows=True)
    assert "start ComfyUI with --cuda-device all" in note and "--disable-pinned-memory" in note
    assert "--disable-pinned-memory" not in hidden_gpus_note(gpus, gpus[:1], 1, "0", windows=False)


def test_the_distributed_host_buffers_follow_disable_pinned_memory(monkeypatch):
    """The distributed path's host bytes (gloo staging, ``wire._host_buffer``; a worker's receive slots,
    ``weights.WeightRing._pinned``) are page-locked only while pinning is allowed, as the ring's."""
    from sharddit.parallel.distributed import weights, wire

    asked = []
    monkeypatch.setattr(wire.torch, "empty", lambda *a, pin_memory=False, **k: asked.append(pin_memory))
    monkeypatch.setattr(seq_ops, "_PINNED", [True])
    wire._host_buffer(8, True)
    seq_ops.set_pinned_memory(False)
    wire._host_buffer(8, True)
    assert asked == [True, False]
    ring = weights.WeightRing.__new__(weights.WeightRing)
    ring.wire, ring.device = torch.device("cpu"), torch.device("cuda:0")
    monkeypatch.setattr(weights, "real_cuda", lambda device: True)  # a GPU rank on gloo
    assert ring._pinned() is False
    seq_ops.set_pinned_memory(True)
    assert ring._pinned() is True
