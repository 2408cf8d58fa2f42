"""The scripted experts solve both tasks, pick routes 50/50, and their mode average fails (the point)."""

from __future__ import annotations

import numpy as np
import pytest

from dmrl.envs import make_env
from dmrl.envs.collect import record_episode
from dmrl.envs.experts import ExpertConfig, ScriptedExpert, mean_plan_episode

TASKS = ["dmrl/MultiPathGrasp-v0", "dmrl/MultiPathReach-v0"]


@pytest.mark.parametrize("env_id", TASKS)
def test_expert_success_and_route_share_over_100_seeds(env_id):
    env = make_env(env_id, obs_modes=("state",))
    expert = ScriptedExpert(env)
    eps = [record_episode(env, expert, seed) for seed in range(100)]
    success = np.mean([e.success for e in eps])
    left = np.mean([e.route == "left" for e in eps])
    assert success >= 0.95, f"expert success {success:.2f} < 0.95"
    assert 0.40 <= left <= 0.60, f"left-route share {left:.2f} outside 40-60%"
    assert all(e.route is not None for e in eps if e.success)
    assert max(e.length for e in eps) < 120


@pytest.mark.parametrize("env_id", TASKS)
def test_average_of_left_and_right_plans_fails(env_id):
    """Open-loop execution of the step-wise mean of a left and a right plan must fail in >= 90% of seeds."""
    env = make_env(env_id, obs_modes=("state",))
    n, fails = 30, 0
    for seed in range(n):
        info, plan_infos = mean_plan_episode(env, seed)
        assert [i["route"] for i in plan_infos] == ["left", "right"] and all(i["is_success"] for i in plan_infos)
        fails += not info["is_success"]
    assert fails / n >= 0.9, f"mode-averaged plan succeeded in {n - fails}/{n} seeds"


def test_noisy_and_suboptimal_experts_are_worse_but_valid():
    env = make_env("dmrl/MultiPathGrasp-v0", obs_modes=("state",))
    sub = ScriptedExpert(env, ExpertConfig(suboptimal=True, noise_std=0.1, fail_prob=0.5))
    eps = [record_episode(env, sub, seed) for seed in range(30)]
    success = np.mean([e.success for e in eps])
    assert 0.2 <= success <= 0.9, f"suboptimal expert success {success:.2f} should be mixed"
    clean = [record_episode(env, ScriptedExpert(env), seed) for seed in range(30)]
    assert np.mean([e.length for e in eps]) > np.mean([e.length for e in clean])
    for e in eps:
        assert np.all(np.abs(e.actions) <= 1.0)


def test_expert_config_validation():
    with pytest.raises(ValueError, match="route"):
        ExpertConfig(route="up")


def test_info_reports_the_held_cup_in_grasp_only():
    """info["held"]: the named cup while the expert carries it, None before the grasp and after the release."""
    env = make_env("dmrl/MultiPathGrasp-v0", obs_modes=("state",))
    expert = ScriptedExpert(env)
    _, info = env.reset(seed=3)
    expert.reset()
    held, done = [info["held"]], False
    while not done:
        *_, term, trunc, info = env.step(expert.act())
        held.append(info["held"])
        done = term or trunc
    assert info["is_success"] and held[0] is None and held[-1] is None
    carried = [h for h in held if h is not None]
    assert carried and set(carried) == {info["target"]}
    first = held.index(info["target"])  # one grasp: held is a single contiguous run
    assert all(h == info["target"] for h in held[first : first + len(carried)])
    reach = make_env("dmrl/MultiPathReach-v0", obs_modes=("state",))
    assert "held" not in reach.reset(seed=3)[1]
