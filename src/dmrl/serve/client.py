"""Python client of ``dmrl serve``: ``reset`` and ``act`` over one WebSocket, numpy in, numpy out.

    with PolicyClient("ws://127.0.0.1:8765") as policy:
        policy.reset(seed=0)
        action = policy.act({"state": obs["state"]})         # (Da,) float32

Needs numpy, msgpack and websockets only (no torch): it runs in a robot's control process.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from dmrl.serve.protocol import decode_array, pack, unpack


class ServerError(RuntimeError):
    """The server refused a request; the message is its one-line ``error``."""


class PolicyClient:
    """One session on a policy server: its own action queue, observation history and noise seed.

    ``url``: ws://HOST:PORT; ``timeout``: seconds to wait for a reply (or to connect) before raising TimeoutError.
    """

    def __init__(self, url: str, timeout: float = 30.0) -> None:
        from websockets.sync.client import connect

        self.timeout = timeout
        # Entered here: PolicyClient is the context manager (websockets 17 warns about a connection never entered).
        self.conn = connect(url, compression=None, open_timeout=timeout, max_size=None).__enter__()
        self.info: dict[str, Any] = self.request({"cmd": "info"})
        """The server's policy: obs_keys, obs_spec {key: {dtype, shape}}, action_dim, To / Tp / Ta, planner."""

    def request(self, msg: Mapping[str, Any]) -> dict[str, Any]:
        """Send one request map, return the reply map (``ok`` true); ServerError with the server's line if not."""
        self.conn.send(pack(dict(msg)))
        reply = unpack(self.conn.recv(timeout=self.timeout))
        if not reply.get("ok"):
            raise ServerError(str(reply.get("error", "server error")))
        return reply

    def reset(self, seed: int | None = None, drop: tuple[str, ...] = ()) -> int:
        """Start an episode (empty history and queue); ``seed`` fixes the sampler noise (None: the server picks
        one); ``drop`` names modalities withheld until the next reset (multimodal policies). Returns the seed."""
        msg: dict[str, Any] = {"cmd": "reset", "drop": list(drop)}
        if seed is not None:
            msg["seed"] = int(seed)
        return int(self.request(msg)["seed"])

    def act(self, obs: Mapping[str, object]) -> np.ndarray:
        """One unbatched step {key: array (rgb uint8 (3V, H, W), depth (V, H, W), vectors (dim,)) or str} ->
        action (Da,) float32. float64 arrays are sent as float32; other values go as they are (the server checks)."""
        wire: dict[str, object] = {}
        for k, v in obs.items():
            if isinstance(v, (str, int, float, bool)) or v is None:  # instruction str; anything else: the server says
                wire[k] = v
                continue
            a = np.asarray(v)
            wire[k] = a.astype(np.float32) if a.dtype == np.float64 else a
        return decode_array(self.request({"cmd": "act", "obs": wire})["action"], "reply action")

    def close(self) -> None:
        self.conn.close()

    def __enter__(self) -> PolicyClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
