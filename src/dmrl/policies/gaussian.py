"""Gaussian MLP chunk policy (behaviour cloning by maximum likelihood): the unimodal baseline."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from dmrl.data import Normalizer
from dmrl.policies.base import ChunkConfig, ChunkPolicy
from dmrl.policies.mlp_heads import ResidualMLP, check_one_step, masked_mean
from dmrl.policies.observations import ObsDim


@dataclass
class GaussianPolicyConfig:
    """Diagonal Gaussian over the whole normalised chunk; the mean is executed at evaluation."""

    hidden: int = 512
    """Width of the residual MLP."""
    depth: int = 3
    """Residual blocks."""
    min_log_std: float = -5.0
    """Lower clamp of the log standard deviation."""
    max_log_std: float = 1.0
    """Upper clamp of the log standard deviation."""

    def __post_init__(self) -> None:
        if self.hidden < 8 or self.depth < 1 or self.min_log_std >= self.max_log_std:
            raise ValueError("gaussian policy: need hidden >= 8, depth >= 1 and min_log_std < max_log_std")


class GaussianPolicy(ChunkPolicy):
    name = "gaussian"

    def __init__(
        self,
        chunk: ChunkConfig,
        config: GaussianPolicyConfig,
        obs_dims: Mapping[str, ObsDim],
        action_dim: int,
        normalizer: Normalizer | None = None,
        text_encoder: nn.Module | None = None,
    ):
        self.config = config
        super().__init__(chunk, obs_dims, action_dim, normalizer, text_encoder)
        self.flat = chunk.horizon * action_dim
        self.head = ResidualMLP(self.encoder.out_dim, 2 * self.flat, config.hidden, config.depth)

    def _dist(self, cond: Tensor) -> tuple[Tensor, Tensor]:
        out = self.head(cond)
        mean, log_std = out[:, : self.flat], out[:, self.flat :]
        log_std = log_std.clamp(self.config.min_log_std, self.config.max_log_std)
        shape = (-1, self.chunk.horizon, self.action_dim)
        return mean.reshape(shape), log_std.reshape(shape)

    def loss(self, batch: dict) -> dict[str, Tensor]:
        target = self.normalizer.normalize("actions", batch["action"].float())  # (B, Tp, Da)
        cond = self.encode(batch["obs"])
        mean, log_std = (v.float() for v in self._dist(cond))  # fp32 loss under autocast
        nll = 0.5 * ((target - mean) * torch.exp(-log_std)) ** 2 + log_std  # (B, Tp, Da), constant dropped
        loss = masked_mean(nll.mean(-1), batch.get("action_mask"))
        mse = masked_mean(((target - mean) ** 2).mean(-1), batch.get("action_mask"))
        return self._add_aux({"loss": loss, "mse": mse.detach()}, batch, cond)

    def sample_chunk(
        self,
        cond: Tensor,
        cond_mask: Tensor | None = None,
        grad_steps: int = 0,
        *,
        generator: torch.Generator | None = None,
    ) -> Tensor:
        """cond (B, D) -> the mean chunk (B, Tp, Da), normalised; one step, so ``grad_steps`` 1 carries gradients
        and 0 does not. cond_mask and generator are unused: the executed chunk is the mean, drawn from nothing."""
        check_one_step(grad_steps)
        with torch.set_grad_enabled(torch.is_grad_enabled() and grad_steps > 0):
            return self._dist(cond)[0]
