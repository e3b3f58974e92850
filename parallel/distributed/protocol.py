"""The control messages of a distributed session: every message, its fields and their checks (pure).

Nothing a peer sends is unpickled. A message is a JSON object (``op`` plus the fields ``MESSAGES``
lists) and a table of tensors, each sent as dtype (``DTYPES``, an allow-list), shape and raw bytes,
all in one bytes object (``to_payload`` / ``from_payload``) carried by Ray's token-authenticated
calls. Tensor counts and sizes come only from the header and are checked against the receiver's
limit before anything is allocated. Values are JSON with tagged forms for what JSON lacks
(``encode_value``): ``{"T": i}`` tensor ``i``, ``{"tuple": [...]}``, ``{"dict": [[key, value]]}``,
``{"dtype": "float16"}``, ``{"float": "nan"}``. Tensors leave as CPU bytes, land on the receiver's device.
"""
from __future__ import annotations

import json
import math

import torch
from ..errors import InputError, InputTypeError

__all__ = ["DTYPES", "MAX_HEADER_BYTES", "MESSAGES", "PROTOCOL", "ProtocolError", "check_message", "decode_value",
           "dtype_name", "encode_value", "from_payload", "tensor_nbytes", "tensors_from_bytes", "to_payload"]

PROTOCOL = 3
"""Version of the distributed protocol, raised with any change to these messages (2 was the
lobby's signed messages, 1 pickled ones). A mismatch is refused naming both sides."""
MAX_HEADER_BYTES = 8 << 20
"""A control header is a few KB (a block command with its per-tensor layout); 8 MiB is ample."""
MAX_TENSORS = 4096
MAX_NDIM = 8
MAX_DEPTH = 12

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16, "float64": torch.float64,
          "int64": torch.int64, "int32": torch.int32, "int16": torch.int16, "int8": torch.int8, "uint8": torch.uint8,
          "bool": torch.bool, "complex64": torch.complex64, "float8_e4m3fn": torch.float8_e4m3fn,
          "float8_e5m2": torch.float8_e5m2}
"""The dtypes that may cross the wire, by name; anything else is refused on both sides."""
_NAMES = {d: n for n, d in DTYPES.items()}

_ANY = object()
_INT, _STR, _BOOL, _LIST, _DICT = int, str, bool, list, dict
MESSAGES: dict[str, dict[str, object]] = {
    # host -> member commands
    "block": {"fid": _INT, "key": _STR, "index": _INT, "blocks": _LIST, "owned": _LIST, "transfers": _LIST,
              "args": _LIST, "kwargs": _LIST, "streams": _LIST, "slice": _DICT, "main": _INT, "text_first": _BOOL,
              "group": _LIST, "peers": _LIST, "grad": _BOOL, "inference": _BOOL},
    "fetch": {"name": _STR},
    "drop": {"key": _STR},
    "held": {},
    # worker -> host replies
    "ok": {},
    "tensor": {"tensor": _ANY},
    "holding": {"owned": _INT, "ring": _INT, "blocks": _LIST},
    "error": {"error": _STR},
}
"""Every control message: op -> {field: type}. ``block``: ``blocks`` [[index, description]] (the
block layouts, ``distributed.block_specs``), ``owned`` [[index, value]] (weights of blocks the
worker keeps), ``transfers`` [[index, [group, source] or None]], ``args`` [value], ``kwargs``
[[name, value]]."""


class ProtocolError(InputError):
    """A message that is malformed, too large or of another protocol."""


def dtype_name(dtype: torch.dtype) -> str:
    name = _NAMES.get(dtype)
    if name is None:
        raise InputTypeError(f"dtype {dtype} cannot cross the wire (allowed: {', '.join(DTYPES)})")
    return name


# ---- values ---------------------------------------------------------------------------------------
def encode_value(v, tensors: list, depth: int = 0):
    """``v`` as JSON; its tensors appended to ``tensors`` (CPU, contiguous). TypeError for anything
    else (a class instance would need pickle)."""
    if depth > MAX_DEPTH:
        raise InputTypeError(f"a value nests deeper than {MAX_DEPTH} levels; it cannot cross the wire")
    if v is None or isinstance(v, (bool, int, str)):
        return v
    if isinstance(v, float):
        return v if math.isfinite(v) else {"float": repr(v)}
    if isinstance(v, torch.Tensor):
        dtype_name(v.dtype)
        tensors.append(v)
        return {"T": len(tensors) - 1}
    if isinstance(v, torch.dtype):
        return {"dtype": dtype_name(v)}
    if isinstance(v, tuple) and not hasattr(v, "_fields"):
        return {"tuple": [encode_value(x, tensors, depth + 1) for x in v]}
    if isinstance(v, list):
        return [encode_value(x, tensors, depth + 1) for x in v]
    if isinstance(v, dict) and all(isinstance(k, str) for k in v):
        return {"dict": [[k, encode_value(x, tensors, depth + 1)] for k, x in v.items()]}
    raise InputTypeError(f"a value of type {type(v).__name__} cannot cross the wire (tensors, numbers, "
                         "strings, tuples, lists and dicts with string keys only)")


def decode_value(v, tensors: list, depth: int = 0):
    """The value ``encode_value`` made; ProtocolError for anything it does not make."""
    if depth > MAX_DEPTH:
        raise ProtocolError(f"a value nests deeper than {MAX_DEPTH} levels")
    if v is None or isinstance(v, (bool, int, str, float)):
        return v
    if isinstance(v, list):
        return [decode_value(x, tensors, depth + 1) for x in v]
    if isinstance(v, dict) and len(v) == 1:
        (tag, x), = v.items()
        if tag == "T" and type(x) is int and 0 <= x < len(tensors):
            return tensors[x]
        if tag == "tuple" and isinstance(x, list):
            return tuple(decode_value(y, tensors, depth + 1) for y in x)
        if tag == "dict" and isinstance(x, list) and all(isinstance(p, list) and len(p) == 2
                                                          and isinstance(p[0], str) for p in x):
            return {k: decode_value(y, tensors, depth + 1) for k, y in x}
        if tag == "dtype" and x in DTYPES:
            return DTYPES[x]
        if tag == "float" and x in ("nan", "inf", "-inf"):
            return float(x)
    raise ProtocolError(f"not a value of this protocol: {str(v)[:80]}")


# ---- messages -------------------------------------------------------------------------------------
def check_message(msg) -> dict:
    """``msg`` if it is a known message with exactly its fields, of their types; else ProtocolError."""
    if not isinstance(msg, dict) or msg.get("op") not in MESSAGES:
        op = msg.get("op") if isinstance(msg, dict) else type(msg).__name__
        raise ProtocolError(f"unknown message {str(op)[:40]!r}")
    fields = MESSAGES[msg["op"]]
    got = set(msg) - {"op"}
    if got != set(fields):
        raise ProtocolError(f"message {msg['op']!r} has fields {sorted(got)}, expected {sorted(fields)}")
    for name, kind in fields.items():
        value = msg[name]
        if kind is _ANY:
            continue
        if (kind is int and (type(value) is not int)) or not isinstance(value, kind):
            raise ProtocolError(f"message {msg['op']!r}: field {name!r} is {type(value).__name__}, not {kind.__name__}")
    return msg


def tensor_nbytes(spec) -> int:
    """Bytes of one tensor described as ``[dtype name, shape]``; ProtocolError for a bad one."""
    if not (isinstance(spec, list) and len(spec) == 2 and spec[0] in DTYPES and isinstance(spec[1], list)):
        raise ProtocolError(f"bad tensor description {str(spec)[:80]}")
    shape = spec[1]
    if len(shape) > MAX_NDIM or not all(type(s) is int and 0 <= s < 2**48 for s in shape):
        raise ProtocolError(f"bad tensor shape {str(shape)[:80]}")
    return math.prod(shape) * DTYPES[spec[0]].itemsize


def tensors_from_bytes(specs: list, body: torch.Tensor, device) -> list[torch.Tensor]:
    """The tensors of a checked header out of its raw bytes (a uint8 CPU tensor), on ``device``."""
    out, offset = [], 0
    for spec in specs:
        n = tensor_nbytes(spec)
        dtype, shape = DTYPES[spec[0]], spec[1]
        raw = body[offset:offset + n].clone()  # own storage, aligned for the dtype view
        offset += n
        t = raw.view(dtype).reshape(shape) if n else torch.empty(shape, dtype=dtype)
        out.append(t.to(device))
    return out


# ---- payloads: one message as one bytes object (Ray's authenticated calls carry it) ---------------
_LEN = 8


def to_payload(msg: dict) -> bytes:
    """A checked message as bytes: an 8-byte little-endian header length, the JSON header
    ``{"protocol", "msg", "tensors"}``, then the tensors' raw bytes. Unsigned: the transport that
    carries it (Ray's token-authenticated calls) says who sent it."""
    check_message(msg)
    tensors: list = []
    body = {k: encode_value(v, tensors) for k, v in msg.items()}
    if len(tensors) > MAX_TENSORS:
        raise InputError(f"a message carries {len(tensors)} tensors, at most {MAX_TENSORS}")
    cpu = [t.detach().to("cpu").contiguous() for t in tensors]
    specs = [[dtype_name(t.dtype), list(t.shape)] for t in cpu]
    text = json.dumps({"protocol": PROTOCOL, "msg": body, "tensors": specs}, allow_nan=False,
                      separators=(",", ":")).encode()
    raw = [t.reshape(-1).view(torch.uint8).numpy().tobytes() for t in cpu if t.numel()]
    return b"".join([len(text).to_bytes(_LEN, "little"), text, *raw])


def from_payload(payload, max_body: int, device="cpu") -> tuple[dict, int]:
    """(message, bytes) of a payload ``to_payload`` made; ProtocolError for anything else: not
    bytes, a header longer than ``MAX_HEADER_BYTES`` or than the payload, not JSON, another
    protocol, tensors over ``max_body`` bytes or not exactly filling the rest. Every size is
    checked before a tensor is made; tensors land on ``device``."""
    if not isinstance(payload, (bytes, bytearray)) or len(payload) < _LEN:
        raise ProtocolError(f"a payload must be bytes of at least {_LEN}, got {type(payload).__name__}")
    n = int.from_bytes(payload[:_LEN], "little")
    if n > MAX_HEADER_BYTES or n > len(payload) - _LEN:
        raise ProtocolError(f"a payload announces a {n}-byte header in {len(payload)} bytes")
    try:
        data = json.loads(payload[_LEN:_LEN + n])
    except (ValueError, UnicodeDecodeError) as e:
        raise ProtocolError(f"a payload header is not JSON ({e})") from None
    if not (isinstance(data, dict) and set(data) == {"protocol", "msg", "tensors"} and isinstance(data["msg"], dict)
            and isinstance(data["tensors"], list) and len(data["tensors"]) <= MAX_TENSORS):
        raise ProtocolError("a payload header lacks protocol/msg/tensors")
    if data["protocol"] != PROTOCOL:
        raise ProtocolError(f"the peer speaks ShardDiT protocol {str(data['protocol'])[:12]}, this side {PROTOCOL}: "
                            "run the same ShardDiT version on both")
    nbytes = sum(tensor_nbytes(s) for s in data["tensors"])
    if nbytes > max_body:
        raise ProtocolError(f"message {str(data['msg'].get('op'))[:20]!r} announces {nbytes} bytes of tensors, more "
                            f"than the {max_body} expected here")
    if nbytes != len(payload) - _LEN - n:
        raise ProtocolError(f"a payload announces {nbytes} bytes of tensors and carries {len(payload) - _LEN - n}")
    body = torch.frombuffer(bytearray(payload[_LEN + n:]), dtype=torch.uint8) if nbytes else torch.empty(
        0, dtype=torch.uint8)
    tensors = tensors_from_bytes(data["tensors"], body, device)
    return check_message({k: decode_value(v, tensors) for k, v in data["msg"].items()}), nbytes
