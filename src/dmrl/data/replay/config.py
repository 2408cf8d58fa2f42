"""The replay ring's configuration and spec, and the handle another process attaches a shared ring with."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

Spec = dict[str, tuple[tuple[int, ...], np.dtype]]


@dataclass
class ReplayConfig:
    """Replay buffer size and prioritized-replay hyper-parameters."""

    capacity: int = 1_000_000
    """Items kept; the oldest are overwritten first."""
    prioritized: bool = True
    """Prioritized replay by |TD| (False: uniform)."""
    alpha: float = 0.6
    """Priority exponent (0: uniform, 1: proportional)."""
    beta0: float = 0.4
    """Importance-weight exponent at first, annealed to 1."""
    beta_steps: int = 100_000
    """Sampling calls over which beta goes from beta0 to 1."""
    eps: float = 1e-6
    """Added to |TD| so no priority is zero."""

    def __post_init__(self) -> None:
        if isinstance(self.capacity, bool) or not isinstance(self.capacity, int) or self.capacity < 1:
            raise ValueError(f"ReplayConfig.capacity: got {self.capacity!r}; must be an int >= 1")
        if not self.alpha >= 0:
            raise ValueError(f"ReplayConfig.alpha: got {self.alpha}; must be >= 0 (0 = uniform)")
        if not 0 <= self.beta0 <= 1:
            raise ValueError(f"ReplayConfig.beta0: got {self.beta0}; must be in [0, 1]")
        if isinstance(self.beta_steps, bool) or not isinstance(self.beta_steps, int) or self.beta_steps < 1:
            raise ValueError(f"ReplayConfig.beta_steps: got {self.beta_steps!r}; must be an int >= 1")
        if not self.eps > 0:
            raise ValueError(f"ReplayConfig.eps: got {self.eps}; must be > 0")


@dataclass(frozen=True)
class ReplayHandle:
    """What another process needs to `ReplayBuffer.attach`: pass it as a Process argument (with the default
    ProcessLock it pickles anywhere, through a queue too)."""

    spec: dict[str, tuple[tuple[int, ...], str]]  # key -> (per-item shape, dtype string)
    config: ReplayConfig
    blocks: dict[str, str]  # key (and the counter) -> shared memory block name
    lock: Any  # a ProcessLock (or any picklable lock the owner was given)


def check_spec(spec: dict[str, tuple[tuple[int, ...], Any]]) -> Spec:
    """A replay spec with its shapes as int tuples and its dtypes as numpy dtypes (ValueError when malformed)."""
    if not spec:
        raise ValueError("ReplayBuffer spec: got no keys; give e.g. {'obs': ((2, 31), np.float32), ...}")
    out: Spec = {}
    for key, entry in spec.items():
        if not isinstance(key, str) or not key or key.startswith("__"):
            raise ValueError(f"ReplayBuffer spec key: got {key!r}; must be a non-empty str not starting with '__'")
        try:
            shape, dtype = entry
            shape = tuple(int(d) for d in shape)
            dtype = np.dtype(dtype)
        except (TypeError, ValueError):
            raise ValueError(f"ReplayBuffer spec[{key!r}]: got {entry!r}; must be (shape tuple, numpy dtype)") from None
        if any(d < 0 for d in shape) or dtype.hasobject:
            raise ValueError(f"ReplayBuffer spec[{key!r}]: got {shape} {dtype}; need dims >= 0 and a non-object dtype")
        out[key] = (shape, dtype)
    return out
