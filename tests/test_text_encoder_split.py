"""A text encoder's layers over several devices (pure: the plan and the layer routing).

``plan_layer_split`` gives the layers contiguous ranges by room (the DiT blocks' rules, GPU before
CPU); ``place_layers`` runs each layer where its weights are and hands its output back where its
input came from. Fake GPUs (``fake_device_mode``: a tensor on ``cuda:1`` meeting one on
``cuda:0`` is an error, as on real GPUs) prove the routing on this CPU-only machine.
"""
import pytest
import torch
from sharddit.parallel.blocks.layer_devices import (
    layer_device,
    place_layers,
    remove_layer_hooks,
)
from sharddit.parallel.placement.devices import parse_device_plan
from sharddit.parallel.placement.layer_split import plan_layer_split
from sharddit.parallel.placement.plan_text import PlacementError
from sharddit.parallel.simulate import (
    fake_device_mode,
    materialize_module,
    modules_move_in_place,
)

MB = 2**20
LAYERS = (10 * MB,) * 8  # 80 MiB of layers


def _ranges(split):
    return [(r.device, r.start, r.stop) for r in split.ranges]


def test_auto_takes_one_gpu_when_it_holds_the_encoder():
    split = plan_layer_split(LAYERS, 5 * MB, {"cuda:0": 60 * MB, "cuda:1": 90 * MB, "cpu": 10**12})
    assert _ranges(split) == [("cuda:1", 0, 8)] and split.home == "cuda:1"


def test_auto_splits_over_the_fewest_gpus_by_room():
    """No GPU holds 85 MiB: the two with most room (cuda:2 first, home there), layers by room."""
    rooms = {"cuda:0": 20 * MB, "cuda:1": 45 * MB, "cuda:2": 65 * MB, "cpu": 10**12}
    split = plan_layer_split(LAYERS, 5 * MB, rooms)
    assert _ranges(split) == [("cuda:2", 0, 5), ("cuda:1", 5, 8)]
    assert split.home == "cuda:2" and "split over 2 GPUs" in split.notes[0]


def test_auto_fills_the_gpus_before_the_cpu():
    """All GPUs together hold 5 layers: they keep 3 + 2, the CPU the last 3."""
    split = plan_layer_split(LAYERS, 5 * MB, {"cuda:0": 36 * MB, "cuda:1": 25 * MB, "cpu": 10**12})
    assert _ranges(split) == [("cuda:0", 0, 3), ("cuda:1", 3, 5), ("cpu", 5, 8)]
    assert "the CPU takes the rest" in split.notes[0]


def test_auto_without_room_on_any_gpu_is_the_cpu():
    split = plan_layer_split(LAYERS, 5 * MB, {"cuda:0": 5 * MB})
    assert _ranges(split) == [("cpu", 0, 8)]


def test_explicit_lists():
    """cpu,cpu: even halves; weights: their proportions; GPUs then cpu: GPUs first."""
    assert _ranges(plan_layer_split(LAYERS, 0, {}, parse_device_plan("cpu,cpu"))) == [("cpu", 0, 4), ("cpu", 4, 8)]
    rooms = {"cuda:0": 100 * MB, "cuda:1": 100 * MB}
    assert _ranges(plan_layer_split(LAYERS, 0, rooms, parse_device_plan("cuda:0:3,cuda:1:1"))) == [("cuda:0", 0, 6), ("cuda:1", 6, 8)]
    split = plan_layer_split(LAYERS, 0, {"cuda:0": 30 * MB, "cpu": 10**12}, parse_device_plan("cuda:0,cpu"))
    assert _ranges(split) == [("cuda:0", 0, 3), ("cpu", 3, 8)]


def test_a_list_that_cannot_hold_it_names_the_rooms_and_the_fix():
    with pytest.raises(PlacementError, match=r"does not fit device 'cuda:0,cuda:1' \(room for layers: "
                                             r"cuda:0 0\.02 GiB, cuda:1 0\.03 GiB\)\. Add devices"):
        plan_layer_split(LAYERS, 10 * MB, {"cuda:0": 30 * MB, "cuda:1": 30 * MB}, parse_device_plan("cuda:0,cuda:1"))


@pytest.mark.parametrize("bad,match", [("cuda:0;cuda:1", r"'cuda:0;cuda:1' is not a device"),
                                       ("gpu0,cpu", r"'gpu0' is not a device; accepted: 'auto', or a list"),
                                       ("auto,cpu", r"'auto' cannot be mixed")])
def test_bad_device_strings(bad, match):
    with pytest.raises(ValueError, match=match):
        plan_layer_split(LAYERS, 0, {}, parse_device_plan(bad, workers=False))


class _Stack(torch.nn.Module):
    """A text encoder's shape: an embedding and a norm around a layer list; it collects every
    hidden state and concatenates them (as LTX-2's Gemma use does)."""

    def __init__(self, width=16, n=4):
        super().__init__()
        self.embed = torch.nn.Embedding(32, width)
        self.layers = torch.nn.ModuleList(torch.nn.Linear(width, width) for _ in range(n))
        self.norm = torch.nn.LayerNorm(width)

    def forward(self, ids, scale):
        x = self.embed(ids)
        hidden = [x]
        for layer in self.layers:
            x = torch.tanh(layer(x)) * scale
            hidden.append(x)
        return self.norm(x), torch.stack(hidden)


def test_split_layers_give_the_same_result_on_cpu():
    torch.manual_seed(0)
    model, ids, scale = _Stack(), torch.randint(0, 32, (2, 5)), torch.tensor(0.5)
    ref = model(ids, scale)
    place_layers(model.layers, ["cpu", "cpu", "cpu", "cpu"])
    out = model(ids, scale)
    assert all(torch.equal(a, b) for a, b in zip(out, ref))
    remove_layer_hooks(model.layers)
    assert layer_device(model.layers[0]) is None


def test_layers_on_fake_gpus_run_there_and_hand_back_to_home():
    """Home and layers 0-1 on cuda:0, layers 2-3 on cuda:1: each layer's weights are on its GPU,
    and the hidden states the forward stacks are all back on cuda:0. Without the routing the
    first cuda:1 layer meets a cuda:0 input and fails."""
    with torch.device("meta"):
        model = _Stack()
    seen = []
    with fake_device_mode(), modules_move_in_place(model):
        materialize_module(model, "cuda:0")
        place_layers(model.layers, ["cuda:0", "cuda:0", "cuda:1", "cuda:1"])
        for layer in model.layers:
            layer.register_forward_pre_hook(lambda m, a: seen.append((m.weight.device.index, a[0].device.index)))
        ids = torch.zeros(2, 5, dtype=torch.long, device="cuda:0")
        out, hidden = model(ids, torch.tensor(0.5, device="cuda:0"))
        assert len(seen) == 4
        assert out.device == hidden.device == torch.device("cuda:0")
        assert [str(p.device) for p in model.layers[2].parameters()] == ["cuda:1", "cuda:1"]
        remove_layer_hooks(model.layers)
        with pytest.raises(Exception, match="cuda:1|device"):
            model(ids, torch.tensor(0.5, device="cuda:0"))
    # the pre-hooks added after place_layers run after the routing: each layer saw its own GPU
    assert seen[:4] == [(0, 0), (0, 0), (1, 1), (1, 1)]
