"""Every bad request gets a one-line error reply, the connection stays usable, and other clients are unaffected."""

from __future__ import annotations

import msgpack
import numpy as np
import pytest
from serve_helpers import STATE_DIM, state_obs, wait_sessions

from dmrl.serve.client import PolicyClient
from dmrl.serve.protocol import encode_array, pack, unpack

GOOD = encode_array(np.zeros(STATE_DIM, np.float32))


def _arr(dtype: str, shape: list[int], nbytes: int) -> dict:
    return {"dtype": dtype, "shape": shape, "data": b"\x00" * nbytes}


CASES = {
    "not-msgpack": (b"\xc1\xc1 not msgpack", "malformed message: not msgpack"),
    "text-frame": ("hello", "malformed message: got a text frame"),
    "not-a-map": (msgpack.packb([1, 2]), "malformed message: expected a msgpack map, got list"),
    "int-map-key": (msgpack.packb({1: 2}), "malformed message: not msgpack"),
    "no-cmd": ({}, "unknown cmd None; allowed: info, reset, act"),
    "unknown-cmd": ({"cmd": "fly"}, "unknown cmd 'fly'; allowed: info, reset, act"),
    "act-no-obs": ({"cmd": "act"}, "act: obs must be a map {key: array | str}, got NoneType"),
    "missing-modality": ({"cmd": "act", "obs": {}}, "act: obs lacks 'state' (the policy reads state); send it"),
    "unknown-key": ({"cmd": "act", "obs": {"state": GOOD, "rgb": GOOD}}, "obs key 'rgb' is not read by the policy"),
    "wrong-shape": (
        {"cmd": "act", "obs": {"state": _arr("float32", [STATE_DIM - 1], 4 * (STATE_DIM - 1))}},
        "act: obs['state'] is float32 [6]; the policy wants float32 [7] (one unbatched step)",
    ),
    "batched": (
        {"cmd": "act", "obs": {"state": _arr("float32", [1, STATE_DIM], 4 * STATE_DIM)}},
        "act: obs['state'] is float32 [1, 7]; the policy wants float32 [7]",
    ),
    "wrong-dtype": (
        {"cmd": "act", "obs": {"state": _arr("uint8", [STATE_DIM], STATE_DIM)}},
        "act: obs['state'] is uint8 [7]; the policy wants float32 [7]",
    ),
    "float64": (
        {"cmd": "act", "obs": {"state": _arr("float64", [STATE_DIM], 8 * STATE_DIM)}},
        "act: obs['state']: dtype 'float64' is not allowed; allowed: float32, uint8",
    ),
    "short-data": (
        {"cmd": "act", "obs": {"state": _arr("float32", [STATE_DIM], 3)}},
        "act: obs['state']: data has 3 bytes; shape [7] of float32 needs 28",
    ),
    "list-not-array": ({"cmd": "act", "obs": {"state": [0.0] * STATE_DIM}}, "expected an array map"),
    "bad-shape-field": ({"cmd": "act", "obs": {"state": {**GOOD, "shape": "7"}}}, "shape must be a list of ints"),
    "str-data": ({"cmd": "act", "obs": {"state": {**GOOD, "data": "abc"}}}, "data must be msgpack bin, got str"),
    "nan": (
        {"cmd": "act", "obs": {"state": encode_array(np.full(STATE_DIM, np.nan, np.float32))}},
        "act: obs['state'] has NaN or inf values",
    ),
    "bad-seed": ({"cmd": "reset", "seed": "x"}, "reset: seed must be an int in 0 .. 2**63 - 1, got 'x'"),
    "negative-seed": ({"cmd": "reset", "seed": -1}, "reset: seed must be an int"),
    "reset-extra-field": ({"cmd": "reset", "sed": 1}, "reset: unknown field 'sed'; allowed: seed, drop"),
    "drop-lowdim": ({"cmd": "reset", "drop": ["state"]}, "reset: drop needs a multimodal policy"),
    "drop-unknown": ({"cmd": "reset", "drop": ["rgb"]}, "reset: drop 'rgb' is not a key of the policy (state)"),
    "drop-not-list": ({"cmd": "reset", "drop": "state"}, "reset: drop must be a list of key strings"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_bad_request_gets_one_line_error_and_the_connection_keeps_serving(server, case):
    request, expected = CASES[case]
    steps = state_obs(9, 3)
    with PolicyClient(server.url) as bad, PolicyClient(server.url) as other:
        other.reset(seed=1)
        before = other.act(steps[0])
        bad.reset(seed=2)
        bad.act(steps[0])  # mid-episode: an error must not cost the client its session
        bad.conn.send(request if isinstance(request, (bytes, str)) else pack(request))
        reply = unpack(bad.conn.recv(timeout=5))
        assert reply["ok"] is False and set(reply) == {"ok", "error"}
        assert expected in reply["error"] and "\n" not in reply["error"]
        assert bad.request({"cmd": "info"})["protocol"] == 1  # same connection, still served
        assert bad.act(steps[1]).shape == (3,)
        assert np.isfinite(other.act(steps[1])).all() and before.shape == (3,)
        wait_sessions(server, 2)


def test_a_message_over_the_size_limit_closes_only_its_connection(server):
    from websockets.exceptions import ConnectionClosed

    with PolicyClient(server.url) as other, PolicyClient(server.url) as big:
        other.reset(seed=0)
        big.conn.send(b"\x00" * (server.max_size + 1))
        with pytest.raises(ConnectionClosed) as e:
            big.conn.recv(timeout=5)
        assert e.value.rcvd is not None and e.value.rcvd.code == 1009  # message too big
        assert other.act(state_obs(0, 1)[0]).shape == (3,)
