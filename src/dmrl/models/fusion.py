"""Multimodal fusion blocks: Perceiver latents (Jaegle et al. 2021) reading every modality's tokens, and the
concat-MLP baseline. The MultimodalEncoder that feeds them lives in models/multimodal.py.

    per-modality tokens (B, N, D) + mask (B, N) -> fusion -> tokens (B, K, D), pooled (B, D)

Masks are True = valid. A masked token never reaches the output, whatever its values (NaN and inf included):
fusion inputs are replaced by zeros with `where` before any arithmetic, because attention weights of exactly 0
still turn a NaN value into NaN (0 * NaN) and a NaN key into a NaN logit.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from dmrl.models.layers import Attention, Mlp, SelfAttentionBlock, pool_tokens, run_block


@dataclass
class PerceiverConfig:
    """K learned latents cross-attend once to all modality tokens, then self-attend n_layers times."""

    n_latents: int = 32
    """K: latent tokens, the fixed-size bottleneck handed to the policy."""
    n_heads: int = 8
    """Attention heads (the width D must be a multiple)."""
    n_layers: int = 2
    """Self-attention layers over the latents after the cross-attention."""
    mlp_ratio: int = 4
    """MLP hidden width / D."""
    attn_fp32: bool = False
    """Force attention to fp32 with autocast off (see layers.Attention); by default SDPA's fp32 softmax is used."""

    def __post_init__(self) -> None:
        for key in ("n_latents", "n_heads", "mlp_ratio"):
            if getattr(self, key) < 1:
                raise ValueError(f"PerceiverConfig.{key}: got {getattr(self, key)}; allowed a positive integer")
        if self.n_layers < 0:
            raise ValueError(f"PerceiverConfig.n_layers: got {self.n_layers}; allowed an integer >= 0")


class CrossAttentionBlock(nn.Module):
    """Latents read the tokens: x (B, K, D), mem (B, M, D), mask (B, M) bool -> (B, K, D), pre-LayerNorm."""

    def __init__(self, dim: int, n_heads: int, mlp_ratio: int, fp32: bool) -> None:
        super().__init__()
        self.norm_q = nn.LayerNorm(dim, eps=1e-6)
        self.norm_kv = nn.LayerNorm(dim, eps=1e-6)
        self.attn = Attention(dim, n_heads, fp32=fp32)
        self.norm2 = nn.LayerNorm(dim, eps=1e-6)
        self.mlp = Mlp(dim, mlp_ratio * dim)

    def forward(self, x: Tensor, mem: Tensor, mask: Tensor) -> Tensor:
        x = x + self.attn(self.norm_q(x), self.norm_kv(mem), mask)
        return x + self.mlp(self.norm2(x))


class PerceiverFusion(nn.Module):
    """tokens (B, M, D), mask (B, M) bool -> (latents (B, K, D), pooled (B, D) = mean over the K latents).

    A learned 'null' token is always appended as valid, so a sample whose every modality is masked still has
    one key to attend to (no softmax over nothing, no NaN); its output is then a learned constant.
    """

    def __init__(self, config: PerceiverConfig | None = None, *, dim: int = 256) -> None:
        super().__init__()
        c = self.config = config or PerceiverConfig()
        if dim % c.n_heads:
            raise ValueError(f"PerceiverFusion: dim {dim} is not divisible by n_heads={c.n_heads}")
        self.latents = nn.Parameter(torch.zeros(c.n_latents, dim))
        self.null = nn.Parameter(torch.zeros(1, 1, dim))
        nn.init.trunc_normal_(self.latents, std=0.02)
        nn.init.trunc_normal_(self.null, std=0.02)
        self.cross = CrossAttentionBlock(dim, c.n_heads, c.mlp_ratio, c.attn_fp32)
        self.blocks = nn.ModuleList(
            SelfAttentionBlock(dim, c.n_heads, c.mlp_ratio, c.attn_fp32) for _ in range(c.n_layers)
        )
        self.norm = nn.LayerNorm(dim, eps=1e-6)
        self.out_dim = dim
        self.grad_checkpointing = False  # set by the training engine

    def forward(self, tokens: Tensor, mask: Tensor, query: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """query (B, D) or None: added to every latent before the cross-attention, so what the latents read can
        depend on the sample (the instruction: "the red cup" makes them look for red)."""
        b = tokens.shape[0]
        tokens = torch.where(mask[..., None], tokens, torch.zeros((), dtype=tokens.dtype, device=tokens.device))
        mem = torch.cat([self.null.expand(b, -1, -1).to(tokens.dtype), tokens], dim=1)  # (B, 1 + M, D)
        mem_mask = torch.cat([torch.ones_like(mask[:, :1]), mask], dim=1)
        x = self.latents.expand(b, -1, -1)
        if query is not None:
            x = x + query[:, None].to(x.dtype)
        x = run_block(self.cross, x, mem, mem_mask, checkpoint=self.grad_checkpointing)
        for block in self.blocks:
            x = run_block(block, x, checkpoint=self.grad_checkpointing)
        x = self.norm(x)
        return x, x.mean(dim=1)


class ConcatFusion(nn.Module):
    """Naive-concatenation baseline (late fusion): mean-pool each modality, concatenate, MLP.

    parts [(tokens (B, N_i, D), mask (B, N_i) bool)] one per modality, in a fixed order -> (tokens (B, 1, D),
    pooled (B, D)). A modality with no valid token in a sample contributes a learned 'absent' vector and a
    presence flag of 0 instead of a pooled vector, so the MLP can tell missing from an observation of zeros.
    """

    def __init__(self, n_modalities: int, dim: int, hidden: int = 512) -> None:
        super().__init__()
        if n_modalities < 1 or dim < 1 or hidden < 1:
            raise ValueError(f"ConcatFusion: need positive sizes; got {n_modalities} modalities, {dim=}, {hidden=}")
        self.absent = nn.Parameter(torch.zeros(n_modalities, dim))
        nn.init.trunc_normal_(self.absent, std=0.02)
        self.net = nn.Sequential(
            nn.Linear(n_modalities * (dim + 1), hidden), nn.LayerNorm(hidden), nn.Mish(), nn.Linear(hidden, dim)
        )
        self.out_dim = dim

    def forward(self, parts: Sequence[tuple[Tensor, Tensor]]) -> tuple[Tensor, Tensor]:
        if len(parts) != self.absent.shape[0]:
            raise ValueError(f"ConcatFusion: got {len(parts)} modalities; built for {self.absent.shape[0]}")
        feats = []
        for i, (tokens, mask) in enumerate(parts):
            present = mask.any(dim=1, keepdim=True)  # (B, 1)
            pooled = torch.where(present, pool_tokens(tokens, mask), self.absent[i].to(tokens.dtype))
            feats += [pooled, present.to(tokens.dtype)]
        pooled = self.net(torch.cat(feats, dim=-1))
        return pooled[:, None], pooled
