"""CriticRankedPolicy wraps the actor: the policy surface evaluation uses, its own action queue, the actor untouched."""

from __future__ import annotations

import copy
import dataclasses

import numpy as np
import torch
from algo_helpers import diffusion_actor, tiny_critic

from dmrl.algos import CriticRankedPolicy
from dmrl.policies import ChunkPolicy


def _ranked(n: int = 3) -> CriticRankedPolicy:
    torch.manual_seed(0)
    actor = diffusion_actor(steps=2, eta=1.0)
    return CriticRankedPolicy(actor, tiny_critic(actor), n)


def test_it_wraps_the_actor_and_offers_what_evaluation_reads():
    ranked = _ranked()
    actor = ranked.actor
    assert not isinstance(ranked, ChunkPolicy), "composition: the actor owns encoder, normaliser and sampler"
    assert ranked.name == actor.name and ranked.config is actor.config and ranked.normalizer is actor.normalizer
    assert ranked.chunk == actor.chunk and ranked.obs_dims == actor.obs_dims and ranked.action_dim == actor.action_dim
    assert ranked.eval() is ranked and not actor.training and ranked.to("cpu") is ranked
    snapshot = copy.deepcopy(ranked).cpu()  # what curve_point does with an evaluation policy
    assert snapshot.predict_chunk({"state": torch.zeros(2, 2, 5)}).shape == (2, 8, 3)


def test_its_queue_is_its_own_and_replans_every_ta_steps_with_best_of_n():
    ranked = _ranked()
    calls = []
    plan = ranked.predict_chunk
    ranked.predict_chunk = lambda obs: calls.append(len(obs["state"])) or plan(obs)  # type: ignore[method-assign]
    obs = {"state": np.zeros((2, 5), np.float32)}
    for _ in range(5):  # Ta 4: plans at steps 0 and 4
        assert ranked.act(obs).shape == (2, 3)
    assert calls == [2, 2]
    assert ranked.actor._actions.hist is None, "the actor's own queue is untouched"
    ranked.reset(mask=np.array([True, False]))
    ranked.act(obs)
    assert calls == [2, 2, 1]
    # Ta changed on the wrapper (as evaluate.set_action_steps does) leaves the actor's chunk alone.
    ranked.chunk = dataclasses.replace(ranked.chunk, n_action_steps=2)
    ranked.reset()
    ranked.act(obs)
    ranked.act(obs)
    ranked.act(obs)
    assert calls == [2, 2, 1, 2, 2] and ranked.actor.chunk.n_action_steps == 4


class _TargetCritic(torch.nn.Module):
    """Q = -|executed actions - target|^2 (normalised space), one member: a critic whose best chunk is known."""

    def __init__(self, ranked: CriticRankedPolicy, target: float):
        super().__init__()
        self.inner, self.target = tiny_critic(ranked.actor), target

    def executed(self, chunk: torch.Tensor) -> torch.Tensor:
        return self.inner.executed(chunk)

    def forward(self, obs: dict, actions: torch.Tensor) -> torch.Tensor:
        return -(actions - self.target).pow(2).flatten(1).sum(1)[None]


def test_candidate_noise_perturbs_only_the_executed_actions_of_samples_after_the_first():
    ranked = _ranked(n=4)
    ranked.noise = 0.3
    torch.manual_seed(1)
    chunks = torch.rand(2 * 4, 8, 3) * 1.6 - 0.8  # (B·N, Tp, Da) normalised, inside the bounds
    out = ranked.perturb(chunks, 4)
    to, ta = ranked.chunk.n_obs_steps, ranked.chunk.n_action_steps
    rows = slice(to - 1, to - 1 + ta)
    moved = (out - chunks).abs().view(2, 4, 8, 3)
    assert torch.allclose(moved[:, 0], torch.zeros_like(moved[:, 0]), atol=1e-6), "sample 0 is the actor's own"
    assert (moved[:, 1:, rows] > 1e-4).float().mean() > 0.9, "the other samples' executed actions move"
    assert moved[:, :, : to - 1].max() < 1e-6 and moved[:, :, to - 1 + ta :].max() < 1e-6, "the rest does not"
    raw = ranked.actor.raw_actions(out)
    low, high = ranked.actor.action_bounds()
    assert (raw >= low - 1e-6).all() and (raw <= high + 1e-6).all()


def test_candidate_noise_lets_the_critic_move_a_collapsed_actor_towards_its_best_chunk():
    ranked = _ranked(n=32)
    ranked.critic = _TargetCritic(ranked, target=0.5)
    collapsed = torch.zeros(8, 3)  # an actor whose every sample is one chunk (normalised 0)
    ranked.actor.sample_chunk = lambda cond, *a, **k: collapsed.expand(cond.shape[0], 8, 3).clone()  # type: ignore
    obs = {"state": torch.zeros(2, 2, 5)}
    to, ta = ranked.chunk.n_obs_steps, ranked.chunk.n_action_steps
    as_is = ranked.actor.normalizer.normalize("actions", ranked.predict_chunk(obs))[:, to - 1 : to - 1 + ta]
    assert torch.allclose(as_is, torch.zeros_like(as_is), atol=1e-5), "no noise: best of N copies is the copy"
    ranked.noise = 0.3
    torch.manual_seed(0)
    picked = ranked.actor.normalizer.normalize("actions", ranked.predict_chunk(obs))[:, to - 1 : to - 1 + ta]
    assert (picked - 0.5).pow(2).sum() < (as_is - 0.5).pow(2).sum() - 0.5, "the critic's pick moves towards 0.5"
    ranked.margin = 100.0  # no perturbed candidate beats the actor's own sample by 100
    kept = ranked.actor.normalizer.normalize("actions", ranked.predict_chunk(obs))[:, to - 1 : to - 1 + ta]
    assert torch.allclose(kept, torch.zeros_like(kept), atol=1e-5), "a margin the critic cannot clear keeps the actor"
