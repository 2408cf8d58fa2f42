"""Evaluation statistics: Wilson score intervals for success rates, action smoothness, latency summaries."""

from __future__ import annotations

import math

import numpy as np


def wilson_interval(successes: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """95% (z = 1.96) Wilson score interval of a binomial proportion; (0, 1) when n = 0."""
    if n == 0:
        return 0.0, 1.0
    p = successes / n
    denom = 1.0 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return max(0.0, centre - half), min(1.0, centre + half)


def smoothness(actions: np.ndarray) -> tuple[float, float]:
    """(mean squared jerk, largest step-to-step change) of executed actions (T, Da).

    Actions command tip velocities, so their second difference is proportional to jerk; the largest
    first difference (max over steps of the L-inf change) catches single jumps a mean would hide.
    """
    a = np.asarray(actions, dtype=np.float64)
    jerk = float((np.diff(a, n=2, axis=0) ** 2).sum(-1).mean()) if len(a) >= 3 else 0.0
    jump = float(np.abs(np.diff(a, axis=0)).max()) if len(a) >= 2 else 0.0
    return jerk, jump
