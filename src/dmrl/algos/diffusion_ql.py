"""Diffusion-QL (Wang, Hunt & Zhou 2023, "Diffusion Policies as an Expressive Policy Class for Offline RL"): the
diffusion actor minimises its BC loss plus eta times a normalised -Q of chunks sampled through its own DDIM chain.

As in the authors' ``agents/ql_diffusion.py``: an EMA of the actor samples the next chunk of the TD target, a
clipped double-Q critic (min over the ensemble) is regressed first, then the actor steps against the updated
critic, then the target critic moves by Polyak averaging. Here the transitions are chunk-level (Ta-step returns,
see dmrl.data.transitions) and the Q term can backpropagate through only the last k DDIM steps (truncated
backpropagation through the sampling chain, as truncated BPTT does through time).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn

from dmrl.algos.best_of_n import CriticRankedPolicy, repeat_obs
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

ETA_SCHEDULES = ("constant", "linear")
BC_WEIGHTINGS = ("none", "advantage")


@dataclass
class DiffusionQLConfig:
    """Diffusion-QL: Q-term weight, gradient path through the DDIM chain, critic, learning rates, best-of-N."""

    eta: float = 1.0
    """Q-term weight: bc_loss + eta * (-Q / mean|Q|)."""
    eta_schedule: str = "constant"
    """constant or linear (ramp over eta_warmup_steps)."""
    eta_warmup_steps: int = 1000
    """Updates of the linear eta ramp."""
    grad_steps_through_chain: int | None = None
    """Gradients through the last k DDIM steps (None: all)."""
    n_action_samples: int = 1
    """Best-of-N: the critic picks 1 of N chunks (1: off)."""
    bc_weighting: str = "none"
    """none, or advantage: advantage-weighted BC (CRR / AWR)."""
    bc_weight_beta: float = 1.0
    """Advantage-weight temperature (smaller: sharper)."""
    bc_weight_max: float = 20.0
    """Cap on an advantage weight (before scaling to mean 1)."""
    value_samples: int = 4
    """Actor chunks per state whose mean Q is the baseline V(s)."""
    actor_lr: float = 3e-4
    """Adam learning rate of the actor."""
    critic_lr: float = 3e-4
    """Adam learning rate of the critic."""
    actor_tau: float = 0.005
    """Polyak rate of the EMA actor (exported)."""
    critic: CriticConfig = field(default_factory=CriticConfig)

    def __post_init__(self) -> None:
        if self.eta < 0 or self.eta_schedule not in ETA_SCHEDULES or self.eta_warmup_steps < 1:
            raise ValueError(
                f"diffusion_ql: need eta >= 0, eta_schedule in {', '.join(ETA_SCHEDULES)}, eta_warmup_steps >= 1; "
                f"got {self.eta}, {self.eta_schedule!r}, {self.eta_warmup_steps}"
            )
        k = self.grad_steps_through_chain
        if k is not None and k < 1:
            raise ValueError(f"diffusion_ql.grad_steps_through_chain: got {k}; allowed 1..S or None (all S steps)")
        if self.bc_weighting not in BC_WEIGHTINGS:
            raise ValueError(
                f"diffusion_ql.bc_weighting: got {self.bc_weighting!r}; allowed: {', '.join(BC_WEIGHTINGS)}"
            )
        if not (self.bc_weight_beta > 0 and self.bc_weight_max >= 1 and self.value_samples >= 1):
            raise ValueError(
                "diffusion_ql: need bc_weight_beta > 0, bc_weight_max >= 1, value_samples >= 1; got "
                f"{self.bc_weight_beta}, {self.bc_weight_max}, {self.value_samples}"
            )
        if not 0.0 < self.actor_tau <= 1.0:
            raise ValueError(f"--algo.actor-tau: got {self.actor_tau}; allowed (0, 1]")
        if self.n_action_samples < 1 or self.actor_lr <= 0 or self.critic_lr <= 0:
            raise ValueError(
                f"diffusion_ql: need n_action_samples >= 1, actor_lr > 0, critic_lr > 0; got "
                f"{self.n_action_samples}, {self.actor_lr}, {self.critic_lr}"
            )


class DiffusionQL(nn.Module):
    """Actor (a DiffusionPolicy), its EMA, critic, target critic and their two Adam optimizers.

    Batches: dmrl.data.ChunkTransitionDataset items with B in front (obs / next_obs {key: (B, To, ...)} raw,
    action (B, Tp, Da) raw, action_mask (B, Tp), reward / done / valid (B, Ta), next_valid (B,)), plus an
    optional "progress" in [0, 1] for the hybrid loss weights and PER "weights" (B,). ``engine``:
    dmrl.train.engine.Engine; build actor and critic on its device (the constructor prepares the algorithm).
    """

    batches = "transitions"  # dmrl.data.ChunkTransitionDataset items, offline or from the online replay

    def __init__(
        self,
        actor: DiffusionPolicy,
        critic: ChunkCritic,
        config: DiffusionQLConfig,
        engine: Stepper,
    ):
        super().__init__()
        if not isinstance(actor, DiffusionPolicy):
            raise ValueError(
                f"diffusion-ql trains a diffusion actor; got policy {actor.name!r} (use --policy.type diffusion)"
            )
        n_steps = actor.sampler.num_steps
        self.grad_steps = config.grad_steps_through_chain or n_steps
        if self.grad_steps > n_steps:
            raise ValueError(
                f"diffusion_ql.grad_steps_through_chain: got {self.grad_steps}; allowed 1..S={n_steps} "
                "(S: diffusion.num_inference_steps)"
            )
        self.config, self.engine = config, engine
        self.actor, self.critic = actor, critic
        self.actor_ema = frozen_copy(actor)
        self.critic_target = frozen_copy(critic)
        # The optimizers hold these Parameter objects: build actor and critic on the training device (a later
        # .to() keeps the objects on CPU / CUDA, but not on every backend).
        self.actor_opt = torch.optim.Adam([p for p in actor.parameters() if p.requires_grad], lr=config.actor_lr)
        self.critic_opt = torch.optim.Adam([p for p in critic.parameters() if p.requires_grad], lr=config.critic_lr)
        self.n_updates = 0
        engine.prepare(self)  # every trainable weight of actor and critic is what the engine clips

    @classmethod
    def build(
        cls, policy: DiffusionPolicy, config: DiffusionQLConfig, engine: Stepper, total_steps: int
    ) -> DiffusionQL:
        """The algorithm for a freshly built actor: a new critic shaped like it, both on the engine's device."""
        # On the device before the algorithm copies them into targets and hands them to its optimizers.
        policy.to(engine.device)
        return cls(policy, ChunkCritic(policy, config.critic).to(engine.device), config, engine)

    @property
    def policy(self) -> DiffusionPolicy:
        """The exported actor: the EMA weights."""
        return self.actor_ema

    @property
    def optimizers(self) -> dict[str, torch.optim.Optimizer]:
        return {"actor": self.actor_opt, "critic": self.critic_opt}

    def eta(self) -> float:
        ramp = min(1.0, self.n_updates / self.config.eta_warmup_steps) if self.config.eta_schedule == "linear" else 1.0
        return self.config.eta * ramp

    def critic_loss(self, batch: dict) -> dict[str, Tensor]:
        """Sum over heads of the (PER-weighted) squared error to the chunk TD target; a' from the EMA actor."""
        target_actor = self.policy
        with torch.no_grad():
            next_chunk = target_actor.sample_chunk(*target_actor.condition(batch["next_obs"]))  # (B, Tp, Da)
            next_q = self.critic_target(batch["next_obs"], self.critic.executed(next_chunk)).min(0).values  # (B,)
            y = chunk_td_target(
                batch["reward"], batch["done"], batch["valid"], batch["next_valid"], next_q, self.critic.config.gamma
            )
        q = self.critic(batch["obs"], self.critic.executed_from_data(batch["action"])).float()  # (E, B)
        loss, td_error = td_regression(q, y, batch.get("weights"))
        return {"loss": loss, "q": q.mean().detach(), "target": y.mean(), "td_error": td_error}

    def actor_loss(self, batch: dict) -> dict[str, Tensor]:
        """Diffusion BC loss + eta * (-Q / mean|Q|) of a chunk sampled with gradients through the last k steps.

        The BC term reads ``batch["bc"]`` when the batch carries one (a batch of the same layout, or None for no
        BC term), else the batch itself."""
        # Under PER the online source adds a uniform draw for the actor ("actor"); online self-imitation a separate
        # batch of successful episodes for the BC term ("bc"; None: none yet, Q term alone).
        actor_batch = batch.get("actor") or batch
        bc_batch = batch.get("bc", actor_batch)
        logs: dict[str, Tensor] = {}
        if bc_batch is not None and self.config.bc_weighting == "advantage":
            if bc_batch is not actor_batch:
                raise ValueError("diffusion_ql.bc_weighting advantage needs the BC term on the replay batch itself")
            bc_batch = actor_batch | {"sample_weight": self.advantage_weights(actor_batch)}
            logs["bc_weight_max"] = bc_batch["sample_weight"].max()
        bc_loss = self.actor.loss(bc_batch)["loss"] if bc_batch is not None else batch["action"].new_zeros(())
        eta = self.eta()
        q_loss = bc_loss.new_zeros(())
        if eta > 0:  # eta 0 (self-imitation, advantage-weighted BC alone) skips the sampling through the chain
            cond, cond_mask = self.actor.condition(actor_batch["obs"])
            a_theta = self.actor.sample_chunk(cond, cond_mask, grad_steps=self.grad_steps)  # (B, Tp, Da) normalised
            q = self.critic(actor_batch["obs"], self.critic.executed(a_theta)).float()  # (E, B); frozen by update()
            # Dividing by mean|Q| (no gradient) makes eta independent of the reward scale (Wang et al.; Fujimoto & Gu).
            q_loss = -q.mean() / q.abs().mean().detach().clamp_min(1e-6)
        actor_loss = bc_loss + eta * q_loss
        return {"loss": actor_loss, "bc_loss": bc_loss.detach(), "q_loss": q_loss.detach()} | logs

    @torch.no_grad()
    def advantage_weights(self, batch: dict) -> Tensor:
        """(B,) weights, mean 1: exp(A / (beta * mean|A|)) capped at bc_weight_max, A = Q(s, a_data) - V(s) with
        V(s) the mean min-ensemble Q of value_samples chunks from the EMA actor."""
        c, n = self.config, self.config.value_samples
        obs = batch["obs"]
        q_data = self.critic(obs, self.critic.executed_from_data(batch["action"])).min(0).values.float()  # (B,)
        b = q_data.shape[0]
        rep = repeat_obs(obs, n)
        chunks = self.policy.sample_chunk(*self.policy.condition(rep))  # (B * n, Tp, Da) normalised
        v = self.critic(rep, self.critic.executed(chunks)).min(0).values.float().view(b, n).mean(1)  # (B,)
        adv = q_data - v
        w = torch.exp(adv / (c.bc_weight_beta * adv.abs().mean().clamp_min(1e-6))).clamp(max=c.bc_weight_max)
        return w / w.mean()

    def update(self, batch: dict) -> dict[str, Any]:
        """One training step: critic, actor, targets. Returns losses (tensors) and td_error (B,) numpy."""
        # 1. Critic: regress every Q head on the TD target built from the EMA actor and the target critic.
        logs = {f"critic_{k}": v for k, v in self.engine.backward(self.critic_loss, batch).items()}
        logs["td_error"] = logs.pop("critic_td_error").float().cpu().numpy()  # (B,): new PER priorities
        critic_stats = self.engine.step(self.critic_opt)
        # 2. Actor: against the just-updated critic, which gets no gradient from this loss.
        with frozen(self.critic):
            logs |= {f"actor_{k}": v for k, v in self.engine.backward(self.actor_loss, batch).items()}
        actor_stats = self.engine.step(self.actor_opt)
        # 3. Targets: Polyak-averaged critic and EMA actor.
        polyak_update(self.critic_target, self.critic, self.critic.config.tau)
        polyak_update(self.actor_ema, self.actor, self.config.actor_tau)
        logs["eta"] = self.eta()
        self.n_updates += 1
        logs["critic_grad_norm"] = critic_stats["grad_norm"]
        logs["actor_grad_norm"] = actor_stats["grad_norm"]
        return logs

    def evaluation_policy(self) -> ChunkPolicy:
        """What evaluation runs: the exported actor, wrapped for best-of-N when n_action_samples > 1."""
        if self.config.n_action_samples == 1:
            return self.policy
        return CriticRankedPolicy(self.policy, self.critic_target, self.config.n_action_samples)
