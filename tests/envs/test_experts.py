"""The scripted experts solve both tasks, pick routes 50/50, and their mode average fails (the point)."""

from __future__ import annotations

import numpy as np
import pytest

from dmrl.data.collect import record_episode
from dmrl.envs import make_env
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


def test_a_deliberate_miss_is_noticed_on_the_way_up_and_retried():
    """miss_prob 1: the first suction-on descent grabs nothing; the expert notices at some height on the way up,
    switches suction off, grasps the named cup and finishes; recovered_at marks the first recovery step."""
    env = make_env("dmrl/MultiPathGrasp-v0", obs_modes=("state",))
    heights = []
    for seed in range(20):
        expert = ScriptedExpert(env, ExpertConfig(miss_prob=1.0))
        env.reset(seed=seed)
        expert.rng = np.random.default_rng((seed, 0xE))
        expert.reset()
        acts, held, tips, done = [], [], [], False
        while not done:
            tips.append(env.task_state().tip[2])
            acts.append(expert.act())
            *_, term, trunc, info = env.step(acts[-1])
            held.append(env.task_state().attached)
            done = term or trunc
        acts, held, t = np.array(acts), np.array(held), expert.recovered_at
        assert info["is_success"] and t is not None
        heights.append(tips[t])  # where the recovery starts from
        assert (acts[:t, 5] > 0).any() and (held[:t] < 0).all(), "suction went on before the recovery, grabbed nothing"
        assert acts[t, 5] < 0, "the recovery starts by switching suction off"
        assert set(held[held >= 0].tolist()) == {env.target}, "a miss never grabs another cup"
    assert np.ptp(heights) > 0.05, "the miss is noticed at different heights"


def test_recovery_episodes_keep_only_the_steps_after_the_miss():
    env = make_env("dmrl/MultiPathGrasp-v0", obs_modes=("state", "joints"))
    clean = record_episode(env, ScriptedExpert(env), 4)
    assert "first_step" not in clean.info
    full = ScriptedExpert(env, ExpertConfig(miss_prob=1.0))
    ep = record_episode(env, full, 4)
    first = int(ep.info["first_step"])
    assert first == full.recovered_at > 0 and ep.success
    # Replay the whole rollout: the stored episode is its tail from the first recovery step.
    env.reset(seed=4)
    full.rng = np.random.default_rng((4, 0xE))
    full.reset()
    states = []
    for _ in range(first + ep.length):
        states.append(env._get_obs()["state"])
        env.step(full.act())
    np.testing.assert_array_equal(np.array(states[first:]), ep.obs["state"])
    assert ep.obs["joints"][0, -1] == 1.0 and ep.actions[0, 5] < 0, "starts with suction on, first action: off"


def test_miss_prob_is_checked():
    with pytest.raises(ValueError, match="miss_prob"):
        ExpertConfig(miss_prob=1.5)
    with pytest.raises(ValueError, match="suboptimal"):
        ExpertConfig(miss_prob=0.5, suboptimal=True)
