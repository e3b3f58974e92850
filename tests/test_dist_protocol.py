"""The control-message protocol (parallel/distributed/protocol.py), the block descriptions members
build from (parallel/distributed/block_specs.py) and the bounds on exchange headers (dist_wire):
no pickle of ours on any network path (a grep of the distributed and cluster modules), every
message checked against its schema; sizes a peer announces refused before allocation (pure, CPU)."""
import json
import pickle
import re
from pathlib import Path

import pytest
import torch
from conftest import REPO
from harness import dist_toys  # noqa: F401 - the toys' block builders
from harness.toy_seq import SeqToyDiT
from sharddit.loaders.comfy.remote import worker_blocks
from sharddit.parallel.distributed.weights import WeightLayout
from sharddit.parallel.distributed.wire import expect_sizes, pack_parts, unpack_expected
from sharddit.parallel.distributed import protocol
from sharddit.parallel.distributed.block_specs import (
    INSECURE_ENV,
    BlockMismatch,
    build_block,
    describe_block,
)
from sharddit.parallel.distributed.protocol import ProtocolError, from_payload, to_payload

pytestmark = pytest.mark.no_blas  # no BLAS arithmetic: left out of the other-MKL_CBWR rerun in .ci/run

NETWORK_MODULES = ["parallel/distributed/*.py", "parallel/cluster/*.py", "loaders/comfy/remote/worker_blocks.py",
                   "loaders/comfy/remote/host_workers.py", "loaders/cli/worker_ray.py"]


class Boom:
    """Unpickling this writes a file: proof that something was unpickled."""

    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return (Path.touch, (Path(self.path),))


def _roundtrip(msg, device="cpu"):
    return from_payload(to_payload(msg), 1 << 20, device)[0]


def _header(payload: bytes) -> bytes:
    return payload[8:8 + int.from_bytes(payload[:8], "little")]


def _payload(head: dict, body: bytes = b"") -> bytes:
    text = json.dumps(head).encode()
    return len(text).to_bytes(8, "little") + text + body


def test_no_pickle_or_torch_load_on_a_network_path():
    hits = []
    for pattern in NETWORK_MODULES:
        paths = sorted(REPO.glob(pattern))
        assert paths, f"{pattern} names no file: the network modules moved, update NETWORK_MODULES"
        for path in paths:
            text = path.read_text()
            for bad in (r"torch\.load\(", r"\bimport pickle\b", r"\bpickle\.", r"weights_only\s*=\s*False",
                        r"\bcopyreg\b", r"\bmarshal\."):
                hits += [f"{path.relative_to(REPO)}: {bad}" for _ in re.finditer(bad, text)]
    assert not hits, hits


def test_a_block_command_round_trips_bit_for_bit_and_tensors_land_on_the_receivers_device():
    sigmas = torch.tensor([0.9, 0.5], dtype=torch.float64)
    x = torch.randn(2, 3, 4, dtype=torch.bfloat16)
    opts = {"sigmas": sigmas, "cond_or_uncond": [0, 1], "scale": float("inf"), "dtype": torch.float16, "n": None}
    msg = {"op": "block", "fid": 3, "key": "abc", "index": 1, "blocks": [],
           "owned": [[1, torch.arange(8, dtype=torch.uint8)]], "transfers": [[2, ("all", 0)], [3, None]],
           "args": [("def", 0, x), ("stream", "x")], "kwargs": [["transformer_options", ("val", opts)]],
           "streams": ["x"], "slice": {"rank": 1, "tokens": (0, 3), "group": {"ranks": (0, 1)}}, "main": 3,
           "text_first": False, "group": [0, 1], "peers": ["host", "w1"], "grad": False, "inference": True}
    got = _roundtrip(msg)
    assert torch.equal(got["args"][0][2], x) and got["args"][0][2].dtype == torch.bfloat16
    opts = got["kwargs"][0][1][1]
    assert torch.equal(opts["sigmas"], sigmas) and opts["scale"] == float("inf") and opts["dtype"] is torch.float16
    assert got["transfers"] == [[2, ("all", 0)], [3, None]] and got["slice"]["tokens"] == (0, 3)
    # the payload carries CPU bytes and no device: the receiver puts them on its own device
    header = _header(to_payload(msg))
    assert b"cuda" not in header and b"device" not in header
    meta = _roundtrip(msg, device="meta")
    assert meta["kwargs"][0][1][1]["sigmas"].device.type == "meta"


@pytest.mark.parametrize("msg", [{"op": "exec", "code": "x"}, {"op": "fetch"}, {"op": "fetch", "name": "x", "more": 1},
                                 {"op": "fetch", "name": 3}, {"op": "holding", "owned": True, "ring": 0, "blocks": []}])
def test_unknown_or_malformed_messages_are_refused(msg):
    with pytest.raises(ProtocolError):
        to_payload(msg)
    with pytest.raises(ProtocolError):  # nor taken from a peer that sends one
        from_payload(_payload({"protocol": protocol.PROTOCOL, "msg": msg, "tensors": []}), 0)


def test_only_allowed_values_and_dtypes_cross_the_wire(tmp_path):
    marker = tmp_path / "pwned"
    with pytest.raises(TypeError, match="cannot cross the wire"):
        to_payload({"op": "tensor", "tensor": Boom(marker)})
    with pytest.raises(TypeError, match="uint16|cannot cross"):
        to_payload({"op": "tensor", "tensor": torch.zeros(2, dtype=torch.uint16)})
    with pytest.raises(ProtocolError):
        protocol.decode_value({"__reduce__": ["os.system", "id"]}, [])
    with pytest.raises(ProtocolError):  # a pickle where a payload belongs: never unpickled
        from_payload(pickle.dumps(Boom(marker)), 1 << 20)
    assert not marker.exists()


def test_an_oversized_tensor_description_is_refused_before_allocation():
    head = {"protocol": protocol.PROTOCOL, "msg": {"op": "tensor", "tensor": {"T": 0}},
            "tensors": [["float32", [2**47, 2**47]]]}
    with pytest.raises(ProtocolError, match=f"announces {2**96} bytes of tensors, more than the {2**30}"):
        from_payload(_payload(head), 2**30)
    head["tensors"] = [["float32", [1, 2, 3, 4, 5, 6, 7, 8, 9]]]
    with pytest.raises(ProtocolError, match="bad tensor shape"):
        from_payload(_payload(head), 2**30)


def test_exchange_parts_are_raw_bytes_sized_by_what_the_receiver_expects():
    """No header crosses the wire: the receiver sizes its buffer from ``expect`` and rebuilds each
    item bit for bit; a peer cannot announce a size."""
    parts = [(torch.randn(2, 3), None, torch.arange(4))]
    data, sizes = pack_parts(parts, [0], "cpu")
    expect = [[(torch.float32, (2, 3)), None, (torch.int64, (4,))]]
    assert sizes == expect_sizes(expect) == [2 * 3 * 4 + 4 * 8] and data.numel() == sizes[0]
    got = unpack_expected(expect, data, "cpu")[0]
    assert torch.equal(got[0], parts[0][0]) and got[1] is None and torch.equal(got[2], parts[0][2])


def test_a_worker_builds_the_block_from_its_description_and_refuses_another_layout():
    torch.manual_seed(0)
    block = SeqToyDiT(dim=32, heads=4).eval().blocks[1]
    desc = _roundtrip({"op": "block", "fid": 0, "key": "k", "index": 0, "blocks": [[0, describe_block(block)]],
                       "owned": [], "transfers": [], "args": [], "kwargs": [], "streams": [], "slice": {}, "main": 0,
                       "text_first": False, "group": [], "peers": [], "grad": False, "inference": True})["blocks"][0][1]
    built = build_block(desc)
    assert type(built) is type(block) and all(t.device.type == "meta" for t in built.parameters())
    assert WeightLayout(built).key == WeightLayout(block).key and built.heads == block.heads
    other = json.loads(json.dumps(desc))
    other["tensors"][0][2][0] += 1  # the host's class has another shape: another version
    with pytest.raises(BlockMismatch, match="on the host"):
        build_block(other)
    other = json.loads(json.dumps(desc))
    other["modules"][1][1] = "evil.module:Thing"
    with pytest.raises(BlockMismatch, match="install the same"):
        build_block(other)
    with pytest.raises(BlockMismatch, match="cannot build 'pickle' blocks"):
        build_block({**desc, "family": "pickle"})


def test_workers_refuse_custom_operations_unless_the_user_opts_in(monkeypatch):
    monkeypatch.delenv(INSECURE_ENV, raising=False)
    with pytest.raises(BlockMismatch, match=INSECURE_ENV):
        worker_blocks._ops("custom_nodes.ComfyUI-GGUF.ops:GGMLOps")
    with pytest.raises(BlockMismatch, match="cannot build"):
        worker_blocks._ops("comfy.ops:mixed_precision_ops.<locals>.MixedPrecisionOps")
    with pytest.raises(BlockMismatch, match="not one of ComfyUI's"):
        worker_blocks._model({"module": "os", "class": "system", "unet_config": {}, "ops": "comfy.ops:manual_cast"})
    monkeypatch.setenv(INSECURE_ENV, "1")
    assert worker_blocks._ops("json:JSONDecoder") is json.JSONDecoder  # the opt-in: the host names the module


def test_the_protocol_lists_every_message_host_and_worker_use():
    used = set()
    for path in ("parallel/distributed/serving.py", "parallel/distributed/ranks.py", "parallel/cluster/rank_server.py"):
        used |= set(re.findall(r'"op": "(\w+)"', (REPO / path).read_text()))
    assert used <= set(protocol.MESSAGES) and {"block", "fetch", "drop", "held", "ok", "error"} <= used, used
    assert Path(protocol.__file__).name == "protocol.py"


def test_the_comfy_description_sends_plain_config_values_only():
    dit = SeqToyDiT(dim=32, heads=4)
    describe = worker_blocks.describer(dit, {"dim": 32, "dtype": torch.bfloat16, "patch_size": (1, 2, 2),
                                             "hook": object(), "_private": 1}, {1: "blocks.1"})
    family, config = describe(1, dit.blocks[1])
    assert family == "comfy" and config["path"] == "blocks.1" and config["class"] == "SeqToyDiT"
    assert config["unet_config"] == {"dim": 32, "dtype": torch.bfloat16, "patch_size": (1, 2, 2)}
    assert describe_block(dit.blocks[1], lambda b: describe(1, b))["family"] == "comfy"


def test_received_bytes_must_be_exactly_what_was_expected():
    """Trailing bytes after the expected parts are refused, not ignored (a peer out of step)."""
    parts = [(torch.randn(2, 3), None)]
    data, _ = pack_parts(parts, [0], "cpu")
    longer = torch.cat([data, torch.zeros(4, dtype=data.dtype)])
    with pytest.raises(ProtocolError, match=f"{longer.numel()} bytes received, {data.numel()} expected"):
        unpack_expected([[(torch.float32, (2, 3)), None]], longer, "cpu")


def test_a_worker_refuses_owned_weights_that_do_not_fill_the_layout_exactly():
    """The bytes of a block a worker is to own must be exactly its layout's size (uint8): a longer
    buffer would be bound silently, its tail ignored."""
    from sharddit.parallel.distributed.weights import pack_block
    from sharddit.parallel.distributed.serving import BlockServer

    torch.manual_seed(0)
    block = SeqToyDiT(dim=32, heads=4).eval().blocks[1]
    flat = pack_block(block, WeightLayout(block))

    def take(owned):
        w = BlockServer("w", "cpu", "gloo", 1, {}, {}, 5.0, say=[].append)  # only its weight intake: no session
        w.take_weights(None, {"key": "k", "blocks": [[0, describe_block(block)]], "owned": [[0, owned]],
                              "transfers": []})
        return w

    w = take(flat)
    assert torch.equal(w.owned[("k", 0)][0].qkv.weight, block.qkv.weight)
    for bad in (torch.cat([flat, flat[:8]]), flat[:-8], flat.view(torch.int16)):
        with pytest.raises(ProtocolError, match="block 0: its weights do not match its layout"):
            take(bad)


def test_a_payload_round_trips_bit_for_bit_and_refuses_every_malformed_one():
    """``to_payload`` / ``from_payload`` (commands and replies in Ray calls): tensors come back bit
    for bit (NaN, -0.0, bf16); a payload that is not bytes, whose header length runs past it or
    past MAX_HEADER_BYTES, whose header is not JSON or names another protocol, whose tensors exceed
    the receiver's limit or do not fill the rest exactly, is refused naming why, before any
    tensor is made."""
    t = torch.tensor([float("nan"), -0.0, 1.5], dtype=torch.bfloat16)
    msg = {"op": "tensor", "tensor": t}
    payload = protocol.to_payload(msg)
    got, nbytes = protocol.from_payload(payload, t.numel() * 2)
    assert nbytes == 6 and got["tensor"].dtype == torch.bfloat16
    assert torch.equal(got["tensor"].view(torch.int16), t.view(torch.int16))
    n = int.from_bytes(payload[:8], "little")
    header = json.loads(payload[8:8 + n])
    other = json.dumps({**header, "protocol": protocol.PROTOCOL + 1}).encode()
    cases = {
        "must be bytes": "not bytes",
        "announces a 9223372036854775807-byte header": (2**63 - 1).to_bytes(8, "little") + payload[8:],
        "is not JSON": (5).to_bytes(8, "little") + b"{{{{{" + b"\0" * 6,
        f"protocol {protocol.PROTOCOL + 1}": len(other).to_bytes(8, "little") + other + payload[8 + n:],
        "announces 6 bytes of tensors and carries 5": payload[:-1],
        "announces 6 bytes of tensors and carries 7": payload + b"\0",
        "more than the 4 expected here": (payload, 4),
    }
    for said, bad in cases.items():
        bad, limit = bad if isinstance(bad, tuple) else (bad, 1 << 20)
        with pytest.raises(ProtocolError, match=re.escape(said)):
            protocol.from_payload(bad, limit)


def test_a_rank_reports_a_failed_command_by_its_reason_so_the_host_says_the_prefix_once():
    """A member's failed command travels home as text (``op: error``) that the host puts inside its own
    ``DistWorkerError``: the text carries the failure's reason, not a second ``[ShardDiT]``."""
    from sharddit.parallel.cluster.rank_server import RankServer
    from sharddit.parallel.errors import RunError

    class FailingServer:  # a session's block server whose command fails as serving.BlockServer's can
        device = torch.device("cpu")

        def command(self, msg):
            raise RunError("block 3: its weights were not sent to this worker")

        def release(self):
            pass

    rank = RankServer("box2/cpu", "cpu")
    rank.server = FailingServer()
    reply, _ = from_payload(rank.command(to_payload({"op": "held"})), 1 << 20)
    assert reply == {"op": "error", "error": "RunError: block 3: its weights were not sent to this worker"}
    assert rank.server is None  # the rank left the session
    rank.server = FailingServer()
    reply, _ = from_payload(rank.command(b"\x00" * 4), 1 << 20)
    assert reply["error"].startswith("invalid command: ") and "[ShardDiT]" not in reply["error"], reply
