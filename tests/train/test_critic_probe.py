"""The critic probe (dmrl.train.critic_probe): Monte-Carlo returns against a hand-counted rollout, candidates that
collide where they should, and metrics on hand-made scores (issue 27 §2, §5)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from dmrl.algos import ChunkCritic, CriticConfig
from dmrl.envs import make_env
from dmrl.envs.experts import ScriptedExpert
from dmrl.models.proprio import LowDimEncoderConfig
from dmrl.policies import ChunkConfig, DiffusionPolicyConfig, build_policy
from dmrl.train.critic_probe import (
    BranchState,
    Candidate,
    candidate_chunks,
    collect_states,
    mc_return,
    probe_metrics,
    score,
    spearman,
)

GAMMA = 0.99


def _env(reward="sparse"):
    return make_env("dmrl/MultiPathGrasp-v0", obs_modes=("state",), reward=reward).unwrapped


def _expert_episode_length(seed: int) -> tuple[int, bool]:
    env = _env()
    env.reset(seed=seed)
    expert = ScriptedExpert(env)
    expert.reset(seed)
    for t in range(env.cfg.max_steps):
        *_, terminated, truncated, info = env.step(expert.act())
        if terminated or truncated:
            return t + 1, bool(info["is_success"])
    raise AssertionError("episode did not end")


def test_mc_return_matches_the_hand_counted_sparse_return_and_leaves_the_env_alone():
    seed = 3
    length, success = _expert_episode_length(seed)
    assert success
    env = _env()
    env.reset(seed=seed)
    expert = ScriptedExpert(env)
    expert.reset(seed)
    for _ in range(10):  # branch 10 steps in: the expert's first 10 steps are behind us
        env.step(expert.act())
    tip = env.task_state().tip.copy()
    ret, collided = mc_return(env, expert, np.zeros((0, 6), np.float32), GAMMA)  # no chunk: the expert from step 10
    # Sparse reward: 1 at the success step (the episode's last, index length - 1), discounted from step 10.
    assert ret == pytest.approx(GAMMA ** (length - 1 - 10), rel=1e-9) and not collided
    np.testing.assert_array_equal(env.task_state().tip, tip)  # the original env did not move


def test_the_straight_chunk_collides_while_carrying_and_the_expert_chunk_does_not():
    env = _env("shaped")
    env.reset(seed=0)
    expert = ScriptedExpert(env)
    expert.reset(0)
    checked = 0
    for _ in range(env.cfg.max_steps):
        s = env.task_state()
        if s.attached >= 0 and abs(s.tip[0]) < 0.05 and s.tip[1] < s.obstacle_y - 0.1 and s.tip[2] > 0.15:
            cands = {c.kind: c for c in candidate_chunks(env, expert, 8)}
            exp_ret, exp_col = mc_return(env, expert, cands["expert"].actions, GAMMA)
            straight_ret, straight_col = mc_return(env, expert, np.repeat(cands["straight"].actions, 3, 0), GAMMA)
            assert not exp_col and straight_col, "24 straight steps at the pad should hit the obstacle"
            assert exp_ret > straight_ret
            checked += 1
            break
        *_, terminated, truncated, _ = env.step(expert.act())
        assert not (terminated or truncated)
    assert checked == 1


def test_take_over_finishes_a_carry_the_expert_did_not_start():
    env = _env()
    env.reset(seed=5)
    expert = ScriptedExpert(env)
    expert.reset(5)
    while env.task_state().attached < 0 or env.task_state().tip[2] < 0.2:  # until the cup is carried
        env.step(expert.act())
    other = ScriptedExpert(env)
    other.take_over()
    for _ in range(env.cfg.max_steps):
        *_, terminated, truncated, info = env.step(other.act())
        if terminated or truncated:
            break
    assert info["is_success"] and not info["collision"]


def test_metrics_on_hand_made_scores():
    def state(qs, rets, collided):
        kinds = ["expert"] + ["policy"] * (len(qs) - 1)
        cands = [Candidate(k, np.zeros((1, 6)), r, c, q) for k, q, r, c in zip(kinds, qs, rets, collided, strict=True)]
        return BranchState("expert", {}, False, cands)

    good = state([3.0, 1.0, 2.0], [3.0, 1.0, 2.0], [False, True, False])  # ranked right, rho 1
    bad = state([0.5, 1.0, 0.0], [3.0, -2.0, 0.0], [False, True, False])  # a collision above the expert
    m = probe_metrics([good, bad])
    assert m["ranking_accuracy"] == 0.5 and m["ranked_states"] == 2
    assert m["spearman"] == pytest.approx((1.0 + spearman(np.array([0.5, 1.0, 0.0]), np.array([3.0, -2.0, 0.0]))) / 2)
    assert m["calibration_mae"] == pytest.approx((0 + 0 + 0 + 2.5 + 3.0 + 0.0) / 6)
    # best-of-N's choice among policy samples: right in `good` (the safe 2.0 beats the colliding 1.0), wrong in `bad`
    assert m["choice_states"] == 2 and m["in_support_accuracy"] == 0.5 and m["random_pick_accuracy"] == 0.5
    assert spearman(np.array([1, 2, 3]), np.array([10, 20, 30])) == pytest.approx(1.0)
    assert spearman(np.array([1, 2, 3]), np.array([3, 2, 1])) == pytest.approx(-1.0)


def test_collect_and_score_end_to_end_on_a_tiny_policy():
    chunk = ChunkConfig(n_obs_steps=2, horizon=8, n_action_steps=4, encoder=LowDimEncoderConfig(width=16, depth=1))
    env = _env("shaped")
    dim = env.observation_space["state"].shape[0]
    cfg = DiffusionPolicyConfig(denoiser_kwargs={"hidden_dim": 16, "n_blocks": 1}, num_train_steps=10,
                                num_inference_steps=2)  # fmt: skip
    policy = build_policy("diffusion", chunk, cfg, {"state": dim}, 6)
    critic = ChunkCritic(policy, CriticConfig(n_critics=2, hidden=16, depth=1))
    torch.manual_seed(0)
    states = collect_states(lambda: _env("shaped"), policy, 4, 300_000, GAMMA, every=4, policy_samples=2)
    assert len(states) == 4 and all(len(s.candidates) == 6 for s in states)
    assert {s.obs["state"].shape for s in states} == {(2, dim)}
    for s in states:
        score(critic, s)
    m = probe_metrics(states)
    assert m["states"] == 4 and m["candidates"] == 24 and np.isfinite(m["calibration_mae"])
