"""A synthetic episode store for training tests: no simulator needed (state (5,), 3-D actions)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from dmrl.data import EpisodeStore
from dmrl.types import Episode


def state_store(path: Path, episodes: int = 8, rewards: bool = False, steps: int = 40) -> Path:
    """``episodes`` episodes of ``steps`` steps from seeds 0, 1, ...; with ``rewards`` random rewards and odd seeds
    terminating (successes), else zero rewards and every episode terminating. The store is closed (no writer lock)."""
    st = EpisodeStore.create(
        path,
        env_id="dmrl/MultiPathGrasp-v0",
        obs_modes=("state",),
        action_meaning=["a", "b", "c"],
        obs_spec={"state": ((5,), "float32")},
        action_dim=3,
    )
    for seed in range(episodes):
        rng = np.random.default_rng(seed)
        odd = bool(seed % 2)
        st.append(
            Episode(
                obs={"state": rng.normal(size=(steps, 5)).astype(np.float32)},
                final_obs={"state": rng.normal(size=5).astype(np.float32)},
                actions=rng.uniform(-1, 1, (steps, 3)).astype(np.float32),
                rewards=rng.normal(size=steps).astype(np.float32) if rewards else np.zeros(steps, np.float32),
                terminated=odd if rewards else True,
                truncated=not odd if rewards else False,
                instruction="",
                target="",
                route=None,
                success=odd if rewards else True,
                seed=seed,
            )
        )
    st.close()
    return path
