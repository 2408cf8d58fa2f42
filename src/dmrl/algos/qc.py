"""Q-chunking (QC, Li, Zhou & Levine 2025) and what it shares with IDQL (dmrl.algos.iql): a behaviour-cloned
diffusion proposal whose samples the critic chooses among (best-of-N), so the critic never pushes the actor off the
data.

QC's critic reads the executed chunk; its TD target is max over N proposal samples a'_j of min_e Q'(s', a'_j) (an
in-support max backup: Q is read only at chunks the proposal produces, no gradient through its sampler). It acts by
best-of-N (dmrl.algos.best_of_n.CriticRankedPolicy) in evaluation and in online collectors. One readable update():
critic, then the BC proposal, then the targets.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn

from dmrl.algos.best_of_n import CriticRankedPolicy, repeat_obs
from dmrl.algos.common import Stepper
from dmrl.algos.critic import ChunkCritic, CriticConfig, chunk_td_target, frozen_copy, polyak_update, td_regression
from dmrl.policies.base import ChunkPolicy
from dmrl.policies.diffusion import DiffusionPolicy


def per_member_critic() -> CriticConfig:
    # Independent encoders: an ensemble whose members share one encoder agrees on its errors (issue 27 finding 4).
    return CriticConfig(encoder_per_member=True)


@dataclass
class ProposalConfig:
    """What QC and IDQL configure alike: best-of-N acting, learning rates, EMA, critic."""

    n_action_samples: int = 32
    """Best-of-N at act time: chunks the proposal samples per decision."""
    actor_lr: float = 3e-4
    """Adam learning rate of the BC proposal."""
    critic_lr: float = 3e-4
    """Adam learning rate of the critic (and IDQL's value)."""
    actor_tau: float = 0.005
    """Polyak rate of the EMA proposal (exported; QC's backup samples it)."""
    candidate_noise: float = 0.0
    """Std of Gaussian noise (normalised action space) on the executed actions of all but the first of the N
    samples before the critic picks one, in evaluation and in online collectors (0: the proposal's samples alone).
    A trained proposal's samples can be near-identical where the outcome is decided; perturbed candidates give the
    critic a choice there, and collecting with them shows the critic what those choices lead to."""
    candidate_margin: float = 0.0
    """Q units by which a perturbed candidate must beat the actor's own sample to be picked (with candidate_noise)."""
    critic: CriticConfig = field(default_factory=per_member_critic)

    def __post_init__(self) -> None:
        if self.n_action_samples < 1 or self.actor_lr <= 0 or self.critic_lr <= 0 or not 0.0 < self.actor_tau <= 1.0:
            raise ValueError(
                f"--algo: need n_action_samples >= 1, actor_lr > 0, critic_lr > 0, actor_tau in (0, 1]; got "
                f"{self.n_action_samples}, {self.actor_lr}, {self.critic_lr}, {self.actor_tau}"
            )
        if self.candidate_noise < 0 or (self.candidate_noise > 0 and self.n_action_samples < 2):
            raise ValueError(
                f"--algo.candidate-noise: got {self.candidate_noise} with n_action_samples {self.n_action_samples}; "
                "need >= 0, and > 0 only with --algo.n-action-samples >= 2 (sample 0 is never perturbed)"
            )
        if self.candidate_margin < 0:
            raise ValueError(f"--algo.candidate-margin: got {self.candidate_margin}; need >= 0 (Q units)")


@dataclass
class QCConfig(ProposalConfig):
    """Q-chunking: best-of-N acting and an in-support max backup over N samples of the BC proposal."""

    backup_samples: int = 8
    """N of the TD target's max over proposal samples at s'."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.backup_samples < 1:
            raise ValueError(f"--algo.backup-samples: got {self.backup_samples}; need >= 1")


class BCProposalCritic(nn.Module):
    """What QC and IDQL share: a diffusion proposal trained by BC (with an EMA, exported), a Q ensemble with its
    target, their Adam optimizers, and best-of-N evaluation. Batches: dmrl.data.ChunkTransitionDataset items."""

    batches = "transitions"

    def __init__(
        self,
        actor: DiffusionPolicy,
        critic: ChunkCritic,
        config: ProposalConfig,
        engine: Stepper,
        value: ChunkCritic | None = None,
    ):
        super().__init__()
        self.value = value  # IDQL's V(s), trained with the critic by the critic's optimizer
        if not isinstance(actor, DiffusionPolicy):
            raise ValueError(f"{type(self).__name__.lower()} samples a diffusion proposal; got policy {actor.name!r} "
                             "(use --policy.type diffusion)")  # fmt: skip
        self.config, self.engine = config, engine
        self.actor, self.critic = actor, critic
        self.actor_ema = frozen_copy(actor)
        self.critic_target = frozen_copy(critic)
        self.actor_opt = torch.optim.Adam([p for p in actor.parameters() if p.requires_grad], lr=config.actor_lr)
        self.critic_opt = torch.optim.Adam(self.critic_parameters(), lr=config.critic_lr)
        self.n_updates = 0
        engine.prepare(self)

    def critic_parameters(self) -> list[nn.Parameter]:
        nets = [self.critic] + ([self.value] if self.value is not None else [])
        return [p for m in nets for p in m.parameters() if p.requires_grad]

    @classmethod
    def build(
        cls, policy: DiffusionPolicy, config: ProposalConfig, engine: Stepper, total_steps: int
    ) -> BCProposalCritic:
        """The algorithm for a freshly built proposal: a new critic shaped like it, both on the engine's device."""
        policy.to(engine.device)
        return cls(policy, ChunkCritic(policy, config.critic).to(engine.device), config, engine)

    @property
    def policy(self) -> DiffusionPolicy:
        """The exported proposal: the EMA weights (a plain BC policy; best-of-N needs the critic beside it)."""
        return self.actor_ema

    @property
    def optimizers(self) -> dict[str, torch.optim.Optimizer]:
        return {"actor": self.actor_opt, "critic": self.critic_opt}

    def evaluation_policy(self) -> ChunkPolicy:
        """Best-of-N over the EMA proposal (perturbed by ``candidate_noise``), ranked by the target critic
        (1 sample: the proposal alone)."""
        if self.config.n_action_samples == 1:
            return self.policy
        cfg = self.config
        return CriticRankedPolicy(
            self.policy, self.critic_target, cfg.n_action_samples, cfg.candidate_noise, cfg.candidate_margin
        )

    def data_q(self, batch: dict) -> Tensor:
        """Q (E, B) of the dataset's executed chunks."""
        return self.critic(batch["obs"], self.critic.executed_from_data(batch["action"])).float()

    def bc_loss(self, batch: dict) -> dict[str, Tensor]:
        """The proposal's diffusion BC loss on ``batch["bc"]`` when the batch carries one (online self-imitation:
        successful episodes; None: none yet, no BC step), else on the uniform ``batch["actor"]`` (online, under
        PER), else on the batch itself."""
        bc = batch.get("bc", batch.get("actor") or batch)
        if bc is None:
            return {"loss": batch["action"].new_zeros((), requires_grad=True)}
        return {"loss": self.actor.loss(bc)["loss"]}

    def critic_loss(self, batch: dict) -> dict[str, Tensor]:
        """{"loss", ..., "td_error" (B,)}: each method's critic regression."""
        raise NotImplementedError

    def update(self, batch: dict) -> dict[str, Any]:
        """One step: the critic (QC: on the in-support max backup; IDQL: V and Q on dataset chunks), then BC for
        the proposal, then the Polyak targets. Returns losses (tensors) and td_error (B,) numpy."""
        logs = {f"critic_{k}": v for k, v in self.engine.backward(self.critic_loss, batch).items()}
        logs["td_error"] = logs.pop("critic_td_error").float().cpu().numpy()  # (B,): PER priorities
        logs["critic_grad_norm"] = self.engine.step(self.critic_opt)["grad_norm"]
        logs |= {f"actor_{k}": v for k, v in self.engine.backward(self.bc_loss, batch).items()}
        logs["actor_grad_norm"] = self.engine.step(self.actor_opt)["grad_norm"]
        polyak_update(self.critic_target, self.critic, self.critic.config.tau)
        polyak_update(self.actor_ema, self.actor, self.config.actor_tau)
        self.n_updates += 1
        return logs


class QC(BCProposalCritic):
    """Q-chunking: the critic's target maxes over the proposal's own samples at s' (never over arbitrary chunks)."""

    config: QCConfig

    @torch.no_grad()
    def backup_q(self, next_obs: dict) -> Tensor:
        """max_j min_e Q'(s', a'_j) over backup_samples chunks a'_j of the EMA proposal -> (B,)."""
        n = self.config.backup_samples
        rep = repeat_obs(next_obs, n)  # copy j of sample i is row i * n + j
        chunks = self.policy.sample_chunk(*self.policy.condition(rep))  # (B·n, Tp, Da) normalised
        q = self.critic_target(rep, self.critic.executed(chunks)).min(0).values.float()  # (B·n,)
        return q.view(-1, n).max(1).values

    def critic_loss(self, batch: dict) -> dict[str, Tensor]:
        y = chunk_td_target(batch["reward"], batch["done"], batch["valid"], batch["next_valid"],
                            self.backup_q(batch["next_obs"]), self.critic.config.gamma)  # fmt: skip
        q = self.data_q(batch)  # (E, B)
        loss, td_error = td_regression(q, y, batch.get("weights"))
        return {"loss": loss, "q": q.mean().detach(), "target": y.mean(), "td_error": td_error}
