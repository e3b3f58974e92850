"""Device strings: parse, canonicalise, reject with the accepted form, check against what exists."""
import re

import pytest

from sharddit.parallel.placement.devices import (
    DEVICE_FORM,
    DEVICES_FORM,
    DeviceEntry,
    DevicePlan,
    check_devices_exist,
    parse_component_device,
    parse_device,
    parse_device_plan,
)


def local_and_members(text):
    """(this machine's part as text, the workers' members) of the one parser's plan."""
    plan = parse_device_plan(text)
    return plan.local, plan.members

pytestmark = pytest.mark.no_blas  # no BLAS arithmetic: left out of the other-MKL_CBWR rerun in .ci/run


@pytest.mark.parametrize(
    "text, expected",
    [
        ("auto", DevicePlan(auto=True)),
        (" AUTO ", DevicePlan(auto=True)),
        ("cpu", DevicePlan(False, (DeviceEntry("cpu"),))),
        ("cuda:0,cuda:1", DevicePlan(False, (DeviceEntry("cuda:0"), DeviceEntry("cuda:1")))),
        (" cuda:1 , CUDA:0 ", DevicePlan(False, (DeviceEntry("cuda:1"), DeviceEntry("cuda:0")))),
        ("cpu,cpu", DevicePlan(False, (DeviceEntry("cpu"), DeviceEntry("cpu")))),
        ("cuda:0,cuda:0,cuda:1", DevicePlan(False, (DeviceEntry("cuda:0"), DeviceEntry("cuda:0"), DeviceEntry("cuda:1")))),
        ("cuda:0:3,cuda:1:1", DevicePlan(False, (DeviceEntry("cuda:0", 3.0), DeviceEntry("cuda:1", 1.0)))),
        ("cuda:0 : 2.5 , cpu:1", DevicePlan(False, (DeviceEntry("cuda:0", 2.5), DeviceEntry("cpu", 1.0)))),
        ("cuda:007", DevicePlan(False, (DeviceEntry("cuda:7"),))),
    ],
)
def test_parse_device_plan_valid(text, expected):
    assert parse_device_plan(text) == expected


def test_device_list_properties():
    parsed = parse_device_plan("cuda:1:2,cuda:0:1,cuda:1:1")
    assert parsed.weighted
    assert parsed.unique_devices == ("cuda:1", "cuda:0")
    assert not parse_device_plan("cpu,cpu").weighted


@pytest.mark.parametrize(
    "text, message",
    [
        ("", "devices '': '' is not a device"),
        ("cuda:0,", "devices 'cuda:0,': '' is not a device"),
        ("gpu0", "devices 'gpu0': 'gpu0' is not a device"),
        ("cuda:\u00b2", "devices 'cuda:\u00b2': 'cuda:\u00b2' is not a device"),  # int() would say "invalid literal"
        ("cuda:\u0661", "is not a device"),  # Arabic-Indic 1: ASCII digits only
        ("cuda", "devices 'cuda': 'cuda' is not a device"),
        ("cuda:x", "devices 'cuda:x': 'cuda:x' is not a device"),
        ("cuda:-1", "devices 'cuda:-1': 'cuda:-1' is not a device"),
        ("cuda:0:1:2", "devices 'cuda:0:1:2': 'cuda:0:1:2' is not a device"),
        ("cuda:0;cuda:1", "devices 'cuda:0;cuda:1': 'cuda:0;cuda:1' is not a device"),
        ("auto,cuda:0", "devices 'auto,cuda:0': 'auto' cannot be mixed with a device list"),
        ("cuda:0:0,cuda:1:1", "devices 'cuda:0:0,cuda:1:1': weight '0' in 'cuda:0:0' must be a positive number"),
        ("cuda:0:-2", "devices 'cuda:0:-2': weight '-2' in 'cuda:0:-2' must be a positive number"),
        ("cuda:0:x", "devices 'cuda:0:x': weight 'x' in 'cuda:0:x' must be a positive number"),
        ("cuda:0:inf", "devices 'cuda:0:inf': weight 'inf' in 'cuda:0:inf' must be a positive number"),
        ("cuda:0:3,cuda:1", "devices 'cuda:0:3,cuda:1': 'cuda:1' has no weight while others do; give every device a weight or none"),
    ],
)
def test_parse_device_plan_invalid(text, message):
    with pytest.raises(ValueError, match=re.escape(f"{message}") + ".*" + re.escape(f"accepted: {DEVICES_FORM}")):
        parse_device_plan(text)


def test_parse_device_plan_not_a_string():
    with pytest.raises(ValueError, match=re.escape(f"devices ['cuda:0'] is not a string; accepted: {DEVICES_FORM}")):
        parse_device_plan(["cuda:0"])


def test_parse_device_and_component_device():
    assert parse_device(" CUDA:3 ") == "cuda:3"
    assert parse_device("cpu") == "cpu"
    assert parse_component_device("Auto") == "auto"
    assert parse_component_device("cuda:1") == "cuda:1"
    with pytest.raises(ValueError, match=re.escape("device 'cuda:0:2' has a weight; expected 'cpu' or 'cuda:N'")):
        parse_device("cuda:0:2")
    for bad in ("cuda", "cuda:0,cuda:1", "cuda:0:1", "gpu"):
        with pytest.raises(ValueError, match=re.escape(f"device {bad!r} is not valid; accepted: {DEVICE_FORM}")):
            parse_component_device(bad)
    with pytest.raises(ValueError, match=re.escape(f"device None is not a string; accepted: {DEVICE_FORM}")):
        parse_component_device(None)


def test_check_devices_exist():
    check_devices_exist(["cuda:0", "cuda:1", "cpu", "cuda:0"], ("cuda:0", "cuda:1", "cpu"))
    with pytest.raises(ValueError, match=re.escape(
        "device 'cuda:5' does not exist; this machine has cuda:0, cuda:1, cpu; use one of cuda:0, cuda:1 or 'cpu', or 'auto'"
    )):
        check_devices_exist(["cuda:0", "cuda:5"], ("cuda:0", "cuda:1", "cpu"))
    with pytest.raises(ValueError, match=re.escape(
        "device 'cuda:0' does not exist; this machine has cpu; no GPU is visible to torch here: use 'cpu' or 'auto' "
        "(check the driver and CUDA_VISIBLE_DEVICES)"
    )):
        check_devices_exist(["cuda:0"], ("cpu",))


def test_local_and_members_of_a_plan():
    assert local_and_members("cpu,cpu") == ("cpu,cpu", ())
    assert local_and_members("cpu, w1/CPU") == ("cpu", (("w1", "cpu"),))
    assert local_and_members("cuda:0,cuda:1,box-2/cuda:1") == ("cuda:0,cuda:1", (("box-2", "cuda:1"),))
    with pytest.raises(ValueError, match="only worker devices"):
        local_and_members("w1/cpu")
    with pytest.raises(ValueError, match="NAME/DEVICE"):
        local_and_members("cpu,/cpu")
    with pytest.raises(ValueError, match="not a device"):
        local_and_members("cpu,w1/gpu0")
    with pytest.raises(ValueError, match="no weight"):
        local_and_members("cpu,w1/cuda:0:2")


@pytest.mark.parametrize("text", ["w1/cpu,w1/cpu", "cpu,w1/cpu,w1/CPU", "w1/cuda:0, w2/cuda:0,w1/cuda:0"])
def test_a_worker_device_listed_twice_is_refused_first(text):
    """One member ``NAME/DEVICE`` is one rank: listed twice it cannot run. Refused before the
    "only worker devices" rule, whose suggested fix would otherwise carry the repeat along."""
    with pytest.raises(ValueError, match=r"lists the worker device '\w+/\w+(:\d)?' 2 times.*list it once"):
        local_and_members(text)


@pytest.mark.parametrize("text", ["w1/cpu", "w1/cuda:0,w2/cuda:1"])
def test_the_fix_for_only_worker_devices_is_accepted(text):
    import re

    with pytest.raises(ValueError, match="only worker devices") as err:
        local_and_members(text)
    fix = re.search(r"e\.g\. '([^']+)'", str(err.value)).group(1)
    assert local_and_members(fix)[1] == local_and_members("cpu," + text)[1]
