"""Low-dimensional observation encoder: normalised vectors over To frames -> one condition vector (B, D)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn


@dataclass
class LowDimEncoderConfig:
    """MLP over the concatenation of every low-dim key's To frames (Diffusion Policy's lowdim setting)."""

    width: int = 256
    """Hidden and output width D."""
    depth: int = 2
    """Hidden layers."""

    def __post_init__(self) -> None:
        if self.width < 8 or self.depth < 1:
            raise ValueError(f"encoder: width >= 8 and depth >= 1 required, got width={self.width} depth={self.depth}")


class LowDimEncoder(nn.Module):
    """obs {key: (B, To, dim_key)} (already normalised) -> cond (B, D).

    Keys are read in the fixed order given at construction; a missing key raises instead of being
    zero-filled (a silently absent modality would look like a real observation of zeros).
    """

    def __init__(self, obs_dims: dict[str, int], n_obs_steps: int, config: LowDimEncoderConfig | None = None):
        super().__init__()
        self.config = config or LowDimEncoderConfig()
        self.keys = tuple(obs_dims)
        self.n_obs_steps = n_obs_steps
        in_dim = n_obs_steps * sum(obs_dims.values())
        layers: list[nn.Module] = []
        width = self.config.width
        for i in range(self.config.depth):
            layers += [nn.Linear(in_dim if i == 0 else width, width), nn.LayerNorm(width), nn.Mish()]
        self.net = nn.Sequential(*layers)
        self.out_dim = width

    def forward(self, obs: dict[str, Tensor]) -> Tensor:
        missing = [k for k in self.keys if k not in obs]
        if missing:
            raise KeyError(f"encoder needs observation keys {list(self.keys)}; missing {missing}")
        x = torch.cat([obs[k].flatten(1) for k in self.keys], dim=-1)  # (B, To * sum(dims))
        return self.net(x)
