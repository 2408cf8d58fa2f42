"""Helpers of the policy server tests: observation sequences and the direct ``policy.act`` reference."""

from __future__ import annotations

import time

import numpy as np
import torch

STATE_DIM, ACTION_DIM = 7, 3


def state_obs(seed: int, n: int) -> list[dict[str, np.ndarray]]:
    """n env steps of a random state trajectory (float32 (STATE_DIM,))."""
    rng = np.random.default_rng(seed)
    return [{"state": rng.normal(size=STATE_DIM).astype(np.float32)} for _ in range(n)]


def direct_actions(policy, episodes: list[tuple[int, list[dict]]]) -> list[np.ndarray]:
    """What ``policy.act`` gives for each (seed, observations) episode: the server's seeding contract."""
    out = []
    for seed, steps in episodes:
        torch.manual_seed(seed)
        policy.reset()
        out.append(np.stack([policy.act(o) for o in steps]))
    return out


def wait_sessions(server, n: int) -> None:
    """Wait (up to 5 s) until the server holds ``n`` sessions: a closed client's handler ends just after it."""
    deadline = time.monotonic() + 5
    while len(server.sessions) != n and time.monotonic() < deadline:
        time.sleep(0.01)
    assert len(server.sessions) == n
