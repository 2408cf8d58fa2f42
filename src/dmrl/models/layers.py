"""Building blocks shared by the denoisers: sinusoidal time embedding, token pooling, FiLM conv blocks, SDPA attention.

Shapes use the DESIGN.md vocabulary: B batch, Tp predicted actions, K condition tokens, D condition width,
C channels / model width, N query tokens, M key tokens.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
import torch.utils.checkpoint
from torch import Tensor, nn


class SinusoidalEmbedding(nn.Module):
    """Transformer-style sin/cos features of a scalar: t (B,) long or float -> (B, dim), [sin | cos]."""

    def __init__(self, dim: int, max_period: float = 10000.0) -> None:
        super().__init__()
        if dim < 4 or dim % 2:
            raise ValueError(f"SinusoidalEmbedding.dim: got {dim}; allowed an even integer >= 4")
        half = dim // 2
        freqs = torch.exp(-math.log(max_period) * torch.arange(half, dtype=torch.float32) / (half - 1))
        # cos(a) = sin(a + pi/2): one fused multiply-add and one sin instead of mul, sin, cos and cat. At B = 1
        # each op costs microseconds of dispatch, a visible share of a sampler step.
        phase = torch.cat([torch.zeros(half), torch.full((half,), math.pi / 2)])
        # Not persistent: both are pure functions of `dim`, so checkpoints stay free of derived tensors.
        self.register_buffer("freqs", freqs.repeat(2), persistent=False)
        self.register_buffer("phase", phase, persistent=False)

    def forward(self, t: Tensor) -> Tensor:
        return torch.addcmul(self.phase, t.to(self.freqs.dtype)[:, None], self.freqs).sin()


class TimestepEmbedding(nn.Module):
    """Diffusion-step embedding (DDPM, Diffusion Policy): sinusoid -> Linear -> Mish -> Linear; (B,) -> (B, out_dim)."""

    def __init__(self, freq_dim: int, out_dim: int, hidden_mult: int = 4) -> None:
        super().__init__()
        self.sinusoid = SinusoidalEmbedding(freq_dim)
        self.mlp = nn.Sequential(
            nn.Linear(freq_dim, freq_dim * hidden_mult), nn.Mish(), nn.Linear(freq_dim * hidden_mult, out_dim)
        )

    def forward(self, t: Tensor) -> Tensor:
        return self.mlp(self.sinusoid(t))


def run_block(block: nn.Module, *args: Tensor | None, checkpoint: bool = False) -> Tensor:
    """``block(*args)``; with ``checkpoint`` (and autograd on) its activations are recomputed in backward instead
    of stored: less memory for one more forward per block (the engine's ``grad_checkpointing`` switch)."""
    if checkpoint and torch.is_grad_enabled():
        return torch.utils.checkpoint.checkpoint(block, *args, use_reentrant=False)
    return block(*args)


def pool_tokens(cond: Tensor, mask: Tensor | None = None) -> Tensor:
    """Condition as one vector: (B, D) passes through; (B, K, D) -> mean over the valid tokens -> (B, D).

    mask (B, K) bool, True = valid. Masked tokens are replaced by zeros with `where` rather than multiplied by 0,
    so even inf/NaN padding cannot leak into the mean. A sample with no valid token pools to zeros.
    """
    if cond.ndim == 2:
        return cond
    if mask is None:
        return cond.mean(dim=1)
    valid = mask[..., None]
    total = torch.where(valid, cond, torch.zeros((), dtype=cond.dtype, device=cond.device)).sum(dim=1)
    return total / valid.sum(dim=1).clamp_min(1).to(cond.dtype)


class Conv1dBlock(nn.Module):
    """Conv1d -> GroupNorm -> Mish over the time axis: (B, C_in, Tp) -> (B, C_out, Tp)."""

    def __init__(self, c_in: int, c_out: int, kernel_size: int, n_groups: int) -> None:
        super().__init__()
        self.conv = nn.Conv1d(c_in, c_out, kernel_size, padding=kernel_size // 2)
        self.norm = nn.GroupNorm(n_groups, c_out)
        self.act = nn.Mish()

    def forward(self, x: Tensor) -> Tensor:
        return self.act(self.norm(self.conv(x)))


class FiLMResBlock1d(nn.Module):
    """Diffusion Policy's ConditionalResidualBlock1D with FiLM (Perez et al. 2018) between its two conv blocks.

    x (B, C_in, Tp), c (B, cond_dim) -> (B, C_out, Tp). The scale is applied as (1 + scale) so an untrained
    conditioning path starts near the identity instead of multiplying features by a random number around 0.
    """

    def __init__(self, c_in: int, c_out: int, cond_dim: int, kernel_size: int, n_groups: int) -> None:
        super().__init__()
        self.block1 = Conv1dBlock(c_in, c_out, kernel_size, n_groups)
        self.block2 = Conv1dBlock(c_out, c_out, kernel_size, n_groups)
        self.film = nn.Sequential(nn.Mish(), nn.Linear(cond_dim, 2 * c_out))
        self.residual = nn.Conv1d(c_in, c_out, 1) if c_in != c_out else nn.Identity()

    def forward(self, x: Tensor, c: Tensor) -> Tensor:
        scale, bias = self.film(c)[..., None].chunk(2, dim=1)  # each (B, C_out, 1)
        h = self.block1(x) * (1.0 + scale) + bias
        return self.block2(h) + self.residual(x)


class Attention(nn.Module):
    """Multi-head attention through F.scaled_dot_product_attention (plain matmul shapes, exportable).

    x (B, N, C) queries; mem (B, M, C) keys/values or None for self-attention; mask (B, M) bool, True = attend.
    Returns (B, N, C).

    Precision: by default the fp32 softmax under autocast comes from SDPA itself. The fused kernels (flash,
    memory-efficient, cuDNN, the CPU flash kernel) accumulate logits and softmax in fp32 for fp16/bf16 inputs,
    and the math fallback upcasts to fp32 unless `torch.backends.cuda.allow_fp16_bf16_reduction_math_sdp(True)`.
    This keeps the fast kernels usable. `fp32=True` forces the whole attention to fp32 with autocast off,
    for backends whose kernels do not promise this. It costs memory and loses the half-precision kernels.
    """

    def __init__(self, dim: int, n_heads: int, dropout: float = 0.0, fp32: bool = False) -> None:
        super().__init__()
        if dim % n_heads:
            raise ValueError(f"Attention: width {dim} is not divisible by n_heads={n_heads}")
        self.n_heads = n_heads
        self.dropout = dropout
        self.fp32 = fp32
        self.q = nn.Linear(dim, dim)
        self.kv = nn.Linear(dim, 2 * dim)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x: Tensor, mem: Tensor | None = None, mask: Tensor | None = None) -> Tensor:
        mem = x if mem is None else mem
        b, n, c = x.shape
        m, h = mem.shape[1], self.n_heads
        q = self.q(x).view(b, n, h, c // h).transpose(1, 2)  # (B, H, N, C/H)
        k, v = self.kv(mem).view(b, m, 2, h, c // h).permute(2, 0, 3, 1, 4).unbind(0)  # each (B, H, M, C/H)
        attn_mask = None if mask is None else mask[:, None, None, :]  # broadcast over heads and queries
        p = self.dropout if self.training else 0.0
        if self.fp32:
            with torch.autocast(device_type=x.device.type, enabled=False):
                y = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), attn_mask=attn_mask, dropout_p=p)
            y = y.to(q.dtype)
        else:
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, dropout_p=p)
        return self.proj(y.transpose(1, 2).reshape(b, n, c))


class TransformerBlock(nn.Module):
    """Pre-LayerNorm decoder block: self-attention, cross-attention to condition tokens, GELU MLP.

    x (B, N, C), mem (B, M, C), mem_mask (B, M) bool (True = valid) -> (B, N, C).
    """

    def __init__(self, dim: int, n_heads: int, mlp_ratio: int, dropout: float, fp32: bool) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(dim)
        self.self_attn = Attention(dim, n_heads, dropout, fp32)
        self.norm2 = nn.LayerNorm(dim)
        self.cross_attn = Attention(dim, n_heads, dropout, fp32)
        self.norm3 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, mlp_ratio * dim), nn.GELU(), nn.Linear(mlp_ratio * dim, dim))
        self.drop = nn.Dropout(dropout)

    def forward(self, x: Tensor, mem: Tensor, mem_mask: Tensor | None) -> Tensor:
        x = x + self.drop(self.self_attn(self.norm1(x)))
        x = x + self.drop(self.cross_attn(self.norm2(x), mem, mem_mask))
        return x + self.drop(self.mlp(self.norm3(x)))


class Mlp(nn.Module):
    """Linear -> GELU -> Linear, (..., C) -> (..., C); named fc1/fc2 like timm so ViT checkpoints map by name."""

    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(hidden, dim)

    def forward(self, x: Tensor) -> Tensor:
        return self.fc2(self.act(self.fc1(x)))


class SelfAttentionBlock(nn.Module):
    """Pre-LayerNorm encoder block (ViT, Perceiver latent layers): x + attn(norm1(x)), then x + mlp(norm2(x)).

    x (B, N, C), mask (B, N) bool (True = valid) or None -> (B, N, C). LayerNorm eps 1e-6 and the parameter
    names (norm1, attn.q/kv/proj, norm2, mlp.fc1/fc2) follow timm's ViT, so pretrained blocks load one to one.
    """

    def __init__(self, dim: int, n_heads: int, mlp_ratio: int = 4, fp32: bool = False) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(dim, eps=1e-6)
        self.attn = Attention(dim, n_heads, fp32=fp32)
        self.norm2 = nn.LayerNorm(dim, eps=1e-6)
        self.mlp = Mlp(dim, mlp_ratio * dim)

    def forward(self, x: Tensor, mask: Tensor | None = None) -> Tensor:
        x = x + self.attn(self.norm1(x), mask=mask)
        return x + self.mlp(self.norm2(x))
