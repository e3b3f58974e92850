"""Distributed settings and worker names (pure, no ComfyUI; issue 19's fault run):

- every bad ``SHARDDIT_DIST_ADDR`` / ``SHARDDIT_DIST_TIMEOUT`` is a ValueError naming the variable,
  the value and the form (the host logs it once and stays local: test_dist_settings_comfy.py);
- one rule for worker names (``devices.check_member_name``) where names enter: the nodes' devices
  parser, the lobby (a bad registration is skipped and logged once, not enrolled), the worker;
- the address to tell workers for a lobby on a wildcard address is not the wildcard.
"""
import logging
import re

import pytest
from harness import dist_procs
from sharddit.parallel.placement.devices import (
    MEMBER_NAME_FORM,
    check_member_name,
    split_worker_devices,
)
from sharddit.parallel.distributed.config import dist_addr, dist_timeout, parse_addr
from sharddit.parallel.distributed.connect import join_address, this_machine_addresses
from sharddit.parallel.distributed.host import check_member
from sharddit.parallel.distributed.lobby import Lobby

pytestmark = pytest.mark.no_blas  # no BLAS arithmetic: left out of the other-MKL_CBWR rerun in .ci/run

BAD_ADDRS = ["127.0.0.1:notaport", "127.0.0.1:99999", ":29555", "127.0.0.1:0", "127.0.0.1:", "my host:29555",
             "127.0.0.1:٣٣"]
BAD_TIMEOUTS = ["inf", "-inf", "nan", "1e-9", "0", "-5", "nonsense", "1e9", "86400"]
BAD_NAMES = ["", "a/b", "a,b", "a b", "x" * 33, "x" * 100, "bøx", "a:b", "-rf", ".", "..", "a\n", "ｂox"]


@pytest.mark.parametrize("value", BAD_ADDRS)
def test_a_bad_address_names_the_variable_the_value_and_the_form(monkeypatch, value):
    monkeypatch.setenv("SHARDDIT_DIST_ADDR", value)
    with pytest.raises(ValueError) as info:
        dist_addr()
    msg = str(info.value)
    assert msg.startswith("[ShardDiT] SHARDDIT_DIST_ADDR=") and repr(value) in msg, msg
    assert "HOST:PORT with a port 1-65535" in msg, msg


def test_good_addresses():
    assert parse_addr("192.168.1.10:29555") == ("192.168.1.10", 29555)
    assert parse_addr("box2") == ("box2", 29555)
    assert parse_addr("[::1]:7000") == ("::1", 7000)
    assert parse_addr(" 127.0.0.1:65535 ") == ("127.0.0.1", 65535)


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
            split_worker_devices(f"cpu,{name}/cpu")
    with pytest.raises(ValueError, match="is not NAME/DEVICE"):
        check_member(f"{name}/cpu")


def test_good_member_names():
    for name in ("w1", "box-2", "a.b_c", "X" * 32, "0"):
        assert check_member_name(name) == name
        assert split_worker_devices(f"cpu,{name}/cuda:1") == ("cpu", ((name, "cuda:1"),))
        assert check_member(f"{name}/cuda:1") == f"{name}/cuda:1"
    with pytest.raises(ValueError, match="is not NAME/DEVICE"):
        check_member("w1/gpu")


def test_the_lobby_skips_a_bad_registration_and_logs_it_once(caplog):
    """A registration signed with the right secret but with a bad member name (a foreign tool, or a
    secret-holder's typo) is not enrolled: ``devices=auto`` would otherwise fail for every user of
    the host, or take devices the name smuggles in."""
    from sharddit.parallel.distributed import entries
    lobby = Lobby("127.0.0.1", dist_procs.free_port(), 5.0)
    try:
        for i, member in enumerate(("a b/cpu", "good/cpu", "w/gpu")):
            name, _, device = member.partition("/")
            body = {**entries.make_offer("good", "cpu", 1), "member": member, "name": name, "device": device}
            lobby.store.set(entries.slot_key(i), entries.make_entry(lobby.key, "offer", lobby.id, f"n{i}", body))
        with caplog.at_level(logging.WARNING, logger="sharddit"):
            assert list(lobby.workers()) == ["good/cpu"]
            assert list(lobby.workers()) == ["good/cpu"]
            assert "good/cpu" in lobby.describe() and "a b" not in lobby.describe()
        lines = [r.getMessage() for r in caplog.records if "was ignored, not enrolled" in r.getMessage()]
        assert len(lines) == 2, lines  # once per bad member, however often the lobby is read
        assert any("'a b/cpu' is not NAME/DEVICE" in line for line in lines), lines
    finally:
        lobby.close()


def test_a_worker_with_a_bad_name_does_not_register():
    from sharddit.parallel.distributed.worker import Worker

    lobby = Lobby("127.0.0.1", dist_procs.free_port(), 5.0)
    try:
        with pytest.raises(ValueError, match=re.escape(f"worker name 'a,b' is not {MEMBER_NAME_FORM}")):
            Worker(lobby.store, "a,b", "cpu", {"device": "cpu", "free": 1})
        assert lobby.workers() == {}
    finally:
        lobby.close()


def test_workers_are_told_a_reachable_address_for_a_wildcard_lobby():
    assert join_address("192.168.1.10", 29555) == "192.168.1.10:29555"
    assert join_address("::1", 7000) == "[::1]:7000"
    mine = this_machine_addresses()
    assert all(not a.startswith("127.") and a != "0.0.0.0" for a in mine), mine
    for wildcard in ("0.0.0.0", "::"):
        told = join_address(wildcard, 29555)
        assert not told.startswith(wildcard) and told.endswith(":29555"), told
        assert told == (f"{mine[0]}:29555" if len(mine) == 1 else "THIS_MACHINE_IP:29555"), (told, mine)
