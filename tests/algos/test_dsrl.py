"""DSRL (dmrl.algos.dsrl): the diffusion policy stays frozen, the actor's noises stay in bounds, the steered policy
plans f(s, pi(s)), and on a two-mode bandit steering the noise picks the rewarded mode of a BC policy that keeps both
(issue 27: the critic steers inside the data's support)."""

from __future__ import annotations

import pytest
import torch
from algo_helpers import CHUNK, DA, OBS_DIMS, batch, diffusion_actor, engine
from test_q_guidance import MODE, _bandit_batch

from dmrl.algos import DSRL, ChunkCritic, CriticConfig, DSRLConfig, SteeredPolicy
from dmrl.policies import DiffusionPolicyConfig, build_policy

SMALL = CriticConfig(n_critics=2, hidden=32, depth=2, encoder_per_member=True)


def _algo(actor=None, **kw) -> DSRL:
    actor = actor or diffusion_actor()
    config = DSRLConfig(critic=SMALL, actor_hidden=32, **kw)
    return DSRL(
        actor, ChunkCritic(actor, config.critic), ChunkCritic(actor, config.critic, action_rows=CHUNK.horizon),
        config, engine(),
    )  # fmt: skip


def test_policy_stays_frozen_noises_stay_in_bounds_and_steering_plans_from_the_actors_noise():
    algo = _algo(noise_bound=0.5)
    before = {k: v.clone() for k, v in algo.policy.state_dict().items()}
    for seed in range(3):
        logs = algo.update(batch(8, seed))
    assert {"critic_loss", "critic_noise_loss", "critic_noise_adv_spread", "actor_loss"} <= set(logs)
    assert logs["td_error"].shape == (8,)
    assert all(torch.equal(before[k], v) for k, v in algo.policy.state_dict().items())  # never trained
    obs = batch(6, 9)["obs"]
    with torch.no_grad():
        w = algo.noise_actor(obs)
        assert w.shape == (6, CHUNK.horizon, DA) and w.abs().max() <= 0.5
        assert w.abs().max() > 0  # the actor moved off its zero start
        steered = algo.evaluation_policy()
        assert isinstance(steered, SteeredPolicy)
        want = algo.policy.raw_actions(algo.policy.sample_chunk(*algo.policy.condition(obs), init_noise=w))
        torch.testing.assert_close(steered.predict_chunk(obs), want)  # evaluation: deterministic
        exploring = algo.collection_policy()  # collectors: the actor's noise plus N(0, explore_std^2)
        assert isinstance(exploring, SteeredPolicy) and exploring.explore_std == 1.0
        torch.manual_seed(0)
        got = exploring.predict_chunk(obs)
        torch.manual_seed(0)
        w_explore = w + torch.randn_like(w)
        want = algo.policy.raw_actions(algo.policy.sample_chunk(*algo.policy.condition(obs), init_noise=w_explore))
        torch.testing.assert_close(got, want)


def test_needs_the_deterministic_ddim_map_and_good_settings():
    with pytest.raises(ValueError, match="ddim-eta 0"):
        _algo(diffusion_actor(eta=1.0))
    with pytest.raises(ValueError, match="noise_bound > 0"):
        DSRLConfig(noise_bound=0)


def test_steering_the_noise_picks_the_rewarded_mode_of_a_bc_policy_that_keeps_both():
    torch.manual_seed(1)
    cfg = DiffusionPolicyConfig(denoiser_kwargs={"hidden_dim": 64, "n_blocks": 1}, num_train_steps=20,
                                num_inference_steps=4, prediction_type="sample")  # fmt: skip
    actor = build_policy("diffusion", CHUNK, cfg, OBS_DIMS, DA)
    g = torch.Generator().manual_seed(2)
    opt = torch.optim.Adam(actor.parameters(), lr=3e-3)
    for _ in range(300):  # behaviour cloning of both modes
        loss = actor.loss(_bandit_batch(64, g))["loss"]
        opt.zero_grad()
        loss.backward()
        opt.step()
    algo = _algo(actor, actor_lr=3e-3, critic_lr=3e-3)
    for _ in range(300):
        algo.update(_bandit_batch(64, g))
    obs = {"state": torch.zeros(256, CHUNK.n_obs_steps, 5)}
    with torch.no_grad():
        bc = algo.critic.executed(actor.predict_chunk(obs)).mean(dim=(1, 2))
        chosen = algo.critic.executed(algo.evaluation_policy().predict_chunk(obs)).mean(dim=(1, 2))
    bc_plus, plus = (bc > 0).float().mean().item(), (chosen > 0).float().mean().item()
    assert 0.1 < bc_plus < 0.9, f"the BC policy should keep both modes; + share {bc_plus:.2f}"
    assert plus > 0.95, f"steering should pick the rewarded mode; + share {plus:.2f} (BC {bc_plus:.2f})"
    assert (chosen.abs() < MODE / 2).float().mean().item() < 0.05  # the steered chunk stays on a mode
