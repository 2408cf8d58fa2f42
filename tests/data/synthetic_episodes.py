"""Synthetic episodes and stores for the data tests (tiny shapes: rgb (3,8,8) uint8, state (5,) float32)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from dmrl.data import EpisodeStore
from dmrl.types import Episode

OBS_MODES = ("rgb", "instruction", "state")
OBS_SPEC = {"rgb": ((3, 8, 8), "uint8"), "state": ((5,), "float32")}
DA = 3


def make_episode(seed: int, length: int | None = None) -> Episode:
    """Deterministic random episode from `seed` (so a test can regenerate what a child process wrote)."""
    rng = np.random.default_rng(seed)
    t = length if length is not None else 3 + seed % 5
    return Episode(
        obs={
            "rgb": rng.integers(0, 256, (t, 3, 8, 8), dtype=np.uint8),
            "state": rng.normal(size=(t, 5)).astype(np.float32),
        },
        final_obs={
            "rgb": rng.integers(0, 256, (3, 8, 8), dtype=np.uint8),
            "state": rng.normal(size=5).astype(np.float32),
        },
        actions=rng.uniform(-1, 1, (t, DA)).astype(np.float32),
        rewards=rng.normal(size=t).astype(np.float32),
        terminated=bool(seed % 2),
        truncated=not bool(seed % 2),
        instruction=f"go to the {'red' if seed % 3 else 'blü'} cube #{seed}",
        target=["red", "green", ""][seed % 3],
        route=[None, "left", "right"][seed % 3],
        success=seed % 4 != 0,
        seed=seed,
        info={"dist": float(seed) / 7, "steps": float(t)},
    )


def create_store(path: str | Path, **kw) -> EpisodeStore:
    kw = {"obs_spec": OBS_SPEC, **kw}
    return EpisodeStore.create(
        path, env_id="dmrl/Test-v0", obs_modes=OBS_MODES, action_meaning=["dx", "dy", "grip"], action_dim=DA, **kw
    )


def assert_episode_equal(a: Episode, b: Episode) -> None:
    assert sorted(a.obs) == sorted(b.obs) and sorted(a.final_obs) == sorted(b.final_obs)
    for k in a.obs:
        np.testing.assert_array_equal(a.obs[k], b.obs[k])
        assert a.obs[k].dtype == b.obs[k].dtype
        np.testing.assert_array_equal(a.final_obs[k], b.final_obs[k])
    np.testing.assert_array_equal(a.actions, b.actions)
    np.testing.assert_array_equal(a.rewards, b.rewards)
    for f in ("terminated", "truncated", "instruction", "target", "route", "success", "seed", "info"):
        assert getattr(a, f) == getattr(b, f), f
