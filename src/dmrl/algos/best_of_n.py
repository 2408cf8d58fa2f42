"""Best-of-N action selection (as QC, IDQL and Diffusion-QL select actions): a proposal policy samples N chunks per
observation and a critic picks the one with the highest min-ensemble Q."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from dmrl.algos.critic import ChunkCritic
from dmrl.policies.base import ActionQueue, ChunkPolicy


def repeat_obs(obs: dict, n: int) -> dict:
    """Raw obs {key: (B, ...) tensor or list of B strings} -> each sample repeated n times, consecutively: copy j of
    sample i is row i * n + j (what best-of-N and the advantage baseline sample their N chunks from)."""
    return {
        k: [x for x in v for _ in range(n)] if isinstance(v, list) else v.repeat_interleave(n, 0)
        for k, v in obs.items()
    }


class PlanningWrapper(nn.Module):
    """An evaluation-time wrapper that plans each chunk its own way around an actor (composition, not a subclass):
    it offers what evaluation calls on a policy (``act``, ``reset``, ``predict_chunk``, ``chunk``, ``normalizer``,
    ``name``, ``.to()``, ``.eval()``) and keeps its own receding-horizon queue, so it never disturbs the actor's.
    ``chunk`` starts as the actor's; changing it (e.g. Ta, dmrl.train.evaluate.set_action_steps) changes how this
    wrapper executes, not the actor. It is never saved: the checkpoint is the plain actor. Subclasses define
    ``predict_chunk`` (raw obs {key: (B, To, ...)} -> raw chunk (B, Tp, Da))."""

    def __init__(self, actor: ChunkPolicy):
        super().__init__()
        self.actor = actor
        self.chunk = actor.chunk
        self._actions = ActionQueue()

    @property
    def name(self) -> str:
        return self.actor.name

    @property
    def config(self) -> Any:
        return self.actor.config

    @property
    def obs_dims(self) -> dict:
        return self.actor.obs_dims

    @property
    def action_dim(self) -> int:
        return self.actor.action_dim

    @property
    def normalizer(self) -> nn.Module:
        return self.actor.normalizer

    def reset(self, mask: np.ndarray | None = None) -> None:
        """Forget history and queued actions, for all envs or those where ``mask`` (B,) is True."""
        self._actions.reset(mask)

    @torch.inference_mode()
    def act(self, obs: dict) -> np.ndarray:
        """One env step {key: (B, ...)} or unbatched -> actions (B, Da) or (Da,), as :meth:`ChunkPolicy.act` (the
        same timeline), with each chunk planned by this wrapper's ``predict_chunk``."""
        device = next(self.parameters()).device
        return self._actions.step(obs, self.chunk, self.actor.action_dim, device, self.predict_chunk)

    def predict_chunk(self, obs: dict) -> Tensor:
        raise NotImplementedError


class CriticRankedPolicy(PlanningWrapper):
    """Best-of-N action selection: the actor samples N chunks per observation, the critic's min-ensemble Q picks one
    (a :class:`PlanningWrapper`; the checkpoint is the plain actor, which loads without a critic).

    ``noise`` > 0 perturbs the executed actions of samples 1..N-1 (sample 0 stays the actor's) by Gaussian noise of
    that std in the normalised action space, clipped to the action bounds, before the critic ranks them: where a
    trained actor's samples are near-identical, the choice is then not only between copies of one chunk. A perturbed
    candidate is picked only if its Q beats the actor's own sample by ``margin`` (the critic has seen few such
    chunks: it must be sure before it leaves the actor's support)."""

    def __init__(
        self, actor: ChunkPolicy, critic: ChunkCritic, n_samples: int, noise: float = 0.0, margin: float = 0.0
    ):
        super().__init__(actor)
        self.critic, self.n_samples, self.noise, self.margin = critic, n_samples, noise, margin

    def perturb(self, chunks: Tensor, n: int) -> Tensor:
        """(B·N, Tp, Da) normalised samples -> the same with samples j >= 1 of each row's N perturbed in their Ta
        executed actions and clipped to the raw action bounds (so the critic ranks what the env will execute)."""
        to, ta = self.chunk.n_obs_steps, self.chunk.n_action_steps
        eps = torch.randn_like(chunks[:, to - 1 : to - 1 + ta]) * self.noise
        eps.view(-1, n, *eps.shape[1:])[:, 0] = 0.0  # sample 0 of every env: the actor's own chunk
        out = chunks.clone()
        out[:, to - 1 : to - 1 + ta] += eps
        return self.actor.normalizer.normalize("actions", self.actor.raw_actions(out))

    @torch.no_grad()
    def predict_chunk(self, obs: dict) -> Tensor:
        """Raw obs {key: (B, To, ...)} -> raw chunk (B, Tp, Da): the best of N samples, clipped to the bounds."""
        n = self.n_samples
        first = next(iter(obs.values()))
        b = len(first) if isinstance(first, list) else first.shape[0]
        rep = repeat_obs(obs, n)  # sample j of env i is row i * N + j
        chunks = self.actor.sample_chunk(*self.actor.condition(rep))  # (B·N, Tp, Da) normalised
        if self.noise > 0:
            chunks = self.perturb(chunks, n)
        q = self.critic(rep, self.critic.executed(chunks)).min(0).values.view(b, n)  # (B, N)
        if self.noise > 0 and self.margin:
            q[:, 1:] -= self.margin  # sample 0 of every env is the actor's own, unperturbed
        best = chunks.view(b, n, *chunks.shape[1:])[torch.arange(b, device=chunks.device), q.argmax(1)]
        return self.actor.raw_actions(best)
