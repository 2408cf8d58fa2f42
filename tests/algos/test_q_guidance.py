"""Tiny learning test: on a one-step bandit whose data holds two equally common action modes, behaviour cloning
keeps both, while Diffusion-QL's Q term moves the diffusion actor onto the mode the reward prefers, without
producing the in-between actions a mean-seeking actor would (issue 5, section 5)."""

from __future__ import annotations

import torch
from algo_helpers import CHUNK, DA, OBS_DIMS, engine, tiny_critic

from dmrl.algos import DiffusionQL, DiffusionQLConfig
from dmrl.policies import DiffusionPolicyConfig, build_policy

MODE = 0.6  # the two modes: every action of the chunk at +0.6 (reward 1) or at -0.6 (reward 0)


def _bandit_batch(b: int, g: torch.Generator) -> dict:
    """One-step episodes: constant observation, a chunk from either mode, reward 1 iff the + mode, then done."""
    sign = torch.where(torch.rand(b, generator=g) < 0.5, 1.0, -1.0)  # (B,)
    action = (MODE * sign)[:, None, None] + 0.05 * torch.randn(b, CHUNK.horizon, DA, generator=g)
    ta = CHUNK.n_action_steps
    reward = torch.zeros(b, ta)
    reward[:, 0] = (sign > 0).float()
    done = torch.zeros(b, ta, dtype=torch.bool)
    done[:, 0] = True
    obs = {"state": torch.zeros(b, CHUNK.n_obs_steps, 5)}
    return {
        "obs": obs,
        "next_obs": obs,
        "action": action.clamp(-1, 1),
        "action_mask": torch.ones(b, CHUNK.horizon, dtype=torch.bool),
        "reward": reward,
        "done": done,
        "valid": torch.ones(b, ta, dtype=torch.bool),
        "next_valid": torch.zeros(b, dtype=torch.bool),
    }


def _train_and_sample(eta: float, seed: int = 1, updates: int = 300, n: int = 256, **algo_kw) -> torch.Tensor:
    """Mean executed action (n,) of chunks the trained actor samples for the bandit's observation."""
    torch.manual_seed(seed)
    # x0 prediction: at this tiny budget it separates the modes cleanly (epsilon leaves samples in between).
    cfg = DiffusionPolicyConfig(
        denoiser_kwargs={"hidden_dim": 64, "n_blocks": 1}, num_train_steps=20, num_inference_steps=4,
        prediction_type="sample",
    )  # fmt: skip
    actor = build_policy("diffusion", CHUNK, cfg, OBS_DIMS, DA)
    cfg = DiffusionQLConfig(eta=eta, actor_lr=3e-3, critic_lr=3e-3, actor_tau=1.0, **algo_kw)  # exports the actor
    algo = DiffusionQL(actor, tiny_critic(actor), cfg, engine())
    g = torch.Generator().manual_seed(seed + 1)
    for _ in range(updates):
        algo.update(_bandit_batch(64, g))
    with torch.no_grad():
        chunk = algo.actor.predict_chunk({"state": torch.zeros(n, CHUNK.n_obs_steps, 5)})  # (n, Tp, Da) raw
    return algo.critic.executed(chunk).mean(dim=(1, 2))


def test_q_term_moves_the_diffusion_actor_to_the_rewarded_mode():
    bc = _train_and_sample(eta=0.0)
    ql = _train_and_sample(eta=1.0)
    bc_plus, ql_plus = (bc > 0).float().mean().item(), (ql > 0).float().mean().item()
    assert 0.1 < bc_plus < 0.9, f"BC should keep both modes (>= 10% each); + mode share {bc_plus:.2f}"
    assert ql_plus > 0.9, f"the Q term should select the rewarded mode; + mode share {ql_plus:.2f} (BC {bc_plus:.2f})"
    # Both actors stay on the modes: the in-between region (|a| < MODE / 2) stays empty.
    for name, a in (("bc", bc), ("diffusion-ql", ql)):
        between = (a.abs() < MODE / 2).float().mean().item()
        assert between < 0.08, f"{name}: {between:.0%} of sampled chunks fall between the modes"


def test_advantage_weighted_bc_moves_the_actor_to_the_rewarded_mode_without_q_gradients():
    # eta 0: no gradient of Q reaches the actor; the BC term alone, weighted by exp(A / (beta mean|A|)).
    # At beta 0.5 the + mode's weight is e^4 times the - mode's once the critic has learnt (A = +-0.5).
    awbc = _train_and_sample(eta=0.0, bc_weighting="advantage", bc_weight_beta=0.5)
    share = (awbc > 0).float().mean().item()
    assert share > 0.9, f"advantage-weighted BC should favour the rewarded mode; + mode share {share:.2f}"
    between = (awbc.abs() < MODE / 2).float().mean().item()
    assert between < 0.08, f"{between:.0%} of sampled chunks fall between the modes"
