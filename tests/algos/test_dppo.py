"""DPPO (dmrl.algos.dppo): GAE by hand, each denoising step is the stochastic DDIM sampler's step with an exact
Gaussian likelihood, evaluation runs the chain's means, and on a two-mode bandit PPO over the chain moves a BC policy
that keeps both modes onto the rewarded one (issue 27: the critic's advantages steer the actor)."""

from __future__ import annotations

import pytest
import torch
from algo_helpers import CHUNK, DA, OBS_DIMS, diffusion_actor, engine
from test_q_guidance import MODE, _bandit_batch

from dmrl.algos import DPPO, ChunkCritic, CriticConfig, DPPOConfig
from dmrl.algos.dppo import gae
from dmrl.policies import DiffusionPolicyConfig, build_policy
from dmrl.policies.checkpoint import load_policy, save_policy

SMALL_V = CriticConfig(n_critics=1, hidden=32, depth=2)


def _algo(actor=None, **kw) -> DPPO:
    actor = actor or diffusion_actor()
    config = DPPOConfig(critic=SMALL_V, **kw)
    return DPPO(actor, ChunkCritic(actor, config.critic, with_actions=False), config, engine())


def test_gae_by_hand():
    # T 3, one env; the episode ends after decision 1 (no bootstrap across it).
    reward, value = torch.tensor([[1.0], [0.0], [2.0]]), torch.tensor([[0.5], [0.2], [0.1]])
    done = torch.tensor([[False], [True], [False]])
    adv = gae(reward, value, done, torch.tensor([0.3]), gamma=0.9, lam=0.5)
    # t2: 2 + .9·.3 - .1 = 2.17; t1: 0 - .2 = -.2 (done); t0: 1 + .9·.2 - .5 + .9·.5·(-.2) = .59
    torch.testing.assert_close(adv, torch.tensor([[0.59], [-0.2], [2.17]]))
    # lambda 1 and V = 0: the discounted return of each episode's rest.
    mc = gae(reward, torch.zeros_like(value), done, torch.tensor([0.0]), gamma=0.9, lam=1.0)
    torch.testing.assert_close(mc, torch.tensor([[1.0], [0.0], [2.0]]))


def test_each_denoising_step_is_the_stochastic_ddim_step_with_its_gaussian_likelihood():
    algo = _algo(diffusion_actor(steps=4), min_std=0.1)
    obs = {"state": torch.randn(5, 2, 5)}
    cond, _ = algo.actor.condition(obs)
    chain = algo.chain
    assert chain.eta == 1.0 and torch.equal(algo.std, chain.sigma.clamp(min=0.1))
    assert algo.std[-1] == 0.1  # the last DDIM step has no noise of its own: min_std explores there
    x = torch.randn(5, CHUNK.horizon, DA)
    for i in range(chain.num_steps):
        idx = torch.full((5,), i)
        z = torch.randn_like(x)
        with torch.no_grad():
            mean = algo.step_mean(x, idx, cond)
            out = algo.actor.denoise_fn(cond)(x, chain.timesteps[idx])
            if chain.sigma[i] >= 0.1:  # where the std is not clipped the step is the sampler's own
                torch.testing.assert_close(mean + chain.sigma[i] * z, chain.step(i, out, x, noise=z))
            x_next = mean + algo.std[i] * z
            rows = slice(CHUNK.n_obs_steps - 1, CHUNK.n_obs_steps - 1 + CHUNK.n_action_steps)
            want = torch.distributions.Normal(mean, algo.std[i]).log_prob(x_next)[:, rows].clamp(-5, 2).mean((1, 2))
            torch.testing.assert_close(algo.log_prob(mean, x_next, idx), want)
        x = x_next
    torch.manual_seed(0)
    explored = algo.explore(obs)
    assert explored["chain"].shape == (5, 5, CHUNK.horizon, DA) and explored["log_prob"].shape == (5, 4)
    assert explored["value"].shape == (5,)


def test_the_actor_and_its_checkpoint_act_with_the_chain_of_means(tmp_path):
    algo = _algo()
    assert algo.evaluation_policy() is algo.actor and not algo.actor.sampler.stochastic
    save_policy(tmp_path / "ckpt", algo.policy)
    loaded, _ = load_policy(tmp_path / "ckpt")
    assert (loaded.config.ddim_eta, loaded.config.ddim_noise_scale) == (1.0, 0.0)
    obs = {"state": torch.randn(3, 2, 5)}
    for policy in (algo.actor, loaded):
        torch.manual_seed(1)
        got = policy.predict_chunk(obs)
        torch.manual_seed(1)
        cond, _ = algo.actor.condition(obs)
        x = torch.randn(3, CHUNK.horizon, DA)
        with torch.no_grad():
            for i in range(algo.chain.num_steps):
                x = algo.step_mean(x, torch.full((3,), i), cond)
        torch.testing.assert_close(got, algo.actor.raw_actions(x))


def test_ppo_over_the_chain_moves_a_two_mode_bc_policy_to_the_rewarded_mode():
    torch.manual_seed(0)
    cfg = DiffusionPolicyConfig(
        denoiser_kwargs={"hidden_dim": 64, "n_blocks": 1}, num_train_steps=20, num_inference_steps=4,
        prediction_type="sample",
    )  # fmt: skip
    actor = build_policy("diffusion", CHUNK, cfg, OBS_DIMS, DA)
    opt = torch.optim.Adam(actor.parameters(), lr=3e-3)
    g = torch.Generator().manual_seed(1)
    for _ in range(300):  # behaviour cloning on both modes
        loss = actor.loss(_bandit_batch(64, g))["loss"]
        opt.zero_grad()
        loss.backward()
        opt.step()
    algo = _algo(actor, actor_lr=1e-3, critic_lr=1e-2, clip_ratio=0.2, epochs=4, minibatch=128, critic_warmup=1)
    obs = {"state": torch.zeros(64, CHUNK.n_obs_steps, 5)}

    def plus_share() -> float:
        chain = algo.explore(obs)["chain"][:, -1]
        return (algo.actor.raw_actions(chain)[:, 1:5].mean((1, 2)) > 0).float().mean().item()

    before = plus_share()
    assert 0.1 < before < 0.9, f"BC should keep both modes; + mode share {before:.2f}"
    for _ in range(25):  # one-decision episodes: reward 1 for the + mode
        out = algo.explore(obs)
        executed = algo.actor.raw_actions(out["chain"][:, -1])[:, 1:5].mean((1, 2))
        rollout = {
            "obs": {"state": obs["state"][None]}, **{k: v[None] for k, v in out.items()},
            "reward": (executed > 0).float()[None], "done": torch.ones(1, 64, dtype=torch.bool),
            "next_value": torch.zeros(64),
        }  # fmt: skip
        logs = algo.update(rollout)
    after = plus_share()
    assert after > 0.9, (
        f"PPO over the chain should select the rewarded mode; + mode share {after:.2f} (BC {before:.2f})"
    )
    assert {"policy_loss", "approx_kl", "clip_fraction", "critic_loss"} <= set(logs)
    between = (algo.actor.raw_actions(algo.explore(obs)["chain"][:, -1]).abs() < MODE / 2).float().mean().item()
    assert between < 0.2, f"{between:.0%} of actions fall between the modes"


def test_critic_warmup_leaves_the_actor_alone_and_bad_settings_are_refused():
    algo = _algo(critic_warmup=1)
    before = {k: v.clone() for k, v in algo.actor.state_dict().items()}
    obs = {"state": torch.randn(4, 2, 5)}
    out = algo.explore(obs)
    rollout = {"obs": {"state": obs["state"][None]}, **{k: v[None] for k, v in out.items()}, "reward": torch.ones(1, 4),
               "done": torch.ones(1, 4, dtype=torch.bool), "next_value": torch.zeros(4)}  # fmt: skip
    logs = algo.update(rollout)
    assert logs["actor_trained"] == 0.0 and "policy_loss" not in logs
    assert all(torch.equal(before[k], v) for k, v in algo.actor.state_dict().items())
    with pytest.raises(ValueError, match="min_std"):
        DPPOConfig(min_std=0)
    with pytest.raises(ValueError, match="gae_lambda"):
        DPPOConfig(gae_lambda=1.5)


def test_ft_steps_trains_only_the_last_denoising_steps(monkeypatch):
    algo = _algo(diffusion_actor(steps=4), ft_steps=2, critic_warmup=0, minibatch=4)
    seen: list[torch.Tensor] = []
    loss = algo.policy_loss
    monkeypatch.setattr(algo, "policy_loss", lambda mb: (seen.append(mb["i"]), loss(mb))[1])
    obs = {"state": torch.randn(3, 2, 5)}
    out = algo.explore(obs)
    rollout = {"obs": {"state": obs["state"][None]}, **{k: v[None] for k, v in out.items()}, "reward": torch.ones(1, 3),
               "done": torch.ones(1, 3, dtype=torch.bool), "next_value": torch.zeros(3)}  # fmt: skip
    algo.update(rollout)
    steps = torch.cat(seen)
    assert len(steps) == 3 * 2 * algo.config.epochs and set(steps.tolist()) == {2, 3}
    with pytest.raises(ValueError, match="ft-steps 5"):
        _algo(diffusion_actor(steps=4), ft_steps=5)
