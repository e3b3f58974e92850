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
