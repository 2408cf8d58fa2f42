"""Evaluation statistics: Wilson intervals against known values, smoothness measures."""

from __future__ import annotations

import numpy as np
import pytest

from dmrl.train.metrics import smoothness, wilson_interval


def test_wilson_known_values_and_symmetry():
    lo, hi = wilson_interval(0, 10)
    assert lo == 0.0 and hi == pytest.approx(0.2775, abs=1e-4)  # textbook value for 0/10 at 95%
    lo, hi = wilson_interval(87, 100)
    assert lo == pytest.approx(0.7907, abs=1e-3) and hi == pytest.approx(0.9224, abs=1e-3)
    a, b = wilson_interval(30, 100)
    c, d = wilson_interval(70, 100)
    assert a == pytest.approx(1 - d) and b == pytest.approx(1 - c)
    assert wilson_interval(0, 0) == (0.0, 1.0)


def test_smoothness_of_constant_ramp_and_jumpy_actions():
    const = np.ones((20, 6))
    assert smoothness(const) == (0.0, 0.0)
    ramp = np.linspace(0, 1, 20)[:, None].repeat(6, 1)
    jerk, jump = smoothness(ramp)
    assert jerk == pytest.approx(0.0, abs=1e-12) and jump == pytest.approx(1 / 19)
    jumpy = np.tile([[1.0] * 6, [-1.0] * 6], (10, 1))
    jerk, jump = smoothness(jumpy)
    assert jump == 2.0 and jerk == pytest.approx(6 * 16.0)


def test_summarize_splits_first_grasps_into_named_wrong_and_none():
    import numpy as np

    from dmrl.train.evaluate import EpisodeRecord, summarize

    def rec(seed, target, first, step, success=False):
        return EpisodeRecord(seed, success, not success, "left", 40, 0.0, 0.0, np.zeros((1, 3)), target, first, step)

    records = [
        rec(0, "red", "red", 10, success=True),
        rec(1, "red", "blue", 14),
        rec(2, "blue", None, None),
        rec(3, "green", "green", 20),
    ]
    r = summarize(records)
    assert (r.grasp_target, r.grasp_wrong, r.grasp_none) == (0.5, 0.25, 0.25)
    assert r.grasp_step == (10 + 14 + 20) / 3
    reach = summarize([rec(0, None, None, None)])  # a task without grasps reports nan, not "never grasped"
    assert np.isnan(reach.grasp_target) and np.isnan(reach.grasp_none) and np.isnan(reach.grasp_step)
