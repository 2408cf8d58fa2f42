"""Reverse-process samplers: ancestral DDPM (Ho et al. 2020) and DDIM (Song et al. 2021), as static tensor programs.

Both samplers reduce every step to one update, with all coefficients precomputed at construction as (S,) tensors:

    x0_hat, eps_hat = split_prediction(model_out)                  (see prediction.py)
    x_prev = c_x0[i] · clip(x0_hat) + c_x0_raw[i] · x0_hat + c_eps[i] · eps_hat + sigma[i] · z

  DDIM:  c_x0 = sqrt(ᾱ_prev), c_x0_raw = 0, c_eps = sqrt(1 - ᾱ_prev - sigma²), sigma = eta · sqrt(σ²_DDIM).
  DDPM:  the posterior mean c0 · clip(x0_hat) + ct · x_t, with x_t written as sqrt(ᾱ_t) x0_hat + sqrt(1-ᾱ_t) eps_hat
         (an identity for epsilon/sample/v outputs): c_x0 = c0, c_x0_raw = ct · sqrt(ᾱ_t), c_eps = ct · sqrt(1-ᾱ_t).
         Written this way the hybrid ε head feeds the noise term instead of being ignored, and diffusers'
         DDPMScheduler (which clips x0 but keeps the raw x_t) is reproduced exactly for the other types.

The loop body indexes those tables with the Python loop counter only: static shapes, no `.item()`, no branching
on tensor values, noise from an explicit generator or passed in — so the loop can be traced, exported to ONNX /
Ascend ATC graphs, or unrolled with gradients flowing into the denoiser (Diffusion-QL).

Coefficients are computed once, on the CPU, in float32 with diffusers' exact operation order, then moved to the
schedule's device. Float64 would not be more right: several of them cancel catastrophically (1 - ᾱ_t/ᾱ_prev at
small t, 1 - ᾱ_prev - σ² next to t = T-1 of the cosine schedule) and the float32 ᾱ table already carries that
rounding, so float64 only trades diffusers' rounding for a different one and breaks bit-level parity (~1e-4).

Shapes: x_t, x_prev (B, Tp, Da); model_out (B, Tp, Da) or (B, Tp, 2·Da) for "hybrid"; t (B,) long; tables (S,).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Self

import torch
from torch import Tensor

from dmrl.diffusion.prediction import check_pred_type, split_with_coefficients
from dmrl.diffusion.schedule import NoiseSchedule

DenoiseFn = Callable[[Tensor, Tensor], Tensor]
TIMESTEP_SPACINGS = ("leading", "trailing")
VARIANCE_TYPES = ("fixed_small", "fixed_large")


def _same_device(a: torch.device, b: torch.device) -> bool:
    # "cuda" and "cuda:0" name the same device for our purposes.
    return a.type == b.type and (a.index is None or b.index is None or a.index == b.index)


def _randn(shape: Sequence[int], generator: torch.Generator | None, device: torch.device, dtype: torch.dtype) -> Tensor:
    # Draw where the generator lives (a CPU generator gives the same numbers whatever device samples), then move.
    gen_device = generator.device if generator is not None else device
    return torch.randn(tuple(shape), generator=generator, device=gen_device, dtype=dtype).to(device)


class _ChainSampler:
    """The shared loop over precomputed (S,) tables; subclasses only fill the tables in `__post_init__`."""

    schedule: NoiseSchedule
    pred_type: str
    clip_sample: bool
    clip_range: float
    timesteps: Tensor  # (S,) long, train timesteps in the order they are visited (descending)
    sqrt_ab: Tensor  # (S,) sqrt(ᾱ_t), to turn model_out into (x0_hat, eps_hat)
    sqrt_one_minus_ab: Tensor  # (S,) sqrt(1 - ᾱ_t)
    c_x0: Tensor  # (S,) multiplies clip(x0_hat)
    c_x0_raw: Tensor  # (S,) multiplies the unclipped x0_hat (DDPM only; zeros for DDIM)
    c_eps: Tensor  # (S,) multiplies eps_hat
    sigma: Tensor  # (S,) std of the fresh noise added at each step
    stochastic: bool  # any sigma > 0: decided once at construction, so the loop never looks at sigma's values
    _has_raw_term: bool  # any c_x0_raw != 0 (DDPM): likewise fixed at construction

    def _check_common(self, name: str) -> None:
        check_pred_type(self.pred_type)
        if not self.clip_range > 0:
            raise ValueError(f"{name} clip_range: got {self.clip_range}; must be > 0")

    def _set_tables(self, timesteps: list[int], c_x0: Tensor, c_x0_raw: Tensor, c_eps: Tensor, sigma: Tensor) -> None:
        dev = self.schedule.device
        self.timesteps = torch.tensor(timesteps, dtype=torch.long, device=dev)
        self.sqrt_ab = self.schedule.sqrt_alphas_cumprod[self.timesteps]
        self.sqrt_one_minus_ab = self.schedule.sqrt_one_minus_alphas_cumprod[self.timesteps]
        self.c_x0, self.c_x0_raw, self.c_eps, self.sigma = (v.float().to(dev) for v in (c_x0, c_x0_raw, c_eps, sigma))
        self.stochastic = bool((sigma > 0).any())
        self._has_raw_term = bool((c_x0_raw != 0).any())

    @property
    def num_steps(self) -> int:
        """S, the number of denoiser calls per sample."""
        return int(self.timesteps.shape[0])

    @property
    def device(self) -> torch.device:
        return self.timesteps.device

    def to(self, device: torch.device | str) -> Self:
        """A copy whose schedule and tables live on `device`."""
        return replace(self, schedule=self.schedule.to(device))  # type: ignore[type-var]  # re-runs __post_init__

    def step(
        self,
        i: int,
        model_out: Tensor,
        x_t: Tensor,
        noise: Tensor | None = None,
        generator: torch.Generator | None = None,
    ) -> Tensor:
        """One reverse step at loop index i (train timestep `timesteps[i]`): x_t (B, Tp, Da) -> x_prev (B, Tp, Da).

        `noise` (B, Tp, Da) is the fresh Gaussian for a stochastic step; when None it is drawn from `generator`.
        Deterministic samplers (DDIM eta=0) ignore both.
        """
        s0, s1 = self.sqrt_ab[i], self.sqrt_one_minus_ab[i]
        x0_hat, eps_hat = split_with_coefficients(self.pred_type, model_out, x_t, s0, s1)
        x0_used = x0_hat.clamp(-self.clip_range, self.clip_range) if self.clip_sample else x0_hat
        x_prev = self.c_x0[i] * x0_used
        if self._has_raw_term:  # a property of the sampler kind, fixed at construction
            x_prev = x_prev + self.c_x0_raw[i] * x0_hat
        x_prev = x_prev + self.c_eps[i] * eps_hat
        if self.stochastic:
            if noise is None:
                noise = _randn(x_t.shape, generator, x_t.device, x_t.dtype)
            x_prev = x_prev + self.sigma[i] * noise
        return x_prev

    def sample(
        self,
        denoise_fn: DenoiseFn,
        shape: Sequence[int],
        generator: torch.Generator | None = None,
        device: torch.device | str | None = None,
        init_noise: Tensor | None = None,
        step_noise: Tensor | None = None,
    ) -> Tensor:
        """Run the whole chain from Gaussian noise; returns x0 (B, Tp, Da) for `shape` = (B, Tp, Da).

        denoise_fn(x_t (B, Tp, Da), t (B,) long) -> model_out. Randomness comes from `generator` (None: torch's
        global RNG) in diffusers' order — init noise first, then one draw per stochastic step — or is passed in:
        `init_noise` (B, Tp, Da), `step_noise` (S, B, Tp, Da). Gradients flow into denoise_fn unless the caller
        wraps this in torch.no_grad().
        """
        shape = tuple(shape)
        if device is None:
            device = init_noise.device if init_noise is not None else self.device
        device = torch.device(device)
        chain = self if _same_device(device, self.device) else self.to(device)
        if init_noise is not None and tuple(init_noise.shape) != shape:
            raise ValueError(f"init_noise: got shape {tuple(init_noise.shape)}; must be {shape}")
        if step_noise is not None and tuple(step_noise.shape) != (self.num_steps, *shape):
            raise ValueError(f"step_noise: got shape {tuple(step_noise.shape)}; must be {(self.num_steps, *shape)}")
        x = init_noise.to(device) if init_noise is not None else _randn(shape, generator, device, torch.float32)
        t_all = chain.timesteps[:, None].expand(chain.num_steps, shape[0])  # (S, B): one view, no per-step alloc
        for i in range(chain.num_steps):
            model_out = denoise_fn(x, t_all[i])
            z = step_noise[i].to(device) if step_noise is not None else None
            x = chain.step(i, model_out, x, noise=z, generator=generator)
        return x


@dataclass(eq=False)
class DDPMSampler(_ChainSampler):
    """Ancestral sampling over all T train steps, as diffusers' DDPMScheduler (S = T).

    variance_type "fixed_small" (diffusers' default) adds the posterior std sqrt(β_t (1-ᾱ_{t-1}) / (1-ᾱ_t));
    "fixed_large" adds sqrt(β_t). No noise at the last step (t = 0).
    """

    schedule: NoiseSchedule = field(repr=False)
    #: One of prediction.PRED_TYPES: "epsilon", "sample", "v", "hybrid".
    pred_type: str = "epsilon"
    #: Clamp x0_hat to [-clip_range, clip_range] before it enters the update (actions are normalised to [-1, 1]).
    clip_sample: bool = True
    clip_range: float = 1.0
    variance_type: str = "fixed_small"

    def __post_init__(self) -> None:
        self._check_common("DDPM")
        if self.variance_type not in VARIANCE_TYPES:
            raise ValueError(f"DDPM variance_type: got {self.variance_type!r}; allowed: {', '.join(VARIANCE_TYPES)}")
        ab = self.schedule.alphas_cumprod.detach().cpu()  # float32, diffusers' operation order (module doc)
        T = ab.shape[0]
        ts = list(range(T - 1, -1, -1))
        ab_t = ab[ts]
        ab_prev = torch.cat([ab[[t - 1 for t in ts[:-1]]], ab.new_ones(1)])  # ᾱ_{t-1}; ᾱ_{-1} = 1
        alpha_t = ab_t / ab_prev
        beta_t = 1 - alpha_t
        c0 = (ab_prev**0.5 * beta_t) / (1 - ab_t)
        ct = alpha_t**0.5 * (1 - ab_prev) / (1 - ab_t)
        small = ((1 - ab_prev) / (1 - ab_t) * beta_t).clamp(min=1e-20)  # the posterior variance
        sigma = (small if self.variance_type == "fixed_small" else beta_t) ** 0.5
        sigma[-1] = 0.0  # t = 0 returns the mean, as in the DDPM paper
        # The split of ct·x_t into x0 and ε terms is ours: one float64 product, one rounding.
        s0, s1 = self.schedule.sqrt_alphas_cumprod.cpu()[ts], self.schedule.sqrt_one_minus_alphas_cumprod.cpu()[ts]
        c_x0_raw, c_eps = (ct.double() * s0.double()).float(), (ct.double() * s1.double()).float()
        self._set_tables(ts, c0, c_x0_raw, c_eps, sigma)


@dataclass(eq=False)
class DDIMSampler(_ChainSampler):
    """DDIM with S <= T steps and stochasticity eta in [0, 1] (0: deterministic DDIM, 1: DDPM-like noise).

    Timesteps as diffusers' DDIMScheduler: "leading" (default) visits k·(T//S) + steps_offset, k = S-1..0;
    "trailing" visits round(T - k·T/S) - 1, k = 0..S-1, which starts from the noisiest step t = T-1 and is
    the better choice for few steps. Each step goes to the next visited timestep and the last one to ᾱ = 1
    (`set_alpha_to_one`, diffusers' default) or to ᾱ_0. This equals diffusers' rule (prev = t - T//S) in every
    case it is self-consistent; diffusers stops short of the clean level only when steps_offset >= T//S.
    """

    schedule: NoiseSchedule = field(repr=False)
    num_steps: int = 10  # type: ignore[assignment]  # shadows the base property on purpose: S is the config
    eta: float = 0.0
    #: Multiplies the std of the fresh noise, not the coefficients (which follow eta): 0 runs each step's mean.
    noise_scale: float = 1.0
    #: One of prediction.PRED_TYPES: "epsilon", "sample", "v", "hybrid".
    pred_type: str = "epsilon"
    #: Clamp x0_hat to [-clip_range, clip_range] before it enters the update (actions are normalised to [-1, 1]).
    clip_sample: bool = True
    clip_range: float = 1.0
    timestep_spacing: str = "leading"
    steps_offset: int = 0
    set_alpha_to_one: bool = True

    def __post_init__(self) -> None:
        self._check_common("DDIM")
        T, S = self.schedule.num_train_steps, self.num_steps
        if not isinstance(S, int) or not 1 <= S <= T:
            raise ValueError(f"DDIM num_steps: got {S}; must be 1..T={T}")
        if not 0.0 <= self.eta <= 1.0:
            raise ValueError(f"DDIM eta: got {self.eta}; must be in [0, 1]")
        if not self.noise_scale >= 0.0:
            raise ValueError(f"DDIM noise_scale: got {self.noise_scale}; must be >= 0")
        if self.timestep_spacing not in TIMESTEP_SPACINGS:
            raise ValueError(
                f"DDIM timestep_spacing: got {self.timestep_spacing!r}; allowed: {', '.join(TIMESTEP_SPACINGS)}"
            )
        if self.timestep_spacing == "leading":
            ratio = T // S
            if not 0 <= self.steps_offset <= T - 1 - (S - 1) * ratio:
                raise ValueError(
                    f"DDIM steps_offset: got {self.steps_offset}; must be 0..{T - 1 - (S - 1) * ratio} for T={T}, S={S}"
                )
            ts = [k * ratio + self.steps_offset for k in range(S - 1, -1, -1)]
        else:
            if self.steps_offset != 0:
                raise ValueError(f"DDIM steps_offset: got {self.steps_offset}; must be 0 with 'trailing' spacing")
            ts = [round(T - k * T / S) - 1 for k in range(S)]

        ab = self.schedule.alphas_cumprod.detach().cpu()  # float32, diffusers' operation order (module doc)
        final = torch.ones(1) if self.set_alpha_to_one else ab[:1]
        ab_t = ab[ts]
        ab_prev = torch.cat([ab[ts[1:]], final])
        # σ²_DDIM of Song et al. eq. 16: the DDPM posterior variance between the two visited steps.
        var = (1 - ab_prev) / (1 - ab_t) * (1 - ab_t / ab_prev)
        sigma = self.eta * var**0.5
        c_eps = (1 - ab_prev - sigma**2).clamp(min=0.0) ** 0.5  # clamp: never NaN, a no-op where diffusers is finite
        self._set_tables(ts, ab_prev**0.5, torch.zeros_like(ab_t), c_eps, sigma * self.noise_scale)
