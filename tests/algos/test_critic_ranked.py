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
