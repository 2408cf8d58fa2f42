"""The policy server's wire format: one msgpack map per WebSocket binary message, numpy arrays as plain maps.

Deliberately free of torch and of msgpack extension types, so that a client needs only numpy + msgpack +
websockets in Python, or msgpack-c + any WebSocket library in C++ (docs/serve.md gives the format field by field).

    array    {"dtype": "float32" | "uint8", "shape": [d0, d1, ...], "data": bin}   C order, little-endian bytes
    request  {"cmd": "info"} | {"cmd": "reset", "seed"?: int, "drop"?: [str]}
             | {"cmd": "act", "obs": {key: array | str}}
    reply    {"ok": true, ...fields of the command} | {"ok": false, "error": "one line"}
"""

from __future__ import annotations

from typing import Any

import msgpack
import numpy as np

PROTOCOL = 1
"""Protocol version, sent in the ``info`` reply; a change a v1 client would misread bumps it."""
DTYPES = ("float32", "uint8")
"""The array dtypes on the wire (rgb is uint8, every other array float32)."""
COMMANDS = ("info", "reset", "act")
ARRAY_FIELDS = frozenset(("dtype", "shape", "data"))


class ProtocolError(ValueError):
    """A request the server cannot serve; its message is the one-line ``error`` of the reply."""


def encode_array(a: np.ndarray) -> dict[str, Any]:
    """numpy array -> wire map {"dtype", "shape", "data"} (C order, little-endian)."""
    a = np.asarray(a)
    if a.dtype.name not in DTYPES:
        raise ProtocolError(f"array dtype {a.dtype.name} cannot go on the wire; allowed: {', '.join(DTYPES)}")
    a = np.ascontiguousarray(a, dtype=a.dtype.newbyteorder("<"))
    return {"dtype": a.dtype.name, "shape": list(a.shape), "data": a.tobytes()}


def decode_array(m: object, where: str) -> np.ndarray:
    """Wire map -> numpy array (a writable copy: torch warns on read-only buffers); ``where`` names it in errors."""
    if not isinstance(m, dict) or set(m) != ARRAY_FIELDS:
        got = sorted(map(str, m)) if isinstance(m, dict) else type(m).__name__
        raise ProtocolError(f"{where}: expected an array map with keys data, dtype, shape; got {got}")
    dtype, shape, data = m["dtype"], m["shape"], m["data"]
    if dtype not in DTYPES:
        raise ProtocolError(f"{where}: dtype {dtype!r} is not allowed; allowed: {', '.join(DTYPES)}")
    if not isinstance(shape, list) or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape):
        raise ProtocolError(f"{where}: shape must be a list of ints >= 0, got {shape!r}")
    if not isinstance(data, bytes):
        raise ProtocolError(f"{where}: data must be msgpack bin, got {type(data).__name__}")
    dt = np.dtype(dtype).newbyteorder("<")
    n = int(np.prod(shape, dtype=np.int64)) * dt.itemsize
    if len(data) != n:
        raise ProtocolError(f"{where}: data has {len(data)} bytes; shape {shape} of {dtype} needs {n}")
    return np.frombuffer(data, dtype=dt).reshape(shape).astype(dt.newbyteorder("="))


def pack(msg: dict[str, Any]) -> bytes:
    """A message map -> bytes (numpy arrays anywhere in it encoded as wire maps)."""
    return msgpack.packb(msg, default=_default, use_bin_type=True)


def _default(obj: object) -> object:
    if isinstance(obj, np.ndarray):
        return encode_array(obj)
    if isinstance(obj, np.generic):
        return obj.item()
    raise TypeError(f"cannot pack {type(obj).__name__}")


def unpack(data: bytes | str) -> dict[str, Any]:
    """Bytes of one message -> its map; anything else is a ProtocolError (arrays stay wire maps here)."""
    if isinstance(data, str):
        raise ProtocolError("malformed message: got a text frame; send one msgpack map per binary frame")
    try:
        msg = msgpack.unpackb(data, raw=False, strict_map_key=True)
    except Exception as e:  # msgpack raises several types (ExtraData, FormatError, ValueError, UnicodeDecodeError)
        raise ProtocolError(f"malformed message: not msgpack ({type(e).__name__})") from None
    if not isinstance(msg, dict):
        raise ProtocolError(f"malformed message: expected a msgpack map, got {type(msg).__name__}")
    return msg


def error_reply(message: str) -> bytes:
    """The reply to a request that failed: {"ok": false, "error": its first line}."""
    line = message.splitlines()[0] if message else "error"
    return pack({"ok": False, "error": line})
