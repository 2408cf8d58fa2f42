"""What the denoiser predicts: ε (Ho et al. 2020), x0 ("sample"), v (Salimans & Ho 2022) or a hybrid ε + x0 head.

Every type is turned into the same pair (x0_hat, eps_hat) by `split_prediction`, which both the samplers and the
losses use, so a policy can switch prediction type without touching either. With s0 = sqrt(ᾱ_t),
s1 = sqrt(1 - ᾱ_t) and x_t = s0 x0 + s1 ε:

  epsilon  out = ε        x0 = (x_t - s1 out) / s0
  sample   out = x0       ε  = (x_t - s0 out) / s1
  v        out = s0 ε - s1 x0;   x0 = s0 x_t - s1 out,  ε = s0 out + s1 x_t
  hybrid   out has 2·Da channels on the last dim: out[..., :Da] is the ε head, out[..., Da:] the x0 head.
           Nothing is derived: x0_hat is the x0 head and eps_hat the ε head.

Why hybrid keeps its heads apart instead of averaging them: ε-prediction trains smoothly but is prone to
over-large actions, and x0-prediction learns fast early but can collapse modes late (the hybrid loss's premise).
A DDIM/DDPM update is a sum of an x0 term (where the sample goes) and an ε term (the direction of the remaining
noise); feeding each term from the head trained for it keeps x0's bounded, clipped endpoint and ε's well-calibrated
noise direction. When the two heads agree (x_t = s0 x0_hat + s1 eps_hat), the update is the usual one.
"""

from __future__ import annotations

import torch
from torch import Tensor

from dmrl.diffusion.schedule import NoiseSchedule, extract

PRED_TYPES = ("epsilon", "sample", "v", "hybrid")


def check_pred_type(pred_type: str) -> str:
    """Return `pred_type` or raise a one-line ValueError naming the allowed values."""
    if pred_type not in PRED_TYPES:
        raise ValueError(f"pred_type: got {pred_type!r}; allowed: {', '.join(PRED_TYPES)}")
    return pred_type


def output_dim(pred_type: str, action_dim: int) -> int:
    """Channels the denoiser must output on its last dim: 2·Da for "hybrid", Da otherwise."""
    return 2 * action_dim if check_pred_type(pred_type) == "hybrid" else action_dim


def split_with_coefficients(
    pred_type: str, model_out: Tensor, x_t: Tensor, s0: Tensor, s1: Tensor
) -> tuple[Tensor, Tensor]:
    """(x0_hat, eps_hat), each like x_t (B, Tp, Da), from `model_out` with s0 = sqrt(ᾱ_t), s1 = sqrt(1 - ᾱ_t).

    s0/s1 broadcast against x_t: 0-d tensors (one timestep for the whole batch, as in the samplers) or
    (B, 1, 1). model_out is (B, Tp, Da), or (B, Tp, 2·Da) for "hybrid" (ε head first, then x0 head).
    """
    da = x_t.shape[-1]
    want = 2 * da if pred_type == "hybrid" else da
    if model_out.shape[-1] != want or model_out.shape[:-1] != x_t.shape[:-1]:
        raise ValueError(
            f"{pred_type} model output: got shape {tuple(model_out.shape)}; must be {(*x_t.shape[:-1], want)}"
        )
    # Divisions (not multiplications by reciprocals) mirror diffusers' arithmetic, which the parity tests pin.
    if pred_type == "epsilon":
        return (x_t - s1 * model_out) / s0, model_out
    if pred_type == "sample":
        return model_out, (x_t - s0 * model_out) / s1
    if pred_type == "v":
        return s0 * x_t - s1 * model_out, s0 * model_out + s1 * x_t
    if pred_type == "hybrid":
        return model_out[..., da:], model_out[..., :da]
    raise ValueError(f"pred_type: got {pred_type!r}; allowed: {', '.join(PRED_TYPES)}")


def split_prediction(
    pred_type: str, model_out: Tensor, x_t: Tensor, t: Tensor, schedule: NoiseSchedule
) -> tuple[Tensor, Tensor]:
    """(x0_hat, eps_hat), each (B, Tp, Da), from the denoiser output at train timesteps t (B,) long.

    model_out (B, Tp, Da), or (B, Tp, 2·Da) for "hybrid"; x_t (B, Tp, Da). x0_hat is not clipped here: clipping
    is a sampler decision.
    """
    s0 = extract(schedule.sqrt_alphas_cumprod, t, x_t.dim()).to(x_t.dtype)
    s1 = extract(schedule.sqrt_one_minus_alphas_cumprod, t, x_t.dim()).to(x_t.dtype)
    return split_with_coefficients(check_pred_type(pred_type), model_out, x_t, s0, s1)


def velocity(x0: Tensor, noise: Tensor, t: Tensor, schedule: NoiseSchedule) -> Tensor:
    """v = sqrt(ᾱ_t) ε - sqrt(1 - ᾱ_t) x0, like x0 (B, Tp, Da), for t (B,) long."""
    s0 = extract(schedule.sqrt_alphas_cumprod, t, x0.dim()).to(x0.dtype)
    s1 = extract(schedule.sqrt_one_minus_alphas_cumprod, t, x0.dim()).to(x0.dtype)
    return s0 * noise - s1 * x0


def prediction_target(pred_type: str, x0: Tensor, noise: Tensor, t: Tensor, schedule: NoiseSchedule) -> Tensor:
    """What a perfect denoiser outputs for (x0, noise, t): (B, Tp, Da), or (B, Tp, 2·Da) for "hybrid" ([ε, x0])."""
    pred_type = check_pred_type(pred_type)
    if pred_type == "epsilon":
        return noise
    if pred_type == "sample":
        return x0
    if pred_type == "v":
        return velocity(x0, noise, t, schedule)
    return torch.cat([noise, x0], dim=-1)
