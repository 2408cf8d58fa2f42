"""FQL (flow Q-learning, Park, Li & Levine 2025) with a diffusion teacher: a one-step policy maximises Q while it is
distilled from the multi-step BC policy's noise-to-chunk map, so no gradient runs through the denoising chain.

- Teacher: the diffusion policy, trained by plain BC on the data; with deterministic DDIM (ddim_eta 0) it maps an
  initial noise z (Tp, Da) to a chunk: teacher(s, z).
- Student (:class:`OneStepPolicy`): an MLP over its own observation encoding and z that outputs a chunk in one call.
  Its loss is  -Q(s, student(s, z)) / mean|Q|  +  alpha · ||student(s, z) - teacher(s, z)||²: the distillation
  keeps it near the data's modes (each z stays with the mode the teacher sends it to), the Q term moves it within
  them.
- Critic: clipped double-Q on chunk TD targets whose next chunk is the student's.

The student is what acts (evaluation and online collectors), in one network call per chunk; the checkpoint holds
the teacher (a plain BC diffusion policy), and the student is rebuilt from the run's training state.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from dmrl.algos.best_of_n import CriticRankedPolicy
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
from dmrl.policies.base import ActionQueue, ChunkPolicy, raw_actions
from dmrl.policies.diffusion import DiffusionPolicy
from dmrl.policies.observations import build_encoder, encoder_inputs


@dataclass
class FQLConfig:
    """FQL: distillation weight, student size, acting samples, learning rates, critic."""

    alpha: float = 10.0
    """Distillation weight: -Q / mean|Q| + alpha * MSE(student, teacher)."""
    student_hidden: int = 512
    """Width of the one-step student's hidden layers."""
    student_depth: int = 4
    """Hidden layers of the one-step student."""
    n_action_samples: int = 1
    """Student chunks per decision; > 1: the critic picks the best."""
    actor_lr: float = 3e-4
    """Adam learning rate of teacher and student."""
    critic_lr: float = 3e-4
    """Adam learning rate of the critic."""
    critic: CriticConfig = field(default_factory=lambda: CriticConfig(encoder_per_member=True))

    def __post_init__(self) -> None:
        if self.alpha < 0 or self.student_hidden < 8 or self.student_depth < 1 or self.n_action_samples < 1:
            raise ValueError(
                f"fql: need alpha >= 0, student_hidden >= 8, student_depth >= 1, n_action_samples >= 1; got "
                f"{self.alpha}, {self.student_hidden}, {self.student_depth}, {self.n_action_samples}"
            )
        if self.actor_lr <= 0 or self.critic_lr <= 0:
            raise ValueError(f"fql: need actor_lr > 0 and critic_lr > 0; got {self.actor_lr}, {self.critic_lr}")


class OneStepPolicy(nn.Module):
    """A one-step chunk generator: raw obs {key: (B, To, ...)} and noise z (B, Tp, Da) -> normalised chunk.

    Shaped like its teacher (observation keys, encoder architecture, normaliser statistics) with its own weights.
    It offers what evaluation and best-of-N call on a policy (``condition``, ``sample_chunk``, ``predict_chunk``,
    ``act``, ``reset``, ``chunk``, ``normalizer``, ``obs_dims``, ``action_dim``, ``name``).
    """

    name = "onestep"
    config = None

    def __init__(self, teacher: DiffusionPolicy, hidden: int, depth: int):
        super().__init__()
        self.chunk, self.obs_dims, self.action_dim = teacher.chunk, teacher.obs_dims, teacher.action_dim
        self.normalizer = copy.deepcopy(teacher.normalizer)
        self.vector_keys = teacher.vector_keys
        self.encoder = build_encoder(teacher.chunk, teacher.obs_dims)
        n_out = teacher.chunk.horizon * teacher.action_dim
        dims = [self.encoder.out_dim + n_out] + [hidden] * depth
        self.layers = nn.ModuleList(nn.Linear(a, b) for a, b in zip(dims[:-1], dims[1:], strict=True))
        self.out = nn.Linear(hidden, n_out)
        self._actions = ActionQueue()

    def condition(self, obs: dict) -> tuple[Tensor, None]:
        """Raw obs -> (features (B, D), None), normalised and encoded as the teacher does."""
        out = self.encoder(encoder_inputs(obs, self.chunk.obs_keys, self.vector_keys, self.normalizer))
        return (out if isinstance(out, Tensor) else out.pooled), None

    def sample_chunk(
        self, cond: Tensor, cond_mask: Tensor | None = None, grad_steps: int = 0, *, init_noise: Tensor | None = None
    ) -> Tensor:
        """cond (B, D) -> normalised chunk (B, Tp, Da) from noise z = ``init_noise`` (default: fresh N(0, I))."""
        shape = (cond.shape[0], self.chunk.horizon, self.action_dim)
        z = init_noise if init_noise is not None else torch.randn(shape, device=cond.device)
        h = torch.cat([cond, z.flatten(1).to(cond.dtype)], dim=-1)
        for layer in self.layers:
            h = F.mish(F.layer_norm(layer(h), (layer.out_features,)))
        return self.out(h).view(shape)

    def raw_actions(self, chunk: Tensor) -> Tensor:
        """Normalised chunk (B, Tp, Da) -> raw actions clipped to the bounds (as ChunkPolicy.raw_actions)."""
        return raw_actions(self.normalizer, chunk)

    @torch.no_grad()
    def predict_chunk(self, obs: dict) -> Tensor:
        """Raw obs {key: (B, To, ...)} -> raw chunk (B, Tp, Da), clipped to the action bounds."""
        return self.raw_actions(self.sample_chunk(*self.condition(obs)).clamp(-1.0, 1.0))

    def reset(self, mask: np.ndarray | None = None) -> None:
        self._actions.reset(mask)

    @torch.inference_mode()
    def act(self, obs: dict) -> np.ndarray:
        """One env step {key: (B, ...)} or unbatched -> actions (B, Da) or (Da,), as ChunkPolicy.act."""
        device = next(self.parameters()).device
        return self._actions.step(obs, self.chunk, self.action_dim, device, self.predict_chunk)


class FQL(nn.Module):
    """Teacher (BC diffusion policy), one-step student, critic and target critic; batches as DiffusionQL's."""

    batches = "transitions"

    def __init__(self, teacher: DiffusionPolicy, critic: ChunkCritic, config: FQLConfig, engine: Stepper):
        super().__init__()
        if not isinstance(teacher, DiffusionPolicy):
            raise ValueError(f"fql distils a diffusion teacher; got policy {teacher.name!r} (--policy.type diffusion)")
        if teacher.config.ddim_eta != 0:
            raise ValueError(f"fql distils the teacher's deterministic DDIM map: use --policy.ddim-eta 0 (got "
                             f"{teacher.config.ddim_eta})")  # fmt: skip
        self.config, self.engine = config, engine
        self.actor, self.critic = teacher, critic
        self.student = OneStepPolicy(teacher, config.student_hidden, config.student_depth).to(engine.device)
        self.critic_target = frozen_copy(critic)
        actor_params = [p for m in (teacher, self.student) for p in m.parameters() if p.requires_grad]
        self.actor_opt = torch.optim.Adam(actor_params, lr=config.actor_lr)
        self.critic_opt = torch.optim.Adam([p for p in critic.parameters() if p.requires_grad], lr=config.critic_lr)
        self.n_updates = 0
        engine.prepare(self)

    @classmethod
    def build(cls, policy: DiffusionPolicy, config: FQLConfig, engine: Stepper, total_steps: int) -> FQL:
        policy.to(engine.device)
        return cls(policy, ChunkCritic(policy, config.critic).to(engine.device), config, engine)

    @property
    def policy(self) -> DiffusionPolicy:
        """The exported checkpoint: the BC teacher (the student acts through evaluation_policy)."""
        return self.actor

    @property
    def optimizers(self) -> dict[str, torch.optim.Optimizer]:
        return {"actor": self.actor_opt, "critic": self.critic_opt}

    def evaluation_policy(self) -> ChunkPolicy:
        """The one-step student (best-of-N over its samples when n_action_samples > 1)."""
        if self.config.n_action_samples == 1:
            return self.student
        return CriticRankedPolicy(self.student, self.critic_target, self.config.n_action_samples)

    def critic_loss(self, batch: dict) -> dict[str, Tensor]:
        with torch.no_grad():
            nxt = self.student.sample_chunk(*self.student.condition(batch["next_obs"])).clamp(-1.0, 1.0)
            next_q = self.critic_target(batch["next_obs"], self.critic.executed(nxt)).min(0).values
            y = chunk_td_target(batch["reward"], batch["done"], batch["valid"], batch["next_valid"], next_q,
                                self.critic.config.gamma)  # fmt: skip
        q = self.critic(batch["obs"], self.critic.executed_from_data(batch["action"])).float()
        loss, td_error = td_regression(q, y, batch.get("weights"))
        return {"loss": loss, "q": q.mean().detach(), "target": y.mean(), "td_error": td_error}

    def distillation(self, obs: dict, noise: Tensor) -> tuple[Tensor, Tensor]:
        """(student chunk (B, Tp, Da), mean squared distance to the teacher's chunk from the same noise)."""
        with torch.no_grad():
            target = self.actor.sample_chunk(*self.actor.condition(obs), init_noise=noise)
        chunk = self.student.sample_chunk(*self.student.condition(obs), init_noise=noise)
        return chunk, (chunk - target).pow(2).mean()

    def actor_loss(self, batch: dict) -> dict[str, Tensor]:
        """Teacher: BC. Student: -Q / mean|Q| of its chunk (inside the bounds) + alpha * distillation."""
        ab = batch.get("actor") or batch
        bc = batch.get("bc", ab)
        bc_loss = self.actor.loss(bc)["loss"] if bc is not None else ab["action"].new_zeros(())
        b = ab["action"].shape[0]
        noise = torch.randn(b, self.student.chunk.horizon, self.student.action_dim, device=ab["action"].device)
        chunk, distill = self.distillation(ab["obs"], noise)
        q = self.critic(ab["obs"], self.critic.executed(chunk.clamp(-1.0, 1.0))).float().mean(0)  # (B,)
        q_loss = -q.mean() / q.abs().mean().detach().clamp_min(1e-6)
        loss = bc_loss + q_loss + self.config.alpha * distill
        return {"loss": loss, "bc_loss": bc_loss.detach(), "q_loss": q_loss.detach(), "distill": distill.detach()}

    def update(self, batch: dict) -> dict[str, Any]:
        """One step: critic on the student's TD target, then teacher (BC) and student (Q + distillation), then the
        target critic."""
        logs = {f"critic_{k}": v for k, v in self.engine.backward(self.critic_loss, batch).items()}
        logs["td_error"] = logs.pop("critic_td_error").float().cpu().numpy()
        logs["critic_grad_norm"] = self.engine.step(self.critic_opt)["grad_norm"]
        with frozen(self.critic):
            logs |= {f"actor_{k}": v for k, v in self.engine.backward(self.actor_loss, batch).items()}
        logs["actor_grad_norm"] = self.engine.step(self.actor_opt)["grad_norm"]
        polyak_update(self.critic_target, self.critic, self.critic.config.tau)
        self.n_updates += 1
        return logs
