"""Forward noising process of DDPM (Ho et al. 2020): beta schedules, the ᾱ tables and q(x_t | x_0).

Two beta schedules, both bit-compatible with diffusers so a model trained here can be sampled there and back:

  linear  betas = torch.linspace(beta_start, beta_end, T) in float32 (diffusers "linear", the DDPM paper's).
  cosine  Nichol & Dhariwal 2021 ᾱ(s) = cos²((s + 0.008) / 1.008 · π/2), betas_t = min(1 - ᾱ((t+1)/T) / ᾱ(t/T),
          max_beta) (diffusers "squaredcos_cap_v2"). Gentler at both ends than linear; the usual choice for
          action chunks (Diffusion Policy uses it with T=100).

The tables that samplers and q_sample use (betas, alphas, ᾱ and its square roots) are computed exactly the way
diffusers does, in float32 and in the same operation order, so they agree bit for bit; float64 would not be more
correct (the float32 ᾱ table already carries its rounding) but would break parity. Only the posterior variance,
which nothing compares, is computed in float64 and rounded once.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields, replace

import torch
from torch import Tensor

SCHEDULE_KINDS = ("cosine", "linear")


@dataclass(frozen=True)
class NoiseSchedule:
    """Per-train-step tables, all float32 tensors of shape (T,), indexed by the train timestep t in [0, T).

    ᾱ_t = alphas_cumprod[t] = Π_{s<=t} (1 - betas[s]), and x_t = sqrt(ᾱ_t) x_0 + sqrt(1 - ᾱ_t) ε.
    Build it with `make_schedule`; move it with `.to(device)`.
    """

    kind: str
    betas: Tensor
    alphas: Tensor
    alphas_cumprod: Tensor
    #: ᾱ_{t-1}, with ᾱ_{-1} = 1 (the clean data).
    alphas_cumprod_prev: Tensor
    sqrt_alphas_cumprod: Tensor
    sqrt_one_minus_alphas_cumprod: Tensor
    #: Variance of q(x_{t-1} | x_t, x_0): β_t (1 - ᾱ_{t-1}) / (1 - ᾱ_t); 0 at t=0.
    posterior_variance: Tensor

    def __post_init__(self) -> None:
        if self.kind not in SCHEDULE_KINDS:
            raise ValueError(f"NoiseSchedule kind: got {self.kind!r}; allowed: {', '.join(SCHEDULE_KINDS)}")
        T = self.betas.shape[0] if self.betas.dim() == 1 else -1
        for f in fields(self):
            v = getattr(self, f.name)
            if isinstance(v, Tensor) and (v.shape != (T,) or v.dtype != torch.float32):
                raise ValueError(
                    f"NoiseSchedule.{f.name}: got {v.dtype} {tuple(v.shape)}; must be float32 of shape (T,) = ({T},)"
                )

    @property
    def num_train_steps(self) -> int:
        """T, the number of diffusion train steps."""
        return int(self.betas.shape[0])

    @property
    def device(self) -> torch.device:
        return self.betas.device

    def to(self, device: torch.device | str) -> NoiseSchedule:
        """A copy with every table on `device` (dtype stays float32)."""
        moved = {f.name: getattr(self, f.name).to(device) for f in fields(self) if f.name != "kind"}
        return replace(self, **moved)


def _cosine_betas(num_train_steps: int, max_beta: float) -> Tensor:
    # Same loop, in Python float64, as diffusers' betas_for_alpha_bar, so the float32 rounding is identical.
    def alpha_bar(s: float) -> float:
        return math.cos((s + 0.008) / 1.008 * math.pi / 2) ** 2

    T = num_train_steps
    betas = [min(1 - alpha_bar((i + 1) / T) / alpha_bar(i / T), max_beta) for i in range(T)]
    return torch.tensor(betas, dtype=torch.float32)


def make_schedule(
    kind: str = "cosine",
    num_train_steps: int = 100,
    beta_start: float = 1e-4,
    beta_end: float = 0.02,
    max_beta: float = 0.999,
) -> NoiseSchedule:
    """Build the (T,) tables for `kind` in {"cosine", "linear"} with T = `num_train_steps`.

    `beta_start`/`beta_end` are used by "linear" only; `max_beta` caps the cosine betas (diffusers' 0.999)
    so the last step does not divide by ᾱ ≈ 0.
    """
    if kind not in SCHEDULE_KINDS:
        raise ValueError(f"schedule kind: got {kind!r}; allowed: {', '.join(SCHEDULE_KINDS)}")
    if not isinstance(num_train_steps, int) or num_train_steps < 1:
        raise ValueError(f"num_train_steps: got {num_train_steps!r}; must be an int >= 1")
    if kind == "linear" and not 0.0 < beta_start <= beta_end < 1.0:
        raise ValueError(f"linear betas: got beta_start={beta_start}, beta_end={beta_end}; need 0 < start <= end < 1")
    if not 0.0 < max_beta < 1.0:
        raise ValueError(f"max_beta: got {max_beta}; must be in (0, 1)")

    if kind == "linear":
        betas = torch.linspace(beta_start, beta_end, num_train_steps, dtype=torch.float32)
    else:
        betas = _cosine_betas(num_train_steps, max_beta)
    alphas = 1.0 - betas
    # float32 cumprod on purpose: it is what diffusers does, and the ᾱ table is the contract between the two.
    alphas_cumprod = torch.cumprod(alphas, dim=0)

    ab = alphas_cumprod.double()
    ab_prev = torch.cat([ab.new_ones(1), ab[:-1]])
    post_var = betas.double() * (1.0 - ab_prev) / (1.0 - ab)  # float64: not a parity table, so be exact
    return NoiseSchedule(
        kind=kind,
        betas=betas,
        alphas=alphas,
        alphas_cumprod=alphas_cumprod,
        alphas_cumprod_prev=ab_prev.float(),
        # float32 `** 0.5` exactly as diffusers' add_noise / step: near t = T-1 of the cosine schedule x0_hat
        # divides by sqrt(ᾱ) ~ 1e-3, so even a one-ulp difference here moves samples by ~1e-5.
        sqrt_alphas_cumprod=alphas_cumprod**0.5,
        sqrt_one_minus_alphas_cumprod=(1.0 - alphas_cumprod) ** 0.5,
        posterior_variance=post_var.float(),
    )


def extract(table: Tensor, t: Tensor, ndim: int) -> Tensor:
    """Gather table[t] for t (B,) long and shape it (B, 1, ..., 1) with `ndim` dims to broadcast over a sample."""
    return table[t].reshape(t.shape[0], *([1] * (ndim - 1)))


def q_sample(schedule: NoiseSchedule, x0: Tensor, t: Tensor, noise: Tensor) -> Tensor:
    """Draw x_t ~ q(x_t | x_0) = sqrt(ᾱ_t) x_0 + sqrt(1 - ᾱ_t) ε.

    x0 (B, Tp, Da) (any trailing shape works), t (B,) long in [0, T), noise like x0 -> x_t like x0.
    The schedule must be on x0's device (`schedule.to(device)`).
    """
    if t.dim() != 1 or t.shape[0] != x0.shape[0]:
        raise ValueError(f"q_sample t: got shape {tuple(t.shape)}; must be (B,) = ({x0.shape[0]},)")
    if noise.shape != x0.shape:
        raise ValueError(f"q_sample noise: got shape {tuple(noise.shape)}; must match x0 {tuple(x0.shape)}")
    s0 = extract(schedule.sqrt_alphas_cumprod, t, x0.dim()).to(x0.dtype)
    s1 = extract(schedule.sqrt_one_minus_alphas_cumprod, t, x0.dim()).to(x0.dtype)
    return s0 * x0 + s1 * noise
