"""Noise-prediction networks of a diffusion policy (Chi et al. 2023): residual MLP, FiLM U-Net 1D, transformer.

Every denoiser maps a noisy action chunk, its diffusion step and an observation condition to a prediction:

    forward(x (B, Tp, Da), t (B,) long or float [or a scalar], cond (B, D) or (B, K, D), cond_mask (B, K) bool | None)
        -> (B, Tp, Da * out_mult)

out_mult is 1 for a single prediction (epsilon, x0 or v) and 2 for the "hybrid" type: the last dim holds the
epsilon head in [..., :Da] and the x0 head in [..., Da:]. t is on the training scale (0..T-1); floats are fine.
A vector condition is accepted by all three. Token conditions are attended to by the transformer. The MLP and
the U-Net mean-pool them over the valid tokens (cond_mask True = valid) into one (B, D) vector first.
Each output layer starts at zero, so an untrained denoiser predicts 0 (about the mean of the epsilon and x0
targets in normalised action space). This is a stable start. Only the head moves on the first optimiser step;
once its weights are non-zero, every layer gets gradients.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import ClassVar, Protocol

import torch
from torch import Tensor, nn

from dmrl.models.layers import (
    Conv1dBlock,
    FiLMResBlock1d,
    TimestepEmbedding,
    TransformerBlock,
    pool_tokens,
    run_block,
)


@dataclass(kw_only=True)
class DenoiserConfig:
    """Fields every denoiser shares."""

    action_dim: int
    """Da: action dimensions per step."""
    horizon: int = 16
    """Tp: predicted actions per chunk."""
    cond_dim: int = 256
    """D: width of the condition vector or tokens."""
    out_mult: int = 1
    """1 for epsilon/x0/v prediction, 2 for hybrid (epsilon then x0 on the last dim)."""
    time_dim: int = 64
    """Width of the sinusoidal diffusion-step features (even, >= 4)."""

    def __post_init__(self) -> None:
        name = type(self).__name__
        for key in ("action_dim", "horizon", "cond_dim"):
            value = getattr(self, key)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name}.{key}: got {value!r}; allowed a positive integer")
        if self.out_mult not in (1, 2):
            raise ValueError(f"{name}.out_mult: got {self.out_mult!r}; allowed 1 (epsilon, x0 or v) or 2 (hybrid)")
        if not isinstance(self.time_dim, int) or self.time_dim < 4 or self.time_dim % 2:
            raise ValueError(f"{name}.time_dim: got {self.time_dim!r}; allowed an even integer >= 4")


class Denoiser(Protocol):
    """What a diffusion policy needs from a noise-prediction network."""

    config: DenoiserConfig

    def __call__(self, x: Tensor, t: Tensor | float, cond: Tensor, cond_mask: Tensor | None = None) -> Tensor: ...


def _check_inputs(cfg: DenoiserConfig, x: Tensor, t: Tensor | float, cond: Tensor, cond_mask: Tensor | None) -> Tensor:
    """Raise a one-line error on a shape the config does not allow; return t as (B,)."""
    b = x.shape[0]
    if x.ndim != 3 or tuple(x.shape[1:]) != (cfg.horizon, cfg.action_dim):
        raise ValueError(f"x: got shape {tuple(x.shape)}; expected (B, {cfg.horizon}, {cfg.action_dim})")
    if not isinstance(t, Tensor):
        t = torch.full((b,), t, device=x.device)
    elif t.ndim == 0:
        t = t.expand(b)  # one step for the whole batch, as a sampler loop passes it
    elif tuple(t.shape) != (b,):
        raise ValueError(f"t: got shape {tuple(t.shape)}; expected ({b},) or a scalar")
    if cond.ndim not in (2, 3) or cond.shape[0] != b or cond.shape[-1] != cfg.cond_dim:
        raise ValueError(
            f"cond: got shape {tuple(cond.shape)}; expected ({b}, {cfg.cond_dim}) or ({b}, K, {cfg.cond_dim})"
        )
    if cond_mask is not None and (cond.ndim != 3 or cond_mask.dtype != torch.bool or cond_mask.shape != cond.shape[:2]):
        raise ValueError(
            f"cond_mask: got {cond_mask.dtype} {tuple(cond_mask.shape)} for cond {tuple(cond.shape)}; "
            "expected bool (B, K) with token conditions"
        )
    return t


def _zero_(layer: nn.Module) -> None:
    nn.init.zeros_(layer.weight)
    nn.init.zeros_(layer.bias)


# --- MLP ------------------------------------------------------------------------------------------------------


@dataclass(kw_only=True)
class MLPDenoiserConfig(DenoiserConfig):
    """Residual MLP over the flattened chunk."""

    hidden_dim: int = 256
    """Width of the residual stream."""
    n_blocks: int = 2
    """Residual blocks (LayerNorm -> Linear -> Mish -> Linear)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        for key in ("hidden_dim", "n_blocks"):
            value = getattr(self, key)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"MLPDenoiserConfig.{key}: got {value!r}; allowed a positive integer")


class _ResidualMLPBlock(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.LayerNorm(dim), nn.Linear(dim, dim), nn.Mish(), nn.Linear(dim, dim))

    def forward(self, h: Tensor) -> Tensor:
        return h + self.net(h)


class MLPDenoiser(nn.Module):
    """Minimal actor (Diffusion-QL style): [flat chunk, cond, time emb] -> residual MLP -> flat prediction.

    The whole chunk is one input vector, so the network sees all Tp steps at once but has no notion of time
    order. It is the cheapest option, for fast CPU sampling.
    """

    config_cls: ClassVar[type[DenoiserConfig]] = MLPDenoiserConfig

    def __init__(self, config: MLPDenoiserConfig) -> None:
        super().__init__()
        self.config = config
        c = config
        self.time_emb = TimestepEmbedding(c.time_dim, c.time_dim)
        self.inp = nn.Linear(c.horizon * c.action_dim + c.cond_dim + c.time_dim, c.hidden_dim)
        self.blocks = nn.Sequential(*[_ResidualMLPBlock(c.hidden_dim) for _ in range(c.n_blocks)])
        self.norm = nn.LayerNorm(c.hidden_dim)
        self.head = nn.Linear(c.hidden_dim, c.horizon * c.action_dim * c.out_mult)
        _zero_(self.head)
        self.grad_checkpointing = False  # set by the training engine

    def forward(self, x: Tensor, t: Tensor | float, cond: Tensor, cond_mask: Tensor | None = None) -> Tensor:
        """x (B, Tp, Da), t (B,), cond (B, D) or (B, K, D) [mean-pooled] -> (B, Tp, Da * out_mult)."""
        t = _check_inputs(self.config, x, t, cond, cond_mask)
        h = torch.cat([x.flatten(1), pool_tokens(cond, cond_mask), self.time_emb(t)], dim=-1)
        h = self.inp(h)
        for block in self.blocks:
            h = run_block(block, h, checkpoint=self.grad_checkpointing)
        h = self.head(self.norm(h))
        return h.view(x.shape[0], self.config.horizon, -1)


# --- U-Net 1D -------------------------------------------------------------------------------------------------


@dataclass(kw_only=True)
class UNet1DDenoiserConfig(DenoiserConfig):
    """Diffusion Policy's ConditionalUnet1D, sized for CPU by default."""

    down_dims: tuple[int, ...] = (64, 128, 256)
    """Channels per resolution level; Tp is halved between consecutive levels."""
    kernel_size: int = 5
    """Conv1d kernel along Tp (odd, so 'same' padding keeps the length)."""
    n_groups: int = 8
    """GroupNorm groups; every entry of down_dims must be divisible by it."""

    def __post_init__(self) -> None:
        super().__post_init__()
        self.down_dims = tuple(self.down_dims)  # YAML and tyro may hand over a list
        if not self.down_dims or any(not isinstance(d, int) or d < 1 or d % self.n_groups for d in self.down_dims):
            raise ValueError(
                f"UNet1DDenoiserConfig.down_dims: got {self.down_dims!r}; "
                f"allowed a non-empty tuple of positive multiples of n_groups={self.n_groups}"
            )
        if self.kernel_size < 1 or self.kernel_size % 2 == 0:
            raise ValueError(f"UNet1DDenoiserConfig.kernel_size: got {self.kernel_size!r}; allowed an odd integer >= 1")
        factor = 2 ** (len(self.down_dims) - 1)
        if self.horizon % factor:
            raise ValueError(
                f"UNet1DDenoiserConfig.horizon: got {self.horizon} with {len(self.down_dims)} levels; "
                f"allowed a multiple of 2**(len(down_dims)-1) = {factor}"
            )


class UNet1DDenoiser(nn.Module):
    """Conv1d U-Net over the Tp axis with FiLM from [time emb, cond] in every residual block (Chi et al. 2023).

    Each level has two FiLM residual blocks. A stride-2 conv halves Tp between levels and a stride-2 transposed
    conv doubles it on the way up, so Tp must be divisible by 2**(len(down_dims)-1). That gives 16 -> 8 -> 4
    at the defaults, and 8 -> 4 -> 2 for Tp = 8.
    """

    config_cls: ClassVar[type[DenoiserConfig]] = UNet1DDenoiserConfig

    def __init__(self, config: UNet1DDenoiserConfig) -> None:
        super().__init__()
        self.config = config
        c = config
        film_dim = c.time_dim + c.cond_dim
        dims = c.down_dims

        def res(c_in: int, c_out: int) -> FiLMResBlock1d:
            return FiLMResBlock1d(c_in, c_out, film_dim, c.kernel_size, c.n_groups)

        self.time_emb = TimestepEmbedding(c.time_dim, c.time_dim)
        self.down = nn.ModuleList(
            nn.ModuleList([res(c_in, c_out), res(c_out, c_out)])
            for c_in, c_out in zip((c.action_dim, *dims[:-1]), dims, strict=True)
        )
        self.downsample = nn.ModuleList(nn.Conv1d(d, d, 3, stride=2, padding=1) for d in dims[:-1])
        self.mid = nn.ModuleList([res(dims[-1], dims[-1]), res(dims[-1], dims[-1])])
        # Up level k (deepest first) takes [x, skip_k] (2 * dims[k] channels) down to dims[k-1], then doubles Tp.
        self.up = nn.ModuleList(
            nn.ModuleList([res(2 * dims[k], dims[k - 1]), res(dims[k - 1], dims[k - 1])])
            for k in range(len(dims) - 1, 0, -1)
        )
        self.upsample = nn.ModuleList(nn.ConvTranspose1d(d, d, 4, stride=2, padding=1) for d in reversed(dims[:-1]))
        self.final = Conv1dBlock(dims[0], dims[0], c.kernel_size, c.n_groups)
        self.head = nn.Conv1d(dims[0], c.action_dim * c.out_mult, 1)
        _zero_(self.head)
        self.grad_checkpointing = False  # set by the training engine

    def forward(self, x: Tensor, t: Tensor | float, cond: Tensor, cond_mask: Tensor | None = None) -> Tensor:
        """x (B, Tp, Da), t (B,), cond (B, D) or (B, K, D) [mean-pooled] -> (B, Tp, Da * out_mult)."""
        t = _check_inputs(self.config, x, t, cond, cond_mask)
        film = torch.cat([self.time_emb(t), pool_tokens(cond, cond_mask)], dim=-1)
        ck = self.grad_checkpointing

        def res(block: nn.Module, h: Tensor) -> Tensor:
            return run_block(block, h, film, checkpoint=ck)

        h = x.transpose(1, 2)  # (B, Da, Tp): convolve along the chunk's time axis
        skips = []
        for i, (block1, block2) in enumerate(self.down):
            h = res(block2, res(block1, h))
            skips.append(h)
            if i < len(self.downsample):
                h = self.downsample[i](h)
        for block in self.mid:
            h = res(block, h)
        # As in ConditionalUnet1D, the full-resolution skip (skips[0]) is not concatenated: level 0 reaches
        # the head through the down/up path, and the deeper skips carry the fine detail back.
        for (block1, block2), upsample, skip in zip(self.up, self.upsample, reversed(skips[1:]), strict=True):
            h = torch.cat([h, skip], dim=1)
            h = upsample(res(block2, res(block1, h)))
        return self.head(self.final(h)).transpose(1, 2)


# --- Transformer ----------------------------------------------------------------------------------------------


@dataclass(kw_only=True)
class TransformerDenoiserConfig(DenoiserConfig):
    """Action-token transformer with cross-attention to condition tokens."""

    d_model: int = 128
    """Token width inside the transformer."""
    n_layers: int = 4
    """Blocks of self-attention + cross-attention + MLP."""
    n_heads: int = 4
    """Attention heads; d_model must be divisible by it."""
    mlp_ratio: int = 4
    """MLP hidden width as a multiple of d_model."""
    dropout: float = 0.0
    """Dropout on attention weights and residual branches (training only)."""
    attn_fp32: bool = False
    """Force attention to fp32 with autocast off (see layers.Attention); by default SDPA's fp32 softmax is used."""

    def __post_init__(self) -> None:
        super().__post_init__()
        for key in ("d_model", "n_layers", "n_heads", "mlp_ratio"):
            value = getattr(self, key)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"TransformerDenoiserConfig.{key}: got {value!r}; allowed a positive integer")
        if self.d_model % self.n_heads:
            raise ValueError(
                f"TransformerDenoiserConfig.d_model: got {self.d_model} with n_heads={self.n_heads}; "
                "allowed a multiple of n_heads"
            )
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"TransformerDenoiserConfig.dropout: got {self.dropout!r}; allowed 0 <= dropout < 1")


class TransformerDenoiser(nn.Module):
    """One token per chunk step (learned positions) plus a time token, pre-LN blocks, all attention via SDPA.

    Self-attention runs over [time token, Tp action tokens]. Cross-attention goes to [time token, K condition
    tokens], with a vector condition taken as K = 1. The time token sits in the cross-attention memory as well
    so that no row is ever fully masked: SDPA returns NaN for a query with no valid key. Masked condition tokens
    are replaced by zeros before projection and excluded from attention, so any value there, even NaN, leaves
    the output unchanged.
    """

    config_cls: ClassVar[type[DenoiserConfig]] = TransformerDenoiserConfig

    def __init__(self, config: TransformerDenoiserConfig) -> None:
        super().__init__()
        self.config = config
        c = config
        self.time_emb = TimestepEmbedding(c.time_dim, c.d_model)
        self.action_in = nn.Linear(c.action_dim, c.d_model)
        self.pos = nn.Parameter(torch.randn(1, c.horizon + 1, c.d_model) * 0.02)
        self.cond_in = nn.Linear(c.cond_dim, c.d_model)
        self.cond_norm = nn.LayerNorm(c.d_model)
        self.blocks = nn.ModuleList(
            TransformerBlock(c.d_model, c.n_heads, c.mlp_ratio, c.dropout, c.attn_fp32) for _ in range(c.n_layers)
        )
        self.norm = nn.LayerNorm(c.d_model)
        self.head = nn.Linear(c.d_model, c.action_dim * c.out_mult)
        _zero_(self.head)
        self.grad_checkpointing = False  # set by the training engine

    def forward(self, x: Tensor, t: Tensor | float, cond: Tensor, cond_mask: Tensor | None = None) -> Tensor:
        """x (B, Tp, Da), t (B,), cond (B, D) or (B, K, D), cond_mask (B, K) True = valid -> (B, Tp, Da * out_mult)."""
        t = _check_inputs(self.config, x, t, cond, cond_mask)
        time_tok = self.time_emb(t)[:, None, :]  # (B, 1, C)
        h = torch.cat([time_tok, self.action_in(x)], dim=1) + self.pos  # (B, 1 + Tp, C)
        if cond.ndim == 2:
            cond = cond[:, None, :]
        mem_mask = None
        if cond_mask is not None:
            cond = torch.where(cond_mask[..., None], cond, torch.zeros((), dtype=cond.dtype, device=cond.device))
            mem_mask = torch.cat([torch.ones_like(cond_mask[:, :1]), cond_mask], dim=1)
        mem = self.cond_norm(torch.cat([time_tok, self.cond_in(cond)], dim=1))  # (B, 1 + K, C)
        for block in self.blocks:
            h = run_block(block, h, mem, mem_mask, checkpoint=self.grad_checkpointing)
        return self.head(self.norm(h[:, 1:]))


# --- Registry -------------------------------------------------------------------------------------------------

DENOISERS: dict[str, type[nn.Module]] = {
    "mlp": MLPDenoiser,
    "unet": UNet1DDenoiser,
    "transformer": TransformerDenoiser,
}


def build_denoiser(name: str, **cfg: object) -> nn.Module:
    """DENOISERS[name](its config class(**cfg)); unknown names or config keys raise a one-line ValueError."""
    if name not in DENOISERS:
        raise ValueError(f"unknown denoiser {name!r}; known: {', '.join(DENOISERS)}")
    cls = DENOISERS[name]
    config_cls = cls.config_cls
    allowed = [f.name for f in fields(config_cls)]
    unknown = sorted(set(cfg) - set(allowed))
    if unknown:
        raise ValueError(f"{config_cls.__name__}: unknown keys {unknown}; allowed: {', '.join(allowed)}")
    return cls(config_cls(**cfg))
