"""Residual MLP trunk shared by the Gaussian and VAE chunk policies: the one-shot (non-diffusion) baselines."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from dmrl.models.layers import run_block


class ResidualMLP(nn.Module):
    """(B, in_dim) -> (B, out_dim): Linear in, ``depth`` pre-norm residual blocks, Linear out."""

    def __init__(self, in_dim: int, out_dim: int, hidden: int, depth: int):
        super().__init__()
        self.inp = nn.Linear(in_dim, hidden)
        self.blocks = nn.ModuleList(
            nn.Sequential(nn.LayerNorm(hidden), nn.Linear(hidden, hidden), nn.Mish(), nn.Linear(hidden, hidden))
            for _ in range(depth)
        )
        self.out = nn.Sequential(nn.LayerNorm(hidden), nn.Linear(hidden, out_dim))
        self.grad_checkpointing = False  # set by the training engine

    def forward(self, x: Tensor) -> Tensor:
        h = self.inp(x)
        for block in self.blocks:
            h = h + run_block(block, h, checkpoint=self.grad_checkpointing)
        return self.out(h)


def masked_mean(per_step: Tensor, mask: Tensor | None) -> Tensor:
    """Sum of per_step (B, Tp) over valid steps / (B·Tp); mask (B, Tp) bool (False = padding) or None.

    The static denominator keeps the loss a plain mean over samples, so micro-batches and DDP shards average to
    exactly the full-batch loss (see dmrl.diffusion.losses.masked_mse)."""
    if mask is None:
        return per_step.mean()
    return torch.where(mask, per_step, torch.zeros((), dtype=per_step.dtype, device=per_step.device)).mean()


def check_one_step(grad_steps: int) -> None:
    """A one-shot head samples its chunk in one step: ``grad_steps`` 0 (no gradients) or 1 (gradients)."""
    if grad_steps not in (0, 1):
        raise ValueError(f"sample_chunk grad_steps: got {grad_steps}; allowed 0 or 1 (this policy samples in one step)")
