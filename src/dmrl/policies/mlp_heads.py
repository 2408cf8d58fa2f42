"""Residual MLP trunk shared by the Gaussian and VAE chunk policies (the seed's "MLP" baselines)."""

from __future__ import annotations

from torch import Tensor, nn


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

    def forward(self, x: Tensor) -> Tensor:
        h = self.inp(x)
        for block in self.blocks:
            h = h + block(h)
        return self.out(h)


def masked_mean(per_step: Tensor, mask: Tensor | None) -> Tensor:
    """Mean of per_step (B, Tp) over valid steps; mask (B, Tp) bool (False = padding) or None."""
    if mask is None:
        return per_step.mean()
    m = mask.to(per_step.dtype)
    return (per_step * m).sum() / m.sum().clamp_min(1.0)
