"""Lobby entries and the rules around them, without a network (issue 23, items 2, 3, 5, 8):
signed entries verify only unaltered and under the same secret; offers carry the protocol and
versions and are checked field by field within stated limits; one strict member pattern; the
listen address is private unless the user opts in; the duplicate-GPU rule on fake offers; each
worker process makes its own CUDA device current before ComfyUI's import (checked by the call
order, on CPU); ``worker --new-secret`` prints a fresh secret."""
import re

import pytest
from sharddit.parallel.distributed.config import check_listen_address, dist_addr
from sharddit.parallel.distributed import entries
from sharddit.parallel.distributed.entries import BadEntry

pytestmark = pytest.mark.no_blas  # no BLAS arithmetic: left out of the other-MKL_CBWR rerun in .ci/run

KEY = b"k" * 40
OTHER = b"o" * 40


def _offer(**changes):
    return {**entries.make_offer("w1", "cpu", 2**30), **changes}


def test_an_entry_verifies_only_unaltered_and_under_its_secret_and_session():
    raw = entries.make_entry(KEY, "offer", "lobbyA", "n1", _offer())
    assert entries.open_entry(KEY, raw, "offer", session="lobbyA")["body"]["member"] == "w1/cpu"
    with pytest.raises(BadEntry, match="signature does not verify"):
        entries.open_entry(OTHER, raw, "offer")
    altered = raw.replace(b'"free": 1073741824', b'"free": 1073741825')
    assert altered != raw
    with pytest.raises(BadEntry, match="signature does not verify"):
        entries.open_entry(KEY, altered, "offer")
    with pytest.raises(BadEntry, match="another lobby or session"):  # a replay from an earlier host run
        entries.open_entry(KEY, raw, "offer", session="lobbyB")
    with pytest.raises(BadEntry, match="not a signed invite"):  # an offer is never an invitation
        entries.open_entry(KEY, raw, "invite")
    for junk, why in ((b"w1/cpu", "not a signed ShardDiT entry"), (b"x" * 9000, "more than 8192"),
                      (None, "missing"), (b'{"kind": "offer", "body": {}, "mac": 5}', "not a short string")):
        with pytest.raises(BadEntry, match=why):
            entries.open_entry(KEY, junk, "offer")


def test_offers_carry_protocol_and_versions_and_are_checked_within_limits():
    offer = _offer()
    assert offer["protocol"] == entries.PROTOCOL and set(offer["versions"]) == {"sharddit", "torch", "comfyui"}
    assert re.fullmatch(r"\d+\.\d+\.\d+.*", offer["versions"]["sharddit"]), offer["versions"]
    assert entries.check_offer(offer)["member"] == "w1/cpu"
    bad = {
        "protocol": (1, f"protocol 1, this host {entries.PROTOCOL}"),
        "free": (2**62, "free memory .* is not a whole number from 0 to 1125899906842624"),
        "pid": (-1, "pid"),
        "member": ("w2/cpu", "does not match its name and device"),
        "host": ("x" * 300, "host name"),
        "versions": ({"torch": "2"}, "versions"),
        "gpu_uuid": (7, "GPU UUID"),
    }
    for field, (value, why) in bad.items():
        with pytest.raises(BadEntry, match=why):
            entries.check_offer(_offer(**{field: value}))
    with pytest.raises(BadEntry, match="free memory"):  # a bool is no count
        entries.check_offer(_offer(free=True))


@pytest.mark.parametrize("member", ["evil/cpu,cuda:7", "w1/cuda:07", "w1/cuda:99999", "w1/CPU", "w1/gpu", "w1",
                                    "-x/cpu", "a b/cpu", "w1/cpu\n", "x" * 33 + "/cpu", None, 7])
def test_one_strict_member_pattern(member):
    with pytest.raises(BadEntry, match="is not NAME/DEVICE"):
        entries.check_member(member)


def test_good_members():
    for member in ("w1/cpu", "box-2.a_b/cuda:0", "X" * 32 + "/cuda:1023", "0/cuda:7"):
        assert entries.check_member(member) == member


def _invite(**changes):
    body = {"member": "w1/cpu", "rank": 1, "world": 2, "groups": [[0, 1]], "backend": "gloo", "timeout_s": 8.0,
            **changes}
    return {"session": "L.3", "nonce": "n1", "body": body}


def test_invites_are_checked_field_by_field():
    assert entries.check_invite(_invite(), "L", "n1", "w1/cpu")["n"] == 3
    cases = [
        ((_invite(), "M", "n1", "w1/cpu"), "another lobby or session"),
        ((_invite(), "L", "n2", "w1/cpu"), "earlier registration"),
        ((_invite(member="w2/cpu"), "L", "n1", "w1/cpu"), "invites 'w2/cpu'"),
        ((_invite(world=10**6), "L", "n1", "w1/cpu"), "world size"),
        ((_invite(rank=2), "L", "n1", "w1/cpu"), "rank"),
        ((_invite(groups=[[0, 5]]), "L", "n1", "w1/cpu"), "groups"),
        ((_invite(backend="mpi"), "L", "n1", "w1/cpu"), "backend"),
        ((_invite(timeout_s=7 * 86400), "L", "n1", "w1/cpu"), "timeout"),
    ]
    for args, why in cases:
        with pytest.raises(BadEntry, match=why):
            entries.check_invite(*args)


def test_the_duplicate_gpu_rule_on_fake_offers():
    uuid = "GPU-6f1c2a44-1111-2222-3333-444455556666"
    same = {"box2/cuda:0": {"device": "cuda:0", "gpu_uuid": uuid[4:].upper()}}  # torch's form, NVML's prefix dropped
    backend, why = entries.choose_backend({"cuda:0": uuid}, same)
    assert backend == "gloo", why
    assert "this machine's cuda:0 and box2/cuda:0 are the same physical GPU" in why and "NCCL" in why, why
    other = {"box2/cuda:0": {"device": "cuda:0", "gpu_uuid": "GPU-aaaa"}}
    assert entries.choose_backend({"cuda:0": uuid}, other)[0] == "nccl"
    two = {"a/cuda:0": {"device": "cuda:0", "gpu_uuid": "u1"}, "b/cuda:1": {"device": "cuda:1", "gpu_uuid": "U1"}}
    assert entries.choose_backend({"cuda:0": "u0"}, two)[0] == "gloo"
    unknown = {"box2/cuda:0": {"device": "cuda:0", "gpu_uuid": ""}}
    assert entries.choose_backend({"cuda:0": ""}, unknown)[0] == "nccl"  # nothing known: nothing to refuse
    assert entries.choose_backend({"cpu": ""}, other) == ("gloo", "a rank is not a CUDA device")


@pytest.mark.parametrize("host,what", [("0.0.0.0", "every interface"), ("::", "every interface"),
                                       ("8.8.8.8", "the public address 8.8.8.8")])
def test_a_wildcard_or_public_listen_address_is_refused_unless_opted_in(monkeypatch, host, what):
    with pytest.raises(ValueError, match=re.escape(f"listens on {what}")) as info:
        check_listen_address(host)
    assert "SHARDDIT_DIST_PUBLIC=1" in str(info.value) and "WireGuard" in str(info.value)
    check_listen_address(host, public_ok=True)
    monkeypatch.setenv("SHARDDIT_DIST_ADDR", f"[{host}]:29555" if ":" in host else f"{host}:29555")
    monkeypatch.delenv("SHARDDIT_DIST_PUBLIC", raising=False)
    with pytest.raises(ValueError, match="SHARDDIT_DIST_ADDR"):
        dist_addr()
    monkeypatch.setenv("SHARDDIT_DIST_PUBLIC", "1")
    assert dist_addr() == (host, 29555)


def test_private_listen_addresses_pass():
    for host in ("127.0.0.1", "192.168.1.10", "10.0.0.2", "172.16.5.4", "100.101.1.2", "fd00::1", "::1", "localhost"):
        check_listen_address(host)


def test_each_worker_process_binds_its_cuda_device_before_comfyui(monkeypatch):
    """What a child of ``worker --devices cuda:0,cuda:1`` does first: its own device becomes
    current (``torch.cuda.set_device``) before ComfyUI's import makes a CUDA context (CPU
    machine: the calls are recorded, in order)."""
    import torch
    from sharddit.loaders.cli import worker_command
    from sharddit.parallel.distributed.worker import bind_device

    calls = []
    monkeypatch.setattr(torch.cuda, "set_device", lambda i: calls.append(("set_device", i)))
    monkeypatch.setattr(worker_command, "import_comfyui", lambda **kw: calls.append(("import_comfyui",)))
    monkeypatch.setattr(worker_command, "_serve_one", lambda *a: calls.append(("serve",) + a[2:4]) or 0)
    args = type("Args", (), {"name": "w1", "wait": 5.0, "join": "127.0.0.1:1", "verbose": False})()
    assert worker_command.start_one(args, "127.0.0.1", 1, "cuda:1") == 0
    assert calls == [("set_device", 1), ("import_comfyui",), ("serve", "w1", "cuda:1")], calls
    calls.clear()
    bind_device("cpu")
    assert calls == []
    children = [worker_command.member_command(args, d) for d in ("cuda:0", "cuda:1")]
    assert [c[c.index("--devices") + 1] for c in children] == ["cuda:0", "cuda:1"], children


def test_new_secret_prints_a_fresh_secret(capsys):
    """``python <pack-dir> worker --new-secret`` through the pack's own command line (in process:
    a subprocess costs seconds of imports), twice: two different 256-bit secrets."""
    from sharddit.loaders.cli.main import main

    printed = []
    for _ in range(2):
        assert main(["worker", "--new-secret"]) == 0
        printed.append(capsys.readouterr().out)
    for out in printed:
        assert re.fullmatch(r"[0-9a-f]{64}\n", out), out
    assert printed[0] != printed[1]
