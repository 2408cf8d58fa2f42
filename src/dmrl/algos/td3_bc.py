"""TD3+BC (Fujimoto & Gu 2021, "A Minimalist Approach to Offline Reinforcement Learning"): TD3 whose actor loss
adds a behaviour-cloning MSE, with the Q term scaled by lambda = alpha / mean|Q|.

The actor is the Gaussian chunk policy's mean (deterministic, as TD3's); the critic is the same chunk critic as
Diffusion-QL's (clipped double Q over Ta-step returns). TD3's other two ingredients: the actor and both targets
move every ``policy_delay`` critic steps, and the target action is smoothed with clipped Gaussian noise.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn

from dmrl.algos.common import Stepper
from dmrl.algos.critic import (
    ChunkCritic,
    CriticConfig,
    chunk_td_target,
    frozen,
    frozen_copy,
    polyak_update,
    td_regression,
)
from dmrl.policies.base import ChunkPolicy
from dmrl.policies.gaussian import GaussianPolicy
from dmrl.policies.mlp_heads import masked_mean


@dataclass
class TD3BCConfig:
    """TD3+BC's constants (the paper's defaults) and learning rates."""

    alpha: float = 2.5
    """Q-term scale: -alpha / mean|Q| * Q(s, pi(s)) + MSE(pi(s), a)."""
    policy_delay: int = 2
    """Critic steps per actor (and target) step."""
    policy_noise: float = 0.2
    """Std of the target-policy smoothing noise (normalised units)."""
    noise_clip: float = 0.5
    """Clip of the smoothing noise."""
    actor_lr: float = 3e-4
    """Adam learning rate of the actor."""
    critic_lr: float = 3e-4
    """Adam learning rate of the critic."""
    critic: CriticConfig = field(default_factory=CriticConfig)

    def __post_init__(self) -> None:
        if self.alpha < 0 or self.policy_delay < 1 or self.policy_noise < 0 or self.noise_clip < 0:
            raise ValueError(
                f"td3_bc: need alpha >= 0, policy_delay >= 1, policy_noise >= 0, noise_clip >= 0; got {self.alpha}, "
                f"{self.policy_delay}, {self.policy_noise}, {self.noise_clip}"
            )
        if self.actor_lr <= 0 or self.critic_lr <= 0:
            raise ValueError(f"td3_bc: need actor_lr > 0 and critic_lr > 0; got {self.actor_lr}, {self.critic_lr}")


def mean_chunk(policy: GaussianPolicy, obs: dict) -> Tensor:
    """Raw obs {key: (B, To, ...)} -> the policy's deterministic normalised chunk (B, Tp, Da)."""
    return policy.sample_chunk(policy.encode(obs), grad_steps=1)  # gradients wherever the caller has them


class TD3BC(nn.Module):
    """Actor (a GaussianPolicy's mean), target actor, critic, target critic and two Adam optimizers.

    Batches and ``engine`` as :class:`dmrl.algos.diffusion_ql.DiffusionQL`. The exported policy is the actor.
    """

    batches = "transitions"  # dmrl.data.ChunkTransitionDataset items, offline or from the online replay

    def __init__(self, actor: GaussianPolicy, critic: ChunkCritic, config: TD3BCConfig, engine: Stepper):
        super().__init__()
        if not isinstance(actor, GaussianPolicy):
            raise ValueError(f"td3-bc trains a gaussian actor; got policy {actor.name!r} (use --policy.type gaussian)")
        self.config, self.engine = config, engine
        self.actor, self.critic = actor, critic
        self.actor_target = frozen_copy(actor)
        self.critic_target = frozen_copy(critic)
        self.actor_opt = torch.optim.Adam([p for p in actor.parameters() if p.requires_grad], lr=config.actor_lr)
        self.critic_opt = torch.optim.Adam([p for p in critic.parameters() if p.requires_grad], lr=config.critic_lr)
        self.n_updates = 0
        self._actor_logs: dict[str, Any] = {}  # the last actor step's, reported on the steps in between
        engine.prepare(self)  # every trainable weight of actor and critic is what the engine clips

    @classmethod
    def build(cls, policy: GaussianPolicy, config: TD3BCConfig, engine: Stepper, total_steps: int) -> TD3BC:
        """The algorithm for a freshly built actor: a new critic shaped like it, both on the engine's device."""
        policy.to(engine.device)
        return cls(policy, ChunkCritic(policy, config.critic).to(engine.device), config, engine)

    @property
    def policy(self) -> GaussianPolicy:
        return self.actor

    @property
    def optimizers(self) -> dict[str, torch.optim.Optimizer]:
        return {"actor": self.actor_opt, "critic": self.critic_opt}

    def critic_loss(self, batch: dict) -> dict[str, Tensor]:
        """Sum over heads of the (PER-weighted) squared error to the chunk TD target; a' = smoothed target actor."""
        c = self.config
        with torch.no_grad():
            next_a = self.critic.executed(mean_chunk(self.actor_target, batch["next_obs"]))  # (B, Ta, Da)
            noise = (torch.randn_like(next_a) * c.policy_noise).clamp(-c.noise_clip, c.noise_clip)
            next_a = (next_a + noise).clamp(-1.0, 1.0)
            next_q = self.critic_target(batch["next_obs"], next_a).min(0).values  # (B,)
            y = chunk_td_target(
                batch["reward"], batch["done"], batch["valid"], batch["next_valid"], next_q, self.critic.config.gamma
            )
        q = self.critic(batch["obs"], self.critic.executed_from_data(batch["action"])).float()  # (E, B)
        loss, td_error = td_regression(q, y, batch.get("weights"))
        return {"loss": loss, "q": q.mean().detach(), "target": y.mean(), "td_error": td_error}

    def actor_loss(self, batch: dict) -> dict[str, Tensor]:
        """-lambda Q1(s, pi(s)) + MSE to the data's whole chunk (padded steps masked), lambda = alpha / mean|Q1|."""
        batch = batch.get("actor") or batch  # online under PER: the actor's own uniform draw
        pi = mean_chunk(self.actor, batch["obs"]).float()  # (B, Tp, Da)
        # The Gaussian mean is unbounded; Q is read only inside the action bounds ([-1, 1] normalised, what the
        # data covers and what the env executes), so the Q term cannot push the actor out of them (issue 27 #4).
        q = self.critic(batch["obs"], self.critic.executed(pi).clamp(-1.0, 1.0))[0].float()  # (B,) first head
        lam = self.config.alpha / q.abs().mean().detach().clamp_min(1e-6)
        target = self.actor.normalizer.normalize("actions", batch["action"].float())  # (B, Tp, Da)
        bc_loss = masked_mean(((pi - target) ** 2).mean(-1), batch.get("action_mask"))
        actor_loss = -lam * q.mean() + bc_loss
        return {"loss": actor_loss, "bc_loss": bc_loss.detach(), "q": q.mean().detach(), "lambda": lam}

    def update(self, batch: dict) -> dict[str, Any]:
        """One training step: critic; every policy_delay-th step also actor and both targets."""
        logs = {f"critic_{k}": v for k, v in self.engine.backward(self.critic_loss, batch).items()}
        logs["td_error"] = logs.pop("critic_td_error").float().cpu().numpy()  # (B,): new PER priorities
        logs["critic_grad_norm"] = self.engine.step(self.critic_opt)["grad_norm"]
        self.n_updates += 1
        if self.n_updates % self.config.policy_delay == 0:  # a Python counter: no device sync
            with frozen(self.critic):
                actor_logs = {f"actor_{k}": v for k, v in self.engine.backward(self.actor_loss, batch).items()}
            actor_logs["actor_grad_norm"] = self.engine.step(self.actor_opt)["grad_norm"]
            self._actor_logs = actor_logs
            polyak_update(self.critic_target, self.critic, self.critic.config.tau)
            polyak_update(self.actor_target, self.actor, self.critic.config.tau)
        return {**logs, **self._actor_logs}

    def evaluation_policy(self) -> ChunkPolicy:
        return self.actor
