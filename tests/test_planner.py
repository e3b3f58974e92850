"""Placement planner on fake inventories: whole plans compared as dicts, every error text locked.

Toy footprints, sizes in GiB (G = 2**30 bytes):
- SMALL: 10 blocks x 1 GiB + 1 GiB home (DiT 11 GiB), DiT activations 2 GiB;
         text encoder 4 GiB + 1 GiB activations; VAE 1 GiB + 2 GiB activations.
- MID:   16 blocks x 1 GiB + 1 GiB home (DiT 17 GiB), activations 3 GiB (DiT needs 20 GiB on one GPU);
         text encoder 6 + 1; VAE 1 + 3.
- BIG:   20 blocks x 1 GiB + 2 GiB home (22 GiB), activations 4 GiB; text encoder 6 + 1; VAE 1 + 3.
- MIX:   24 blocks x 1 GiB + 1 GiB home (25 GiB), activations 2 GiB; text encoder 4 + 1; VAE 1 + 3.
- HUGE:  36 blocks x 1.5 GiB + 2 GiB home (56 GiB), activations 4 GiB; text encoder 6 + 1; VAE 1 + 3.
- H8:    40 blocks x 1.5 GiB + 1 GiB home (61 GiB), activations 2 GiB; text encoder 6 + 1; VAE 1 + 3.
"""
import re

import pytest

from sharddit.parallel.placement.devices import DeviceEntry, parse_device_plan
from sharddit.parallel.placement.inventory import inventory_from_spec as spec
from sharddit.parallel.placement.planner import plan_placement
from sharddit.parallel.placement.plan_types import BlockRange, DeviceLoad, Footprint, PlacementRequest, Plan
from sharddit.parallel.placement.plan_text import PlacementError

G = 1 << 30
H = G // 2
SMALL = Footprint(block_bytes=(G,) * 10, dit_home_bytes=G, dit_activation_bytes=2 * G,
                  text_encoder_bytes=4 * G, text_encoder_activation_bytes=G, vae_bytes=G, vae_activation_bytes=2 * G)
MID = Footprint(block_bytes=(G,) * 16, dit_home_bytes=G, dit_activation_bytes=3 * G,
                text_encoder_bytes=6 * G, text_encoder_activation_bytes=G, vae_bytes=G, vae_activation_bytes=3 * G)
BIG = Footprint(block_bytes=(G,) * 20, dit_home_bytes=2 * G, dit_activation_bytes=4 * G,
                text_encoder_bytes=6 * G, text_encoder_activation_bytes=G, vae_bytes=G, vae_activation_bytes=3 * G)
MIX = Footprint(block_bytes=(G,) * 24, dit_home_bytes=G, dit_activation_bytes=2 * G,
                text_encoder_bytes=4 * G, text_encoder_activation_bytes=G, vae_bytes=G, vae_activation_bytes=3 * G)
HUGE = Footprint(block_bytes=(3 * H,) * 36, dit_home_bytes=2 * G, dit_activation_bytes=4 * G,
                 text_encoder_bytes=6 * G, text_encoder_activation_bytes=G, vae_bytes=G, vae_activation_bytes=3 * G)
H8 = Footprint(block_bytes=(3 * H,) * 40, dit_home_bytes=G, dit_activation_bytes=2 * G,
               text_encoder_bytes=6 * G, text_encoder_activation_bytes=G, vae_bytes=G, vae_activation_bytes=3 * G)
TWO_24 = "cuda:0=24GiB,cuda:1=24GiB,cpu=64GiB"
MIXED_24_12 = "cuda:0=24GiB,cuda:1=12GiB,cpu=64GiB"
FIX = ("To fit: fewer frames or a smaller resolution (less activation memory), more devices, fp8 weights, "
       "or a lower reserve_vram_gb (now {})")


def load(weights_gib, activations_gib):
    return {"weights": int(weights_gib * G), "activations": int(activations_gib * G)}


def plan(inventory_spec, footprint, **request):
    if "devices" in request:
        request["devices"] = parse_device_plan(request["devices"])
    return plan_placement(spec(inventory_spec), footprint, PlacementRequest(**request)).to_dict()


def beside(name, device, gib):
    return f"{name} beside the DiT on {device}: no other GPU has {gib} GiB usable"


# ------------------------------------------------------------------ one GPU


def test_one_gpu_everything_fits():
    # 11 DiT + 1 VAE + 4 text encoder = 16 GiB weights, max activations 2 GiB: 18 <= 24.
    assert plan("cuda:0=24GiB,cpu=64GiB", SMALL) == {
        "text_encoder": "cuda:0", "vae": "cuda:0", "home": "cuda:0",
        "blocks": [["cuda:0", 0, 10]],
        "loads": {"cuda:0": load(16, 2)},
        "notes": [beside("VAE", "cuda:0", "3.0"), beside("text encoder", "cuda:0", "5.0")],
    }


def test_one_gpu_dit_and_vae_fit_text_encoder_to_cpu():
    # 11 DiT + 1 VAE + 2 activations = 14 GiB: the 4 GiB text encoder goes to the CPU.
    assert plan("cuda:0=14GiB,cpu=64GiB", SMALL) == {
        "text_encoder": "cpu", "vae": "cuda:0", "home": "cuda:0",
        "blocks": [["cuda:0", 0, 10]],
        "loads": {"cuda:0": load(12, 2), "cpu": load(4, 1)},
        "notes": [beside("VAE", "cuda:0", "3.0"),
                  "text encoder on cpu (slow): it needs 5.0 GiB and no GPU has that much left"],
    }


def test_one_gpu_dit_alone_fits():
    # 11 DiT + 2 activations = 13 GiB: VAE and text encoder both go to the CPU.
    assert plan("cuda:0=13GiB,cpu=64GiB", SMALL) == {
        "text_encoder": "cpu", "vae": "cpu", "home": "cuda:0",
        "blocks": [["cuda:0", 0, 10]],
        "loads": {"cuda:0": load(11, 2), "cpu": load(5, 2)},
        "notes": ["VAE on cpu (slow): it needs 3.0 GiB and no GPU has that much left",
                  "text encoder on cpu (slow): it needs 5.0 GiB and no GPU has that much left"],
    }


def test_one_gpu_nothing_fits():
    with pytest.raises(PlacementError, match=re.escape(
        "the DiT does not fit: it needs 11.0 GiB of weights (1.0 DiT home + 10 blocks of up to 1.0) plus 2.0 GiB "
        "of activations on each device it runs on. Usable for blocks: cuda:0 (spec) 8.0 free - 0.0 reserve - "
        "2.0 activations - 1.0 DiT home = 5.0 GiB; together 5.0 GiB for 10.0 GiB of blocks. " + FIX.format(0)
    )):
        plan("cuda:0=8GiB,cpu=64GiB", SMALL)
    assert issubclass(PlacementError, ValueError)


# ------------------------------------------------------------------ two GPUs


def test_two_equal_gpus_dit_fits_on_one():
    # DiT needs 20 GiB: one 24 GiB GPU; text encoder (6+1) and VAE (1+3) share the other.
    assert plan(TWO_24, MID) == {
        "text_encoder": "cuda:1", "vae": "cuda:1", "home": "cuda:0",
        "blocks": [["cuda:0", 0, 16]],
        "loads": {"cuda:0": load(17, 3), "cuda:1": load(7, 3)},
        "notes": [],
    }


def test_two_equal_gpus_dit_split():
    # DiT needs 22 + 4 = 26 GiB > 24: split; usable 18 (home) and 20 -> blocks 11 / 9 once the VAE
    # sits on cuda:0 and the text encoder on cuda:1 (the devices with the most left over).
    assert plan(TWO_24, BIG) == {
        "text_encoder": "cuda:1", "vae": "cuda:0", "home": "cuda:0",
        "blocks": [["cuda:0", 0, 11], ["cuda:1", 11, 20]],
        "loads": {"cuda:0": load(14, 4), "cuda:1": load(15, 4)},
        "notes": ["DiT split over 2 GPUs (cuda:0, cuda:1): it fits on no fewer",
                  beside("VAE", "cuda:0", "4.0"), beside("text encoder", "cuda:1", "7.0")],
    }


def test_24_and_12_dit_on_the_big_one_rest_on_the_small_one():
    assert plan(MIXED_24_12, MID) == {
        "text_encoder": "cuda:1", "vae": "cuda:1", "home": "cuda:0",
        "blocks": [["cuda:0", 0, 16]],
        "loads": {"cuda:0": load(17, 3), "cuda:1": load(7, 3)},
        "notes": [],
    }


def test_24_and_12_proportional_ranges():
    # 24 blocks: usable 24-1-2-(VAE 1, text encoder 4, activations 3) = 16 vs 12-2 = 10 -> 14 / 10.
    assert plan(MIXED_24_12, MIX) == {
        "text_encoder": "cuda:0", "vae": "cuda:0", "home": "cuda:0",
        "blocks": [["cuda:0", 0, 14], ["cuda:1", 14, 24]],
        "loads": {"cuda:0": load(20, 3), "cuda:1": load(10, 2)},
        "notes": ["DiT split over 2 GPUs (cuda:0, cuda:1): it fits on no fewer",
                  beside("VAE", "cuda:0", "4.0"), beside("text encoder", "cuda:0", "5.0")],
    }


def test_12_and_24_most_free_gpu_goes_first_and_holds_home():
    assert plan("cuda:0=12GiB,cuda:1=24GiB,cpu=64GiB", MIX) == {
        "text_encoder": "cuda:1", "vae": "cuda:1", "home": "cuda:1",
        "blocks": [["cuda:1", 0, 14], ["cuda:0", 14, 24]],
        "loads": {"cuda:0": load(10, 2), "cuda:1": load(20, 3)},
        "notes": ["DiT split over 2 GPUs (cuda:1, cuda:0): it fits on no fewer",
                  beside("VAE", "cuda:1", "4.0"), beside("text encoder", "cuda:1", "5.0")],
    }


def test_two_gpus_nothing_fits():
    with pytest.raises(PlacementError, match=re.escape(
        "the DiT does not fit: it needs 56.0 GiB of weights (2.0 DiT home + 36 blocks of up to 1.5) plus 4.0 GiB "
        "of activations on each device it runs on. Usable for blocks: cuda:0 (spec) 24.0 free - 1.5 reserve - "
        "4.0 activations - 2.0 DiT home = 16.5 GiB; cuda:1 (spec) 12.0 free - 1.5 reserve - 4.0 activations = "
        "6.5 GiB; together 23.0 GiB for 54.0 GiB of blocks. " + FIX.format(1.5)
    )):
        plan(MIXED_24_12, HUGE, reserve_vram_gb=1.5)


# ------------------------------------------------------------------ 4 and 8 GPUs


def test_four_gpus_dit_on_three_text_encoder_and_vae_on_the_fourth():
    # 54 GiB of blocks: usable 18 + 20 + 20 = 58 on three GPUs; 1.5 GiB blocks -> 11 / 13 / 12.
    assert plan(",".join(f"cuda:{i}=24GiB" for i in range(4)) + ",cpu=64GiB", HUGE) == {
        "text_encoder": "cuda:3", "vae": "cuda:3", "home": "cuda:0",
        "blocks": [["cuda:0", 0, 11], ["cuda:1", 11, 24], ["cuda:2", 24, 36]],
        "loads": {"cuda:0": load(18.5, 4), "cuda:1": load(19.5, 4), "cuda:2": load(18, 4), "cuda:3": load(7, 3)},
        "notes": ["DiT split over 3 GPUs (cuda:0, cuda:1, cuda:2): it fits on no fewer"],
    }


def test_eight_gpus_dit_on_seven():
    # 60 GiB of blocks: six 12 GiB GPUs give 9 + 5 x 10 = 59 usable, seven give 69.
    assert plan(",".join(f"cuda:{i}=12GiB" for i in range(8)) + ",cpu=64GiB", H8) == {
        "text_encoder": "cuda:7", "vae": "cuda:7", "home": "cuda:0",
        "blocks": [["cuda:0", 0, 5], ["cuda:1", 5, 11], ["cuda:2", 11, 17], ["cuda:3", 17, 23],
                   ["cuda:4", 23, 28], ["cuda:5", 28, 34], ["cuda:6", 34, 40]],
        "loads": {"cuda:0": load(8.5, 2), **{f"cuda:{i}": load(9, 2) for i in (1, 2, 3, 5, 6)},
                  "cuda:4": load(7.5, 2), "cuda:7": load(7, 3)},
        "notes": ["DiT split over 7 GPUs (cuda:0, cuda:1, cuda:2, cuda:3, cuda:4, cuda:5, cuda:6): it fits on no fewer"],
    }


def test_eight_gpus_explicit_weights():
    got = plan(",".join(f"cuda:{i}=12GiB" for i in range(8)), SMALL,
               devices=",".join(f"cuda:{i}:{1 + i % 2}" for i in range(8)))
    # weights 1,2,1,2,...: targets 10 x (1, 3, 4, 6, 7, 9, 10, 12) / 12 blocks, ties to the earlier boundary.
    assert got["blocks"] == [["cuda:0", 0, 1], ["cuda:1", 1, 2], ["cuda:2", 2, 3], ["cuda:3", 3, 5],
                             ["cuda:4", 5, 6], ["cuda:5", 6, 7], ["cuda:6", 7, 8], ["cuda:7", 8, 10]]


# ------------------------------------------------------------------ busy GPUs, reserve, cpu


def test_gpu_mostly_used_is_skipped_with_a_note():
    assert plan("cuda:0=3GiB/24GiB,cuda:1=24GiB,cpu=64GiB", MID) == {
        "text_encoder": "cpu", "vae": "cuda:1", "home": "cuda:1",
        "blocks": [["cuda:1", 0, 16]],
        "loads": {"cuda:1": load(18, 3), "cpu": load(6, 1)},
        "notes": ["cuda:0 (spec) 3.0 free - 0.0 reserve - 3.0 activations = 0.0 GiB usable: skipped for DiT "
                  "blocks, less than one block (1.0 GiB)",
                  beside("VAE", "cuda:1", "4.0"),
                  "text encoder on cpu (slow): it needs 7.0 GiB and no GPU has that much left"],
    }


def test_reserve_vram_gb_forces_a_split():
    # MID needs 20 GiB on one GPU: fits 24 - 4 reserve, not 24 - 5.
    assert plan(TWO_24, MID, reserve_vram_gb=4) == plan(TWO_24, MID)
    assert plan(TWO_24, MID, reserve_vram_gb=5) == {
        "text_encoder": "cuda:0", "vae": "cuda:1", "home": "cuda:0",
        "blocks": [["cuda:0", 0, 6], ["cuda:1", 6, 16]],
        "loads": {"cuda:0": load(13, 3), "cuda:1": load(11, 3)},
        "notes": ["DiT split over 2 GPUs (cuda:0, cuda:1): it fits on no fewer",
                  beside("VAE", "cuda:1", "4.0"), beside("text encoder", "cuda:0", "7.0")],
    }


def test_text_encoder_on_cpu_when_asked():
    assert plan(MIXED_24_12, MID, text_encoder_device="cpu") == {
        "text_encoder": "cpu", "vae": "cuda:1", "home": "cuda:0",
        "blocks": [["cuda:0", 0, 16]],
        "loads": {"cuda:0": load(17, 3), "cuda:1": load(1, 3), "cpu": load(6, 1)},
        "notes": [],
    }


def test_explicit_components_are_placed_first():
    # Text encoder and VAE pinned to cuda:0 -> the DiT takes cuda:1.
    assert plan(TWO_24, MID, text_encoder_device="cuda:0", vae_device="cuda:0") == {
        "text_encoder": "cuda:0", "vae": "cuda:0", "home": "cuda:1",
        "blocks": [["cuda:1", 0, 16]],
        "loads": {"cuda:0": load(7, 3), "cuda:1": load(17, 3)},
        "notes": [],
    }


def test_explicit_component_too_big_is_a_note_not_an_error():
    got = plan("cuda:0=24GiB,cuda:1=4GiB,cpu=64GiB", MID, text_encoder_device="cuda:1")
    assert got["text_encoder"] == "cuda:1" and got["blocks"] == [["cuda:0", 0, 16]]
    assert got["notes"][0] == ("text encoder on cuda:1 as requested, but it needs 7.0 GiB and cuda:1 has 4.0 GiB "
                               "usable: ComfyUI will offload part of it (slower)")


def test_cpu_cpu_two_shards_on_the_cpu():
    expected = {
        "text_encoder": "cpu", "vae": "cpu", "home": "cpu",
        "blocks": [["cpu", 0, 5], ["cpu", 5, 10]],
        "loads": {"cpu": load(16, 2)},
        "notes": [],
    }
    assert plan("cpu=64GiB", SMALL, devices="cpu,cpu") == expected
    # No cpu entry in the inventory: RAM is assumed enough.
    assert plan("cuda:0=8GiB", SMALL, devices="cpu,cpu", text_encoder_device="cpu", vae_device="cpu") == expected


def test_cpu_only_machine_auto():
    assert plan("cpu=64GiB", SMALL) == {
        "text_encoder": "cpu", "vae": "cpu", "home": "cpu",
        "blocks": [["cpu", 0, 10]],
        "loads": {"cpu": load(16, 2)},
        "notes": ["no GPU found: the DiT runs on cpu (slow)"],
    }


def test_cpu_only_machine_too_little_ram():
    with pytest.raises(PlacementError, match=re.escape(
        "Usable for blocks: cpu (CPU) 8.0 free - 2.0 activations - 1.0 DiT home - 5.0 text encoder/VAE = 0.0 GiB; "
        "together 0.0 GiB for 10.0 GiB of blocks."
    )):
        plan("cpu=8GiB", SMALL)


# ------------------------------------------------------------------ explicit lists, weights, repeats


def test_explicit_order_is_kept_home_on_the_first():
    assert plan(MIXED_24_12, MID, devices="cuda:1,cuda:0") == {
        "text_encoder": "cuda:0", "vae": "cuda:0", "home": "cuda:1",
        "blocks": [["cuda:1", 0, 6], ["cuda:0", 6, 16]],
        "loads": {"cuda:0": load(17, 3), "cuda:1": load(7, 3)},
        "notes": [beside("VAE", "cuda:0", "4.0"), beside("text encoder", "cuda:0", "7.0")],
    }


def test_weights_override_proportions():
    assert plan(TWO_24, MID, devices="cuda:0:3,cuda:1:1") == {
        "text_encoder": "cuda:0", "vae": "cuda:1", "home": "cuda:0",
        "blocks": [["cuda:0", 0, 12], ["cuda:1", 12, 16]],
        "loads": {"cuda:0": load(19, 3), "cuda:1": load(5, 3)},
        "notes": [beside("VAE", "cuda:1", "4.0"), beside("text encoder", "cuda:0", "7.0")],
    }


def test_weights_that_do_not_fit():
    with pytest.raises(PlacementError, match=re.escape(
        "devices 'cuda:0:1,cuda:1:1': weight 1 gives cuda:1 blocks 8-15 (8.0 GiB) but it has 5.0 GiB usable for "
        "blocks; change the weights or use devices 'auto'. " + FIX.format(0)
    )):
        plan("cuda:0=24GiB,cuda:1=8GiB,cpu=64GiB", MID, devices="cuda:0:1,cuda:1:1")


def test_repeated_device_splits_its_memory():
    assert plan(MIXED_24_12, MID, devices="cuda:0,cuda:0,cuda:1") == {
        "text_encoder": "cuda:0", "vae": "cuda:0", "home": "cuda:0",
        "blocks": [["cuda:0", 0, 5], ["cuda:0", 5, 9], ["cuda:1", 9, 16]],
        "loads": {"cuda:0": load(17, 3), "cuda:1": load(7, 3)},
        "notes": [beside("VAE", "cuda:0", "4.0"), beside("text encoder", "cuda:0", "7.0")],
    }


def test_explicit_list_that_does_not_fit():
    with pytest.raises(PlacementError, match=re.escape(
        "Usable for blocks: cuda:0 (spec) 10.0 free - 0.0 reserve - 3.0 activations - 1.0 DiT home = 6.0 GiB; "
        "cuda:1 (spec) 8.0 free - 0.0 reserve - 3.0 activations = 5.0 GiB; together 11.0 GiB for 16.0 GiB of blocks."
    )):
        plan("cuda:0=10GiB,cuda:1=8GiB,cpu=64GiB", MID, devices="cuda:0,cuda:1")


def test_more_devices_than_blocks_drops_empty_ranges():
    got = plan("cuda:0=24GiB,cuda:1=24GiB", Footprint(block_bytes=(G,)), devices="cuda:0,cuda:1")
    assert got["blocks"] == [["cuda:1", 0, 1]] and got["home"] == "cuda:0"
    assert got["notes"] == ["cuda:0 gets no blocks (the proportional split of 1 leaves it none)"]


def test_unknown_device_names_what_exists():
    with pytest.raises(ValueError, match=re.escape(
        "device 'cuda:5' does not exist; this machine has cuda:0, cuda:1, cpu; use one of cuda:0, cuda:1 or 'cpu', or 'auto'"
    )):
        plan(TWO_24, MID, devices="cuda:0,cuda:5")
    with pytest.raises(ValueError, match=re.escape("device 'cuda:2' does not exist")):
        plan(TWO_24, MID, vae_device="cuda:2")


# ------------------------------------------------------------------ re-planning, determinism, text


def test_held_bytes_make_replanning_stable():
    first = plan_placement(spec(TWO_24), MID, PlacementRequest())
    # After loading, NVML sees cuda:0 with 24 - 17 and cuda:1 with 24 - 7 GiB free.
    loaded = spec("cuda:0=7GiB/24GiB,cuda:1=17GiB/24GiB,cpu=64GiB")
    assert plan_placement(loaded, MID, PlacementRequest()).to_dict() != first.to_dict()
    held = loaded.with_held_bytes({"cuda:0": 17 * G, "cuda:1": 7 * G})
    assert plan_placement(held, MID, PlacementRequest()) == first


def test_plan_is_frozen_and_typed():
    got = plan_placement(spec(MIXED_24_12), MIX, PlacementRequest())
    assert got.block_ranges == (BlockRange("cuda:0", 0, 14), BlockRange("cuda:1", 14, 24))
    assert got.loads[1] == DeviceLoad("cuda:1", 10 * G, 2 * G)
    assert got.dit_devices == ("cuda:0", "cuda:1")
    assert isinstance(got, Plan) and got == plan_placement(spec(MIXED_24_12), MIX, PlacementRequest())
    with pytest.raises(AttributeError):
        got.home_device = "cpu"


def test_to_text_table():
    inventory = spec("cuda:0=3GiB/24GiB,cuda:1=24GiB,cpu=64GiB")
    text = plan_placement(inventory, MID, PlacementRequest()).to_text(inventory)
    assert text == "\n".join([
        "device | name | free GiB | holds                      | planned GiB",
        "-------+------+----------+----------------------------+------------",
        "cuda:0 | spec |      3.0 | -                          |           -",
        "cuda:1 | spec |     24.0 | VAE, DiT home, blocks 0-15 |        21.0",
        "cpu    | CPU  |     64.0 | text encoder               |         7.0",
        "- cuda:0 (spec) 3.0 free - 0.0 reserve - 3.0 activations = 0.0 GiB usable: skipped for DiT blocks, "
        "less than one block (1.0 GiB)",
        "- " + beside("VAE", "cuda:1", "4.0"),
        "- text encoder on cpu (slow): it needs 7.0 GiB and no GPU has that much left",
    ])


# ------------------------------------------------------------------ input validation


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"devices": "cuda0"}, "devices 'cuda0': 'cuda0' is not a device"),
        ({"text_encoder_device": "gpu"}, "device 'gpu' is not valid; accepted: 'auto', 'cpu' or 'cuda:N'"),
        ({"vae_device": "cuda:0,cuda:1"}, "device 'cuda:0,cuda:1' is not valid"),
        ({"reserve_vram_gb": -1}, "reserve_vram_gb -1 must be a number >= 0 (GiB left free on each GPU)"),
        ({"reserve_vram_gb": float("nan")}, "reserve_vram_gb nan must be a number >= 0"),
        ({"reserve_vram_gb": "2"}, "reserve_vram_gb '2' must be a number >= 0"),
    ],
)
def test_request_validation(kwargs, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        if "devices" in kwargs:  # the one parser refuses it, before any request
            kwargs = {**kwargs, "devices": parse_device_plan(kwargs["devices"])}
        PlacementRequest(**kwargs)


@pytest.mark.parametrize("devices", ["cuda:0,cuda:1", "auto"])
def test_a_request_takes_the_parsed_plan_not_a_string(devices):
    """The devices string is parsed once, where it enters (``parse_device_plan``): a request given
    the string itself is refused, not parsed again; so is a plan that still names worker members
    (the host places their shares as ``cpu`` entries: ``with_worker_shares``)."""
    with pytest.raises(TypeError, match="DevicePlan"):
        PlacementRequest(devices=devices)
    with pytest.raises(TypeError, match="with_worker_shares"):
        PlacementRequest(devices=parse_device_plan("cuda:0,w1/cpu"))
    assert PlacementRequest(devices=parse_device_plan("cuda:0,w1/cpu").with_worker_shares()).devices.entries[-1] == (
        DeviceEntry("cpu", 1.0))


def test_request_normalises():
    req = PlacementRequest(devices=parse_device_plan(" cuda:0 , cuda:1 "), text_encoder_device="CPU", vae_device=" Auto", reserve_vram_gb=1.5)
    assert (req.text_encoder_device, req.vae_device, req.reserve_bytes) == ("cpu", "auto", 3 * H)
    assert [e.device for e in req.devices.entries] == ["cuda:0", "cuda:1"]


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"block_bytes": ()}, "block_bytes must be a non-empty list of positive sizes, got ()"),
        ({"block_bytes": (G, 0)}, "block_bytes must be a non-empty list of positive sizes, got (1073741824, 0)"),
        ({"block_bytes": (G,), "vae_bytes": -1}, "vae_bytes must be >= 0, got -1"),
    ],
)
def test_footprint_validation(kwargs, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        Footprint(**kwargs)


def test_footprint_accepts_a_list():
    fp = Footprint(block_bytes=[G, G], dit_home_bytes=G)
    assert fp.block_bytes == (G, G) and fp.dit_bytes == 3 * G


# ------------------------------------------------------------------ contiguous ranges (property tests)

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from sharddit.parallel.placement.plan_ranges import compute_block_ranges  # noqa: E402


def _feasible(blocks, caps):
    """Brute force: can blocks be cut into len(caps) contiguous (maybe empty) ranges within caps?"""
    reach = {0}
    for cap in caps:
        reach = {stop for start in reach for stop in range(start, len(blocks) + 1) if sum(blocks[start:stop]) <= cap}
    return len(blocks) in reach


@settings(max_examples=300, deadline=None)
@given(
    blocks=st.lists(st.integers(1, 9), min_size=1, max_size=10),
    caps=st.lists(st.integers(0, 40), min_size=1, max_size=4),
    data=st.data(),
)
def test_compute_block_ranges_fits_whenever_anything_fits(blocks, caps, data):
    shares = data.draw(st.lists(st.integers(1, 5), min_size=len(caps), max_size=len(caps)))
    got = compute_block_ranges(blocks, shares, caps)
    assert (got is not None) == _feasible(blocks, caps)
    if got is not None:
        assert got[0][0] == 0 and got[-1][1] == len(blocks)
        assert all(a[1] == b[0] for a, b in zip(got, got[1:]))
        assert all(sum(blocks[s:e]) <= cap for (s, e), cap in zip(got, caps))


@settings(max_examples=200, deadline=None)
@given(blocks=st.lists(st.integers(1, 9), min_size=1, max_size=12), shares=st.lists(st.integers(1, 5), min_size=1, max_size=5))
def test_compute_block_ranges_unconstrained_boundaries_are_closest_to_the_shares(blocks, shares):
    got = compute_block_ranges(blocks, shares)
    cum = [sum(blocks[:i]) for i in range(len(blocks) + 1)]
    for i, (_, stop) in enumerate(got):
        target = cum[-1] * sum(shares[: i + 1]) / sum(shares)
        start = got[i][0]
        assert all(abs(cum[stop] - target) <= abs(cum[s] - target) for s in range(start, len(blocks) + 1))


def test_block_devices_follow_the_ranges_and_reject_gaps():
    from sharddit.parallel.placement.plan_types import BlockRange, block_devices_of

    ranges = (BlockRange("cuda:0", 0, 2), BlockRange("cuda:1", 2, 5), BlockRange("cuda:0", 5, 6))
    assert block_devices_of(ranges) == ("cuda:0", "cuda:0", "cuda:1", "cuda:1", "cuda:1", "cuda:0")
    with pytest.raises(AssertionError, match="contiguous"):
        block_devices_of((BlockRange("cuda:0", 0, 2), BlockRange("cuda:1", 3, 5)))
    with pytest.raises(AssertionError, match="contiguous"):
        block_devices_of((BlockRange("cuda:0", 1, 2),))


def test_huge_or_tiny_weights_split_like_equal_ones():
    """``cpu:1e308,cpu:1e308`` used to overflow (sum = inf) and put every block on one entry."""
    even = compute_block_ranges([1] * 4, [1, 1])
    assert even == ((0, 2), (2, 4))
    assert compute_block_ranges([1] * 4, [1e308, 1e308]) == even
    assert compute_block_ranges([1] * 4, [5e-324, 5e-324]) == even
    assert compute_block_ranges([1] * 4, [1e308, 1e308 / 3]) == ((0, 3), (3, 4))
