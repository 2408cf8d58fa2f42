"""Metric depth encoder: a small Vision Transformer of its own over depth in metres -> patch tokens.

    DepthEncoder   depth float (B, n_cams, H, W) metres  -> (B, n_cams * (H/p) * (W/p), D)

It reuses the RGB ViT's backbone and per-camera head (vit.py) with one input channel and its own weights:
depth statistics are nothing like RGB's, so the RGB weights would not transfer.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from dmrl.models.vit import CameraTokens, ViTBackbone, check_geometry, check_transformer


@dataclass
class DepthConfig:
    """Small ViT of its own for metric depth (not the RGB weights: depth statistics are nothing like RGB's)."""

    width: int = 128
    """Token width inside the backbone."""
    depth: int = 2
    """Transformer blocks."""
    n_heads: int = 4
    """Attention heads."""
    patch_size: int = 8
    """Square patch side in pixels; H and W must be multiples of it."""
    mlp_ratio: int = 4
    """MLP hidden width / width."""
    max_depth: float = 2.0
    """Metres; depth is clamped to [0, max_depth] (the MultiPath renderer's far plane reads 2.0)."""
    attn_fp32: bool = False
    """Force attention to fp32 with autocast off (see layers.Attention)."""

    def __post_init__(self) -> None:
        check_transformer("DepthConfig", self.width, self.depth, self.n_heads, self.patch_size, self.mlp_ratio)
        if not self.max_depth > 0:
            raise ValueError(f"DepthConfig.max_depth: got {self.max_depth}; allowed a positive number of metres")


class DepthEncoder(nn.Module):
    """Metric depth -> patch tokens: float (B, n_cams, H, W) metres -> (B, n_cams * (H/p) * (W/p), out_dim).

    NaN (no sensor return) reads as 0, +inf as max_depth; values are clamped to [0, max_depth] and mapped
    linearly to [-1, 1] before a small ViT of its own.
    """

    def __init__(
        self,
        config: DepthConfig | None = None,
        *,
        out_dim: int = 256,
        image_size: tuple[int, int] = (64, 64),
        n_cameras: int = 1,
    ) -> None:
        super().__init__()
        c = self.config = config or DepthConfig()
        check_geometry("DepthEncoder", out_dim, image_size, n_cameras, c.patch_size)
        self.image_size, self.n_cameras, self.out_dim = tuple(image_size), n_cameras, out_dim
        self.backbone = ViTBackbone(
            c.width, c.depth, c.n_heads, c.patch_size, self.image_size, 1, c.mlp_ratio, c.attn_fp32
        )
        self.head = CameraTokens(c.width, out_dim, n_cameras)
        self.n_tokens = n_cameras * self.backbone.grid[0] * self.backbone.grid[1]

    def forward(self, depth: Tensor) -> Tensor:
        expected = (self.n_cameras, *self.image_size)
        if depth.ndim != 4 or tuple(depth.shape[1:]) != expected:
            raise ValueError(f"DepthEncoder: got depth of shape {tuple(depth.shape)}; expected (B, {expected})")
        m = self.config.max_depth
        x = torch.nan_to_num(depth.float(), nan=0.0, posinf=m, neginf=0.0).clamp(0.0, m)
        x = x.reshape(-1, 1, *self.image_size) * (2.0 / m) - 1.0  # (B * n_cams, 1, H, W) in [-1, 1]
        return self.head(self.backbone(x))
