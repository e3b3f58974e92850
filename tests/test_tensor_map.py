"""The one nested-tensor map every walker of block arguments uses (``parallel.tensor_map``); CPU only."""
from collections import namedtuple

import torch
from sharddit.parallel.tensor_map import map_tensors, rebuild, tensors_in

Pe = namedtuple("Pe", "cos sin")


def _nested():
    a, b, c, d = (torch.full((2,), float(i)) for i in range(4))
    obj = {"x": a, "pe": Pe(b, c), "list": [d, None, "s", 3], "none": None, "n": 1.5, "deep": ({"t": a},)}
    return obj, (a, b, c, d)


def test_map_reaches_every_tensor_and_keeps_every_container_type_and_leaf():
    obj, (a, _, c, d) = _nested()
    out = map_tensors(lambda t: t + 10, obj)
    assert type(out) is dict and type(out["pe"]) is Pe and type(out["list"]) is list and type(out["deep"]) is tuple
    assert torch.equal(out["x"], a + 10) and torch.equal(out["pe"].sin, c + 10)
    assert torch.equal(out["deep"][0]["t"], a + 10) and torch.equal(out["list"][0], d + 10)
    assert out["list"][1:] == [None, "s", 3] and out["none"] is None and out["n"] == 1.5
    assert torch.equal(obj["x"], a) and obj["x"] is a  # the input is not changed


def test_unchanged_containers_are_returned_themselves():
    obj, _ = _nested()
    assert map_tensors(lambda t: t, obj) is obj
    out = map_tensors(lambda t: t + 1 if t.eq(3).all() else t, obj)  # only d changes
    assert out is not obj and out["list"] is not obj["list"]
    assert out["pe"] is obj["pe"] and out["deep"] is obj["deep"] and out["x"] is obj["x"]


def test_depth_and_dicts_limit_the_walk():
    obj, (a, *_) = _nested()
    seen = []
    map_tensors(lambda t: seen.append(t) or t, obj, depth=1)
    assert [t.item() for t in (s[0] for s in seen)] == [0.0]  # only "x": pe/list/deep are one level deeper
    assert map_tensors(lambda t: t + 1, obj, dicts=False) is obj
    assert map_tensors(lambda t: t + 1, a, depth=0).eq(1).all()  # a bare tensor maps at any depth
    assert map_tensors(lambda t: t + 1, [a], depth=0)[0] is a


def test_tensors_in_and_rebuild():
    obj, (a, b, _, _) = _nested()
    assert [t.item() for t in (x[0] for x in tensors_in(obj))] == [0.0, 1.0, 2.0, 3.0, 0.0]
    assert list(tensors_in(obj, dicts=False)) == [] and list(tensors_in(None)) == []
    assert rebuild(Pe(1, 2), [a, b]) == Pe(a, b) and rebuild((1,), [5]) == (5,) and rebuild([1], (5,)) == [5]


class _Compressed:
    """Shaped like ComfyUI's LTX-2 ``CompressedTimestep``: a tensor and shape numbers in slots."""
    __slots__ = ("data", "num_frames", "unset")

    def __init__(self, data, num_frames):
        self.data, self.num_frames = data, num_frames


def test_slotted_data_objects_are_containers_of_their_slots():
    t = torch.ones(2, 3)
    obj = _Compressed(t, 7)
    moved = map_tensors(lambda x: x * 2, {"timestep": obj, "n": 1})
    new = moved["timestep"]
    assert type(new) is _Compressed and new is not obj and new.num_frames == 7 and not hasattr(new, "unset")
    assert torch.equal(new.data, t * 2) and obj.data is t  # the original is left as it was
    assert map_tensors(lambda x: x, obj) is obj  # nothing changed: the object itself
    assert list(tensors_in([obj])) == [t]
    module = torch.nn.Linear(2, 2)  # modules and objects with a __dict__ stay leaves
    assert map_tensors(lambda x: x * 0, module) is module and list(tensors_in(module)) == []
