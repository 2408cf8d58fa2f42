"""DSRL (diffusion steering, Wagenmaker et al. 2025) with noise aliasing: RL in the diffusion policy's noise space.

The pretrained diffusion policy stays frozen. With deterministic DDIM it maps an initial noise w (Tp, Da) to a chunk
f(s, w), so every w gives a chunk on the data's support. A small actor chooses w instead of drawing it from N(0, I):

- Q^A(s, a): chunk critic on executed chunks, TD target  r + gamma^Ta min_e Q^A'(s', f(s', pi(s'))).
- A^W(s, w): noise critic, regressed on min_e Q^A'(s, f(s, w)) at K random noises w ~ N(0, I) and at the actor's
  (noise aliasing: it learns from every noise, not only from those the env has seen), centred on the random
  noises' mean (an advantage: Q^A varies far more across states than across one state's noises).
- pi(s) -> w: a deterministic actor bounded to [-noise_bound, noise_bound], maximising A^W(s, pi(s)) / mean|Q^A|.

No gradient runs through the denoising chain, and the critic only ever scores chunks the frozen policy can produce.

It acts through :class:`SteeredPolicy`: the policy denoising from pi(s) in evaluation, and from pi(s) plus Gaussian
noise (``explore_std``) in online collectors, so exploration stays on the policy's support. The checkpoint is the
frozen policy, and the actor is rebuilt from the training state.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from dmrl.algos.best_of_n import PlanningWrapper, repeat_obs
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
from dmrl.policies.diffusion import DiffusionPolicy
from dmrl.policies.observations import build_encoder, encoder_inputs


@dataclass
class DSRLConfig:
    """DSRL: noise bound, actor size, learning rates, the two critics."""

    noise_bound: float = 1.5
    """The actor's noises lie in [-bound, bound] per coordinate (where N(0, I) puts most of its mass)."""
    actor_hidden: int = 256
    """Width of the noise actor's hidden layers."""
    actor_depth: int = 2
    """Hidden layers of the noise actor."""
    actor_lr: float = 3e-4
    """Adam learning rate of the noise actor."""
    critic_lr: float = 3e-4
    """Adam learning rate of both critics."""
    noise_samples: int = 3
    """K random noises per state that the noise critic learns from each update (besides the actor's)."""
    explore_std: float = 1.0
    """Online collectors add N(0, std^2) to the actor's noise (1: the policy's own sampling around pi(s))."""
    critic: CriticConfig = field(default_factory=lambda: CriticConfig(encoder_per_member=True))

    def __post_init__(self) -> None:
        if self.noise_bound <= 0 or self.actor_hidden < 8 or self.actor_depth < 1 or self.explore_std < 0:
            raise ValueError(
                f"dsrl: need noise_bound > 0, actor_hidden >= 8, actor_depth >= 1, explore_std >= 0; got "
                f"{self.noise_bound}, {self.actor_hidden}, {self.actor_depth}, {self.explore_std}"
            )
        if self.noise_samples < 2:
            raise ValueError(f"--algo.noise-samples: got {self.noise_samples}; need >= 2 (the advantage's baseline)")
        if self.actor_lr <= 0 or self.critic_lr <= 0:
            raise ValueError(f"dsrl: need actor_lr > 0 and critic_lr > 0; got {self.actor_lr}, {self.critic_lr}")


class NoiseActor(nn.Module):
    """pi(s): raw obs {key: (B, To, ...)} -> initial noise (B, Tp, Da) in [-bound, bound]; shaped like the policy it
    steers (observation keys, encoder architecture, normaliser statistics) with its own weights."""

    def __init__(self, policy: DiffusionPolicy, hidden: int, depth: int, bound: float):
        super().__init__()
        self.chunk, self.action_dim, self.bound = policy.chunk, policy.action_dim, bound
        self.normalizer = copy.deepcopy(policy.normalizer)
        self.vector_keys = policy.vector_keys
        self.encoder = build_encoder(policy.chunk, policy.obs_dims)
        dims = [self.encoder.out_dim] + [hidden] * depth
        self.layers = nn.ModuleList(nn.Linear(a, b) for a, b in zip(dims[:-1], dims[1:], strict=True))
        self.out = nn.Linear(hidden, policy.chunk.horizon * policy.action_dim)
        nn.init.zeros_(self.out.weight)  # starts at w = 0 for every state: the policy's mode-seeking centre
        nn.init.zeros_(self.out.bias)

    def forward(self, obs: dict) -> Tensor:
        h = self.encoder(encoder_inputs(obs, self.chunk.obs_keys, self.vector_keys, self.normalizer))
        h = h if isinstance(h, Tensor) else h.pooled  # (B, D)
        for layer in self.layers:
            h = F.mish(F.layer_norm(layer(h), (layer.out_features,)))
        return self.bound * torch.tanh(self.out(h)).view(-1, self.chunk.horizon, self.action_dim)


class SteeredPolicy(PlanningWrapper):
    """The frozen diffusion policy denoising from the actor's noise pi(s) (+ N(0, explore_std^2) when exploring)
    instead of a random one."""

    def __init__(self, policy: DiffusionPolicy, noise_actor: NoiseActor, explore_std: float = 0.0):
        super().__init__(policy)
        self.noise_actor, self.explore_std = noise_actor, explore_std

    @torch.no_grad()
    def predict_chunk(self, obs: dict) -> Tensor:
        """Raw obs {key: (B, To, ...)} -> raw chunk (B, Tp, Da) = f(s, w), w = pi(s) (+ exploration), clipped to
        the bounds."""
        w = self.noise_actor(obs)
        if self.explore_std:
            w = w + self.explore_std * torch.randn_like(w)
        return self.actor.raw_actions(self.actor.sample_chunk(*self.actor.condition(obs), init_noise=w))


class DSRL(nn.Module):
    """Frozen diffusion policy, noise actor, chunk critic Q^A (with target) and noise critic A^W; batches as QC's."""

    batches = "transitions"

    def __init__(
        self,
        policy: DiffusionPolicy,
        critic: ChunkCritic,
        noise_critic: ChunkCritic,
        config: DSRLConfig,
        engine: Stepper,
    ):
        super().__init__()
        if not isinstance(policy, DiffusionPolicy):
            raise ValueError(f"dsrl steers a diffusion policy; got policy {policy.name!r} (--policy.type diffusion)")
        if policy.config.ddim_eta != 0:
            raise ValueError(f"dsrl steers the deterministic DDIM map noise -> chunk: use --policy.ddim-eta 0 (got "
                             f"{policy.config.ddim_eta})")  # fmt: skip
        self.config, self.engine = config, engine
        self.actor = policy.requires_grad_(False)  # frozen: pass --init with the trained policy
        self.noise_actor = NoiseActor(policy, config.actor_hidden, config.actor_depth, config.noise_bound)
        self.noise_actor.to(engine.device)
        self.critic, self.noise_critic = critic, noise_critic
        self.critic_target = frozen_copy(critic)
        self.actor_opt = torch.optim.Adam(self.noise_actor.parameters(), lr=config.actor_lr)
        critics = [p for m in (critic, noise_critic) for p in m.parameters()]
        self.critic_opt = torch.optim.Adam(critics, lr=config.critic_lr)
        self.n_updates = 0
        self.q_scale = 1.0  # mean|Q^A| at the last critic step: the actor's loss scale
        engine.prepare(self)

    @classmethod
    def build(cls, policy: DiffusionPolicy, config: DSRLConfig, engine: Stepper, total_steps: int) -> DSRL:
        policy.to(engine.device)
        critic = ChunkCritic(policy, config.critic).to(engine.device)
        noise_critic = ChunkCritic(policy, config.critic, action_rows=policy.chunk.horizon).to(engine.device)
        return cls(policy, critic, noise_critic, config, engine)

    @property
    def policy(self) -> DiffusionPolicy:
        """The exported checkpoint: the frozen diffusion policy (it acts steered through evaluation_policy)."""
        return self.actor

    @property
    def optimizers(self) -> dict[str, torch.optim.Optimizer]:
        return {"actor": self.actor_opt, "critic": self.critic_opt}

    def evaluation_policy(self) -> ChunkPolicy:
        """The policy denoising from pi(s): deterministic."""
        return SteeredPolicy(self.actor, self.noise_actor)

    def collection_policy(self) -> ChunkPolicy:
        """What online collectors act with: the steered policy exploring around pi(s) in noise space, where every
        noise still gives a chunk the policy can produce."""
        return SteeredPolicy(self.actor, self.noise_actor, self.config.explore_std)

    def chunks_from(self, obs: dict, noise: Tensor) -> Tensor:
        """f(s, w): the frozen policy's deterministic chunks (B, Tp, Da), normalised, from noises (B, Tp, Da)."""
        with torch.no_grad():
            return self.actor.sample_chunk(*self.actor.condition(obs), init_noise=noise)

    def critic_loss(self, batch: dict) -> dict[str, Tensor]:
        """Q^A's TD regression on the data's executed chunks + the noise critic's regression on Q^A' at noises."""
        obs, nxt = batch["obs"], batch["next_obs"]
        with torch.no_grad():
            next_chunk = self.chunks_from(nxt, self.noise_actor(nxt))
            next_q = self.critic_target(nxt, self.critic.executed(next_chunk)).min(0).values
            y = chunk_td_target(batch["reward"], batch["done"], batch["valid"], batch["next_valid"], next_q,
                                self.critic.config.gamma)  # fmt: skip
            # Noise aliasing: the noise critic learns about noises the env never saw, K random ones and pi's, per
            # state. Its target is centred on the random noises' mean Q (an advantage A(s, w)): Q^A varies far
            # more across states than across noises, and a critic fitting both spends its error on the states.
            b, k = y.shape[0], self.config.noise_samples
            w = torch.randn(b, k, *next_chunk.shape[1:], device=y.device)
            w = torch.cat(
                [w.clamp(-self.config.noise_bound, self.config.noise_bound), self.noise_actor(obs)[:, None]], 1
            )
            w = w.flatten(0, 1)  # (B·(K+1), Tp, Da): row i·(K+1) + j is noise j of state i, j = K the actor's
            rep = repeat_obs(obs, k + 1)
            q_w = self.critic_target(rep, self.critic.executed(self.chunks_from(rep, w))).min(0).values.view(b, k + 1)
            adv = q_w - q_w[:, :k].mean(1, keepdim=True)  # (B, K+1)
            self.q_scale = float(q_w.abs().mean().clamp_min(1e-6))  # the actor's Q scale (FQL's mean|Q|)
        q = self.critic(obs, self.critic.executed_from_data(batch["action"])).float()
        q_loss, td_error = td_regression(q, y, batch.get("weights"))
        a_w = self.noise_critic(rep, w).float()  # (E, B·(K+1))
        w_loss = (a_w - adv.flatten()).pow(2).mean(1).sum()
        logs = {"q": q.mean().detach(), "target": y.mean(), "noise_loss": w_loss.detach()}
        logs |= {"noise_adv_actor": adv[:, k].mean(), "noise_adv_spread": adv[:, :k].std(1).mean()}
        return {"loss": q_loss + w_loss, **logs, "td_error": td_error}

    def actor_loss(self, batch: dict) -> dict[str, Tensor]:
        """-A^W(s, pi(s)) / mean|Q^A| over the (uniform) actor batch: the noise advantage on the value's scale."""
        obs = (batch.get("actor") or batch)["obs"]
        adv = self.noise_critic(obs, self.noise_actor(obs)).float().mean(0)  # (B,)
        return {"loss": -adv.mean() / self.q_scale, "adv": adv.mean().detach()}

    def update(self, batch: dict) -> dict[str, Any]:
        """One step: both critics, then the noise actor against the noise critic, then Q^A's target."""
        logs = {f"critic_{k}": v for k, v in self.engine.backward(self.critic_loss, batch).items()}
        logs["td_error"] = logs.pop("critic_td_error").float().cpu().numpy()
        logs["critic_grad_norm"] = self.engine.step(self.critic_opt)["grad_norm"]
        with frozen(self.noise_critic):
            logs |= {f"actor_{k}": v for k, v in self.engine.backward(self.actor_loss, batch).items()}
        logs["actor_grad_norm"] = self.engine.step(self.actor_opt)["grad_norm"]
        polyak_update(self.critic_target, self.critic, self.critic.config.tau)
        self.n_updates += 1
        return logs
