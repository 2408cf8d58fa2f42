"""Per-client acting state of the policy server: one policy's weights shared, one action queue, observation
history and noise generator per client (receding-horizon execution as :meth:`ChunkPolicy.act`, kept per robot).

Seeding: ``reset(seed)`` starts the client's sampler noise from ``seed``. With the torch planner the chunk noise is
drawn from a CPU ``torch.Generator`` seeded with it, which draws what ``torch.manual_seed(seed)`` makes the global
RNG draw: the actions equal ``torch.manual_seed(seed); policy.reset(); policy.act(obs)...`` on the same
observations. With ``--onnx`` the noise comes from ``np.random.default_rng(seed)``, as
``OnnxPlanner(path, seed=seed)`` draws it. Other clients never touch a client's generator, so interleaving does not
change anyone's actions.
"""

from __future__ import annotations

import copy
import threading
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import torch
from torch import Tensor

from dmrl.policies import ChunkPolicy
from dmrl.policies.base import ActionQueue
from dmrl.policies.observations import FRAME_KEYS, TEXT_KEYS
from dmrl.serve.protocol import ProtocolError, decode_array

Planner = Callable[[Mapping[str, Tensor | list[str]]], Tensor]


def obs_spec(policy: ChunkPolicy) -> dict[str, dict[str, Any]]:
    """{key: {"dtype", "shape"}} of one unbatched step the policy reads: rgb uint8 (3V, H, W), depth float32
    (V, H, W), vectors float32 (dim,), instruction {"dtype": "str", "shape": []}."""
    spec: dict[str, dict[str, Any]] = {}
    for k in policy.chunk.obs_keys:
        if k in TEXT_KEYS:
            spec[k] = {"dtype": "str", "shape": []}
            continue
        dim = policy.obs_dims[k]
        shape = [int(d) for d in dim] if isinstance(dim, (tuple, list)) else [int(dim)]
        spec[k] = {"dtype": "uint8" if k == "rgb" else "float32", "shape": shape}
    return spec


class PolicyHost:
    """The loaded policy, what a client may send it, and the lock that serialises its forward passes.

    ``onnx``: an :class:`dmrl.export.OnnxPlanner` (its session is shared; each client gets a copy with its own
    noise generator) or None for torch's ``sample_chunk``.
    """

    def __init__(self, policy: ChunkPolicy, onnx: Any | None = None) -> None:
        if onnx is not None and not isinstance(getattr(onnx, "rng", None), np.random.Generator):
            raise TypeError("PolicyHost: the onnx planner has no numpy Generator `rng`; per-client noise needs one")
        self.policy = policy.eval()
        self.onnx = onnx
        self.spec = obs_spec(policy)
        self.lock = threading.Lock()
        self.device = next(policy.parameters()).device
        self.multimodal = policy.chunk.encoder_type == "multimodal"

    def info(self) -> dict[str, Any]:
        """The ``info`` reply's fields: what to send and what comes back."""
        c = self.policy.chunk
        return {
            "policy": self.policy.name,
            "obs_keys": list(c.obs_keys),
            "obs_spec": self.spec,
            "action_dim": self.policy.action_dim,
            "n_obs_steps": c.n_obs_steps,
            "horizon": c.horizon,
            "n_action_steps": c.n_action_steps,
            "planner": "onnxruntime" if self.onnx is not None else "torch",
            "can_drop": self.multimodal,
        }

    def torch_planner(self, generator: torch.Generator) -> Planner:
        """``predict_chunk`` with the chunk noise drawn from ``generator``."""
        p = self.policy

        @torch.inference_mode()
        def plan(obs: Mapping[str, Tensor | list[str]]) -> Tensor:
            chunk = p.sample_chunk(*p.condition(obs), generator=generator)
            return p.raw_actions(chunk)

        return plan


class Session:
    """One client: its action queue (To-frame history + Ta queued actions), noise, withheld keys and step count."""

    def __init__(self, host: PolicyHost, seed: int | None = None) -> None:
        self.host = host
        self.episodes = 0
        self.reset(seed)

    def reset(self, seed: int | None = None, drop: list[str] | None = None) -> int:
        """Start an episode: empty history and queue, noise from ``seed`` (None: a fresh random one); returns it."""
        if seed is not None and (not isinstance(seed, int) or isinstance(seed, bool) or not 0 <= seed < 2**63):
            raise ProtocolError(f"reset: seed must be an int in 0 .. 2**63 - 1, got {seed!r}")
        self.drop = self._checked_drop(drop or [])
        self.seed = int(np.random.SeedSequence().entropy % 2**63) if seed is None else seed  # type: ignore[operator]
        self.queue = ActionQueue()
        if self.host.onnx is not None:
            planner = copy.copy(self.host.onnx)  # shares the onnxruntime session, not the noise
            planner.rng = np.random.default_rng(self.seed)
            self.plan: Planner = planner
        else:
            self.plan = self.host.torch_planner(torch.Generator().manual_seed(self.seed))
        self.steps = 0
        self.episodes += 1
        return self.seed

    def _checked_drop(self, drop: object) -> tuple[str, ...]:
        keys = tuple(self.host.policy.chunk.obs_keys)
        if not isinstance(drop, list) or not all(isinstance(k, str) for k in drop):
            raise ProtocolError(f"reset: drop must be a list of key strings, got {drop!r}")
        if not drop:
            return ()
        unknown = [k for k in drop if k not in keys]
        if unknown:
            raise ProtocolError(f"reset: drop {unknown[0]!r} is not a key of the policy ({', '.join(keys)})")
        if not self.host.multimodal:
            raise ProtocolError("reset: drop needs a multimodal policy (a lowdim encoder cannot mask a key)")
        if set(drop) >= set(keys):
            raise ProtocolError(f"reset: dropping {', '.join(drop)} leaves the policy no observation")
        return tuple(dict.fromkeys(drop))

    def check_obs(self, obs: object) -> dict[str, np.ndarray | str]:
        """The ``obs`` field of an act request -> {key: array or str}, every key, dtype and shape checked."""
        spec = self.host.spec
        if not isinstance(obs, dict):
            raise ProtocolError(f"act: obs must be a map {{key: array | str}}, got {type(obs).__name__}")
        unknown = [k for k in obs if k not in spec]
        if unknown:
            raise ProtocolError(f"act: obs key {unknown[0]!r} is not read by the policy; its keys: {', '.join(spec)}")
        for k in spec:
            if k in self.drop and k in obs:
                raise ProtocolError(f"act: obs has {k!r}, which reset declared withheld (drop); leave it out")
            if k not in self.drop and k not in obs:
                how = " or withhold it with reset drop=[...]" if self.host.multimodal else ""
                raise ProtocolError(f"act: obs lacks {k!r} (the policy reads {', '.join(spec)}); send it{how}")
        out: dict[str, np.ndarray | str] = {}
        for k, v in obs.items():
            want = spec[k]
            if want["dtype"] == "str":
                if not isinstance(v, str):
                    raise ProtocolError(f"act: obs[{k!r}] must be a msgpack str, got {type(v).__name__}")
                out[k] = v
                continue
            a = decode_array(v, f"act: obs[{k!r}]")
            if a.dtype.name != want["dtype"] or list(a.shape) != want["shape"]:
                raise ProtocolError(
                    f"act: obs[{k!r}] is {a.dtype.name} {list(a.shape)}; the policy wants {want['dtype']} "
                    f"{want['shape']} (one unbatched step{', channels first' if k in FRAME_KEYS else ''})"
                )
            if a.dtype.kind == "f" and not np.isfinite(a).all():
                raise ProtocolError(f"act: obs[{k!r}] has NaN or inf values")
            out[k] = a
        return out

    def act(self, obs: dict[str, np.ndarray | str]) -> tuple[np.ndarray, bool]:
        """One checked step -> (action (Da,) float32, whether a new chunk was planned for it)."""
        planned = []

        def plan(o: Mapping[str, Tensor | list[str]]) -> Tensor:
            planned.append(True)
            return self.plan(o)

        p = self.host.policy
        # One forward at a time: the weights (and torch's thread pool) are shared. inference_mode as in policy.act.
        with self.host.lock, torch.inference_mode():
            action = self.queue.step(obs, p.chunk, p.action_dim, self.host.device, plan)
        self.steps += 1
        return action, bool(planned)
