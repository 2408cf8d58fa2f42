"""Diffusion-QL and TD3+BC: gradients through the last k DDIM steps, update() on tiny offline data, best-of-N."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from algo_helpers import batch, diffusion_actor, engine, gaussian_actor, tiny_critic
from torch.utils.data import DataLoader

from dmrl.algos import TD3BC, CriticRankedPolicy, DiffusionQL, DiffusionQLConfig, TD3BCConfig
from dmrl.data import ChunkTransitionDataset, EpisodeStore
from dmrl.policies.checkpoint import load_policy, save_policy
from dmrl.types import Episode


def _opened(actor):
    """The denoiser's output layer starts at zero (no gradient reaches earlier layers): give it weights."""
    with torch.no_grad():
        for p in actor.denoiser.parameters():
            if not p.abs().sum():
                p.normal_(0, 0.1)
    return actor


@pytest.mark.parametrize("eta", [0.0, 0.5])
def test_sample_chunk_with_gradients_through_the_full_chain_equals_the_plain_sample(eta):
    actor = _opened(diffusion_actor(steps=4, eta=eta))
    cond = actor.encode(batch(3)["obs"])
    with torch.no_grad():
        plain = actor.sample_chunk(cond, generator=torch.Generator().manual_seed(7))
    out = actor.sample_chunk(cond, grad_steps=4, generator=torch.Generator().manual_seed(7))
    torch.testing.assert_close(out, plain)
    assert out.shape == (3, 8, 3) and out.requires_grad
    out.square().sum().backward()
    assert all(p.grad is not None for p in actor.denoiser.parameters())


@pytest.mark.parametrize("k", [1, 2])
def test_sample_chunk_gives_gradients_to_the_last_k_steps_only(k):
    actor = _opened(diffusion_actor(steps=4))
    tracked = []
    actor.denoiser.register_forward_hook(lambda mod, args, out: tracked.append(out.requires_grad))
    out = actor.sample_chunk(actor.encode(batch(2)["obs"]), grad_steps=k)
    assert tracked == [False] * (4 - k) + [True] * k
    # The same chunk as the full chain: truncation changes gradients, never the sample.
    torch.manual_seed(0)
    a = actor.sample_chunk(actor.encode(batch(2)["obs"]), grad_steps=k)
    torch.manual_seed(0)
    b = actor.sample_chunk(actor.encode(batch(2)["obs"]), grad_steps=4)
    torch.testing.assert_close(a, b)
    assert out.requires_grad


def test_sample_chunk_rejects_grad_steps_out_of_range():
    actor = diffusion_actor(steps=4)
    cond = actor.encode(batch(2)["obs"])
    for k in (-1, 5):
        with pytest.raises(ValueError, match="grad_steps"):
            actor.sample_chunk(cond, grad_steps=k)
    with pytest.raises(ValueError, match="grad_steps_through_chain"):
        DiffusionQLConfig(grad_steps_through_chain=0)
    with pytest.raises(ValueError, match="allowed 1..S=4"):
        DiffusionQL(actor, tiny_critic(actor), DiffusionQLConfig(grad_steps_through_chain=5), engine())
    with pytest.raises(ValueError, match="--policy.type diffusion"):
        DiffusionQL(gaussian_actor(), tiny_critic(actor), DiffusionQLConfig(), engine())


def _tiny_store(path, n_episodes: int = 4, length: int = 12) -> EpisodeStore:
    """State-only episodes whose reward prefers positive first action components (something to learn)."""
    store = EpisodeStore.create(
        path,
        env_id="dmrl/Test-v0",
        obs_modes=("state",),
        action_meaning=["a", "b", "c"],
        obs_spec={"state": ((5,), "float32")},
        action_dim=3,
    )
    rng = np.random.default_rng(0)
    for e in range(n_episodes):
        actions = rng.uniform(-1, 1, (length, 3)).astype(np.float32)
        store.append(
            Episode(
                obs={"state": rng.normal(size=(length, 5)).astype(np.float32)},
                final_obs={"state": rng.normal(size=5).astype(np.float32)},
                actions=actions,
                rewards=actions[:, 0].copy(),
                terminated=bool(e % 2),
                truncated=not e % 2,
                instruction="",
                target="",
                route=None,
                success=bool(e % 2),
                seed=e,
            )
        )
    return store


def test_update_on_tiny_offline_data_and_critic_learns_a_fixed_batch(tmp_path):
    store = _tiny_store(tmp_path / "s.zarr")
    ds = ChunkTransitionDataset(store, ["state"], n_obs_steps=2, horizon=8, n_action_steps=4)
    actor = diffusion_actor(steps=3)
    algo = DiffusionQL(
        actor, tiny_critic(actor), DiffusionQLConfig(grad_steps_through_chain=2, critic_lr=3e-3), engine()
    )
    ema_before = [p.clone() for p in algo.actor_ema.parameters()]
    loader = DataLoader(ds, batch_size=8, shuffle=True, generator=torch.Generator().manual_seed(0))
    for i, b in enumerate(loader):
        logs = algo.update({**b, "progress": 0.5})
        assert all(np.all(np.isfinite(np.asarray(v, dtype=float))) for v in logs.values()), logs
        assert logs["td_error"].shape == (8,)
        if i == 3:
            break
    assert algo.n_updates == 4 and {"critic_loss", "actor_loss", "actor_bc_loss", "actor_q_loss", "eta"} <= set(logs)
    assert any(not torch.equal(a, b) for a, b in zip(algo.actor_ema.parameters(), ema_before, strict=True))
    fixed = next(iter(DataLoader(ds, batch_size=16)))
    losses = [float(algo.update(fixed)["critic_loss"]) for _ in range(40)]
    assert np.mean(losses[-5:]) < 0.5 * np.mean(losses[:5]), losses


def test_eta_schedule_and_micro_batches():
    actor = diffusion_actor(steps=2)
    cfg = DiffusionQLConfig(eta=2.0, eta_schedule="linear", eta_warmup_steps=4)
    algo = DiffusionQL(actor, tiny_critic(actor), cfg, engine())
    assert algo.eta() == 0.0
    algo.n_updates = 2
    assert algo.eta() == pytest.approx(1.0)
    algo.n_updates = 10
    assert algo.eta() == pytest.approx(2.0)
    with pytest.raises(ValueError, match="eta_schedule"):
        DiffusionQLConfig(eta_schedule="cosine")
    assert np.isfinite(float(algo.update(batch(4))["critic_loss"])) and algo.n_updates == 11


def test_best_of_n_picks_the_critics_favourite_and_the_actor_saves_alone(tmp_path):
    actor = _opened(diffusion_actor(steps=2, eta=1.0))  # stochastic DDIM: N different samples
    algo = DiffusionQL(actor, tiny_critic(actor), DiffusionQLConfig(n_action_samples=5), engine())
    ranked = algo.evaluation_policy()
    assert isinstance(ranked, CriticRankedPolicy) and ranked.actor is algo.policy
    obs = batch(2)["obs"]
    torch.manual_seed(3)
    best = ranked.predict_chunk(obs)
    torch.manual_seed(3)
    rep = {"state": obs["state"].repeat_interleave(5, 0)}
    with torch.no_grad():
        samples = algo.policy.sample_chunk(algo.policy.encode(rep))  # (2·5, Tp, Da) normalised, same noise
        q = algo.critic_target(rep, algo.critic.executed(samples)).min(0).values.view(2, 5)
    expected = algo.policy.normalizer.unnormalize("actions", samples.view(2, 5, 8, 3)[torch.arange(2), q.argmax(1)])
    torch.testing.assert_close(best, expected.clamp(-1, 1))
    assert ranked.act({"state": np.zeros(5, np.float32)}).shape == (3,)
    save_policy(tmp_path / "ckpt", algo.policy)
    loaded, _ = load_policy(tmp_path / "ckpt")
    torch.testing.assert_close(
        loaded.state_dict()["denoiser.head.weight"], algo.policy.state_dict()["denoiser.head.weight"]
    )


def test_td3_bc_update_delays_the_actor():
    actor = gaussian_actor()
    algo = TD3BC(actor, tiny_critic(actor), TD3BCConfig(policy_delay=2), engine())
    actor_before = [p.clone() for p in actor.parameters()]
    first = algo.update(batch(8))
    assert "actor_loss" not in first and all(
        torch.equal(a, b) for a, b in zip(actor.parameters(), actor_before, strict=True)
    )
    second = algo.update(batch(8, seed=1))
    assert np.isfinite(float(second["actor_loss"])) and second["actor_lambda"] > 0
    assert any(not torch.equal(a, b) for a, b in zip(actor.parameters(), actor_before, strict=True))
    assert algo.policy is actor and algo.evaluation_policy() is actor
    with pytest.raises(ValueError, match="--policy.type gaussian"):
        TD3BC(diffusion_actor(), tiny_critic(actor), TD3BCConfig(), engine())


def test_bc_term_reads_the_separate_imitation_batch_when_given():
    torch.manual_seed(0)
    actor = _opened(diffusion_actor(steps=3))
    algo = DiffusionQL(actor, tiny_critic(actor), DiffusionQLConfig(eta=0.0), engine())
    main, other = batch(4), batch(4)
    other["action"] = other["action"] + 3.0  # far from main's actions: a clearly different BC loss
    torch.manual_seed(1)
    own = algo.actor_loss(main)["bc_loss"]
    torch.manual_seed(1)
    separate = algo.actor_loss({**main, "bc": other})["bc_loss"]
    torch.manual_seed(1)
    expected = actor.loss(other)["loss"].detach()
    torch.testing.assert_close(separate, expected)
    assert not torch.isclose(own, separate)
    assert float(algo.actor_loss({**main, "bc": None})["bc_loss"]) == 0.0  # no successes yet: Q term alone


def test_advantage_weights_follow_q_of_the_data_chunks_and_average_one():
    torch.manual_seed(0)
    actor = _opened(diffusion_actor(steps=2))
    cfg = DiffusionQLConfig(eta=0.0, bc_weighting="advantage", bc_weight_max=5.0, value_samples=3)
    algo = DiffusionQL(actor, tiny_critic(actor), cfg, engine())
    b = batch(16)
    torch.manual_seed(5)
    w = algo.advantage_weights(b)
    torch.manual_seed(5)  # the same actor samples: V(s) = mean Q of 3 chunks per row, rows in order
    with torch.no_grad():
        q = algo.critic(b["obs"], algo.critic.executed_from_data(b["action"])).min(0).values
        rep = {"state": b["obs"]["state"].repeat_interleave(3, 0)}
        chunks = algo.policy.sample_chunk(algo.policy.encode(rep))
        v = algo.critic(rep, algo.critic.executed(chunks)).min(0).values.view(16, 3).mean(1)
    adv = q - v
    assert w.shape == (16,) and torch.isclose(w.mean(), torch.tensor(1.0))
    assert torch.equal(torch.argsort(w[w < w.max()]), torch.argsort(adv[w < w.max()])), "weights rise with A"
    raw = torch.exp(adv / adv.abs().mean())
    assert raw.max() > 5.0, "this batch exercises the cap"
    torch.testing.assert_close(w, raw.clamp(max=5.0) / raw.clamp(max=5.0).mean())
    out = algo.actor_loss(b)
    assert float(out["q_loss"]) == 0.0 and torch.isfinite(out["loss"])  # eta 0: no Q term
    with pytest.raises(ValueError, match="bc_weighting"):
        DiffusionQLConfig(bc_weighting="awr")
    with pytest.raises(ValueError, match="replay batch itself"):
        algo.actor_loss({**b, "bc": batch(4)})


def test_td3_bc_reads_q_only_inside_the_action_bounds():
    actor = gaussian_actor()
    algo = TD3BC(actor, tiny_critic(actor), TD3BCConfig(), engine())
    seen = []
    forward = algo.critic.forward

    def spy(obs, actions=None):
        seen.append(actions.detach().clone())
        return forward(obs, actions)

    algo.critic.forward = spy
    with torch.no_grad():
        for p in actor.parameters():
            p.mul_(50.0)  # a mean far outside [-1, 1]
    algo.actor_loss(batch(8))
    assert seen and seen[-1].abs().max() <= 1.0


def test_the_actor_learns_from_the_uniform_actor_batch_when_one_is_given():
    actor = diffusion_actor()
    algo = DiffusionQL(actor, tiny_critic(actor), DiffusionQLConfig(eta=1.0), engine())
    per, uniform = batch(8, seed=0), batch(8, seed=1)
    seen = []
    forward = algo.critic.forward

    def spy(obs, actions=None):
        seen.append(obs["state"].clone())
        return forward(obs, actions)

    algo.critic.forward = spy
    algo.actor_loss(per | {"actor": uniform})
    assert torch.equal(seen[-1], uniform["obs"]["state"])  # the Q term reads the uniform draw's states
    torch.manual_seed(0)
    with_actor = algo.actor_loss(per | {"actor": uniform})["bc_loss"]
    torch.manual_seed(0)
    alone = algo.actor_loss(uniform)["bc_loss"]
    torch.testing.assert_close(with_actor, alone)  # and so does the BC term
