"""Distributed settings and member names (pure, no ComfyUI; issue 19's fault run):

- every bad address (``--join``, ``--workers``, ``SHARDDIT_RAY_ADDRESS``) or ``SHARDDIT_DIST_TIMEOUT``
  is a ValueError naming the option, the value and the form (the host logs it once and stays
  local: test_dist_settings_comfy.py);
- one rule for member names (``devices.check_member_name``) where names enter: the nodes' devices
  parser, the members' keys, the worker command.
"""
import re

import pytest
from sharddit.parallel.placement.devices import (
    MEMBER_NAME_FORM,
    check_member_name,
    parse_device_plan,
)
from sharddit.parallel.distributed.config import dist_timeout, parse_addr
from sharddit.parallel.distributed.members import check_member

pytestmark = pytest.mark.no_blas  # no BLAS arithmetic: left out of the other-MKL_CBWR rerun in .ci/run

BAD_ADDRS = ["127.0.0.1:notaport", "127.0.0.1:99999", ":6379", "127.0.0.1:0", "127.0.0.1:", "my host:6379",
             "127.0.0.1:٣٣"]
BAD_TIMEOUTS = ["inf", "-inf", "nan", "1e-9", "0", "-5", "nonsense", "1e9", "86400"]
BAD_NAMES = ["", "a/b", "a,b", "a b", "x" * 33, "x" * 100, "bøx", "a:b", "-rf", ".", "..", "a\n", "ｂox"]


@pytest.mark.parametrize("value", BAD_ADDRS)
def test_a_bad_address_names_the_option_the_value_and_the_form(value):
    with pytest.raises(ValueError) as info:
        parse_addr(value, "--join")
    msg = str(info.value)
    assert msg.startswith("[ShardDiT] --join=") and repr(value.strip()) in msg, msg
    assert "HOST:PORT with a port 1-65535" in msg, msg


def test_good_addresses():
    assert parse_addr("192.168.1.10:6379", "--join") == ("192.168.1.10", 6379)
    assert parse_addr("box2", "--join") == ("box2", 6379)  # Ray's GCS port when none is given
    assert parse_addr("[::1]:7000", "--join") == ("::1", 7000)
    assert parse_addr(" 127.0.0.1:65535 ", "--join") == ("127.0.0.1", 65535)


@pytest.mark.parametrize("value", BAD_TIMEOUTS)
def test_a_bad_timeout_names_the_variable_the_value_and_the_range(monkeypatch, value):
    monkeypatch.setenv("SHARDDIT_DIST_TIMEOUT", value)
    with pytest.raises(ValueError) as info:
        dist_timeout()
    msg = str(info.value)
    assert f"SHARDDIT_DIST_TIMEOUT={value!r} is not a number of seconds from 1 to 3600" in msg, msg


def test_good_timeouts(monkeypatch):
    monkeypatch.delenv("SHARDDIT_DIST_TIMEOUT", raising=False)
    assert dist_timeout() == 60.0
    for text, value in (("8", 8.0), ("1", 1.0), ("3600", 3600.0), (" 2.5 ", 2.5)):
        monkeypatch.setenv("SHARDDIT_DIST_TIMEOUT", text)
        assert dist_timeout() == value


@pytest.mark.parametrize("name", BAD_NAMES)
def test_a_bad_member_name_is_refused_by_the_one_rule_and_by_the_devices_parser(name):
    with pytest.raises(ValueError, match=re.escape(f"--name {name!r} is not {MEMBER_NAME_FORM}")):
        check_member_name(name, "--name")
    if "," not in name and "/" not in name:  # those split the devices string elsewhere
        with pytest.raises(ValueError, match="is not NAME/DEVICE"):
            parse_device_plan(f"cpu,{name}/cpu")
    with pytest.raises(ValueError, match="is not NAME/DEVICE"):
        check_member(f"{name}/cpu")


def test_good_member_names():
    for name in ("w1", "box-2", "a.b_c", "X" * 32, "0"):
        assert check_member_name(name) == name
        assert parse_device_plan(f"cpu,{name}/cuda:1").members == ((name, "cuda:1"),)
        assert check_member(f"{name}/cuda:1") == f"{name}/cuda:1"
    with pytest.raises(ValueError, match="is not NAME/DEVICE"):
        check_member("w1/gpu")
