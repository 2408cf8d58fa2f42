"""Denoising training loss of DDPM (Ho et al. 2020) for ε / x0 / v targets, and a hybrid ε + x0 loss.

The hybrid's idea: ε-prediction trains smoothly but can emit over-large actions; x0-prediction converges faster
early but can later collapse modes. So predict both (two heads, see prediction.py) and train
loss = w_eps · MSE(ε head, ε) + w_x0 · MSE(x0 head, x0), with w_x0 large early and small late (`HybridWeights`,
w_eps = 1 - w_x0).

Padded action steps (episode ends shorter than Tp) are excluded by a (B, Tp) bool mask, True = real step, so
every batch keeps a static shape; padded elements add zero and the sum is divided by the static B·Tp·C.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from dmrl.diffusion.prediction import check_pred_type, prediction_target, split_prediction
from dmrl.diffusion.schedule import NoiseSchedule, q_sample

HYBRID_WEIGHT_KINDS = ("linear", "cosine", "step")


@dataclass(frozen=True)
class HybridWeights:
    """Training-progress schedule of the hybrid loss weights: w_x0(p) from `x0_start` (p=0) to `x0_end` (p=1).

    linear  straight line between the two.
    cosine  half cosine: flat near both ends, fastest change mid-training.
    step    x0_start before `switch_at`, x0_end from it on.
    w_eps(p) = 1 - w_x0(p). `weights(p)` returns (w_eps, w_x0), the order of the hybrid heads and of
    `diffusion_loss(hybrid_weights=...)`.
    """

    kind: str = "linear"
    """w_x0 curve: linear/cosine/step."""
    x0_start: float = 0.9
    """x0-loss weight at the start."""
    x0_end: float = 0.1
    """x0-loss weight at the end."""
    switch_at: float = 0.5
    """Progress where step switches."""

    def __post_init__(self) -> None:
        if self.kind not in HYBRID_WEIGHT_KINDS:
            raise ValueError(f"HybridWeights kind: got {self.kind!r}; allowed: {', '.join(HYBRID_WEIGHT_KINDS)}")
        for name in ("x0_start", "x0_end", "switch_at"):
            v = getattr(self, name)
            if not 0.0 <= v <= 1.0:
                raise ValueError(f"HybridWeights {name}: got {v}; must be in [0, 1]")

    def w_x0(self, progress: float) -> float:
        """x0-loss weight at training progress in [0, 1] (values outside are clamped: a last step may overrun)."""
        if math.isnan(progress):
            raise ValueError("HybridWeights progress: got nan; must be a number in [0, 1]")
        p = min(max(float(progress), 0.0), 1.0)
        a, b = self.x0_start, self.x0_end
        if self.kind == "linear":
            return a + (b - a) * p
        if self.kind == "cosine":
            return b + (a - b) * 0.5 * (1.0 + math.cos(math.pi * p))
        return a if p < self.switch_at else b

    def w_eps(self, progress: float) -> float:
        """ε-loss weight, 1 - w_x0(progress)."""
        return 1.0 - self.w_x0(progress)

    def weights(self, progress: float) -> tuple[float, float]:
        """(w_eps, w_x0) at `progress`, ready for `diffusion_loss(..., hybrid_weights=...)`."""
        w = self.w_x0(progress)
        return 1.0 - w, w


def masked_mse(pred: Tensor, target: Tensor, mask: Tensor | None, weight: Tensor | None = None) -> Tensor:
    """Squared error summed over real elements / (B·Tp·C): pred/target (B, Tp, C), mask (B, Tp) bool or None;
    weight (B,) scales each sample's terms (advantage-weighted BC), None = 1."""
    sq = (pred - target).square()
    if weight is not None:
        if weight.shape != sq.shape[:1]:
            raise ValueError(f"sample weight: got shape {tuple(weight.shape)}; must be (B,) = ({sq.shape[0]},)")
        sq = sq * weight.to(sq.dtype)[:, None, None]
    if mask is None:
        return sq.mean()
    if mask.shape != sq.shape[:2]:
        raise ValueError(f"action mask: got shape {tuple(mask.shape)}; must be (B, Tp) = {tuple(sq.shape[:2])}")
    # Padded steps contribute zero and every real step has the same weight. Dividing by the static element count
    # B·Tp·C (not the real-step count) keeps the loss a plain mean over samples, so equal micro-batches and DDP
    # shards average to exactly the full-batch loss (gradient accumulation and data parallelism stay exact).
    return torch.where(mask.unsqueeze(-1), sq, torch.zeros((), dtype=sq.dtype, device=sq.device)).mean()


def diffusion_loss(
    pred_type: str,
    model_out: Tensor,
    x0: Tensor,
    noise: Tensor,
    x_t: Tensor,
    t: Tensor,
    schedule: NoiseSchedule,
    mask: Tensor | None = None,
    hybrid_weights: tuple[float, float] | None = None,
    sample_weight: Tensor | None = None,
) -> dict[str, Tensor]:
    """Denoising loss of `model_out` (B, Tp, Da), or (B, Tp, 2·Da) for "hybrid", at x_t = q_sample(x0, t, noise).

    x0, noise, x_t (B, Tp, Da); t (B,) long; mask (B, Tp) bool, True = real action step (None: all real).
    Targets: epsilon -> noise, sample -> x0, v -> sqrt(ᾱ_t) noise - sqrt(1 - ᾱ_t) x0, hybrid -> both heads with
    `hybrid_weights` = (w_eps, w_x0) (None: 0.5 each). sample_weight (B,) weights each sample's loss (None: 1).
    Returns {"loss": scalar with grad, "x0_mse": detached MSE of the implied x0_hat, a diagnostic comparable
    across prediction types}; "hybrid" adds the unweighted head losses "loss_eps" and "loss_x0" (with grad).
    """
    check_pred_type(pred_type)
    out: dict[str, Tensor] = {}
    if pred_type == "hybrid":
        if hybrid_weights is None:
            hybrid_weights = (0.5, 0.5)
        w_eps, w_x0 = hybrid_weights
        da = x0.shape[-1]
        out["loss_eps"] = masked_mse(model_out[..., :da], noise, mask, sample_weight)
        out["loss_x0"] = masked_mse(model_out[..., da:], x0, mask, sample_weight)
        out["loss"] = w_eps * out["loss_eps"] + w_x0 * out["loss_x0"]
    else:
        if hybrid_weights is not None:
            raise ValueError(f"hybrid_weights: got {hybrid_weights}; only allowed with pred_type 'hybrid'")
        target = prediction_target(pred_type, x0, noise, t, schedule)
        out["loss"] = masked_mse(model_out, target, mask, sample_weight)
    with torch.no_grad():
        x0_hat, _ = split_prediction(pred_type, model_out, x_t, t, schedule)
        out["x0_mse"] = masked_mse(x0_hat, x0, mask)
    return out


def sample_training_inputs(
    schedule: NoiseSchedule, x0: Tensor, generator: torch.Generator | None = None
) -> tuple[Tensor, Tensor, Tensor]:
    """Draw t ~ U{0..T-1} (B,) long and noise ~ N(0, I) like x0, and noise x0 (B, Tp, Da) into x_t.

    Returns (t, noise, x_t). Draws happen on the generator's device (then move to x0's), so one CPU generator
    gives the same batch on every device. The schedule must be on x0's device.
    """
    gen_device = generator.device if generator is not None else x0.device
    t = torch.randint(0, schedule.num_train_steps, (x0.shape[0],), generator=generator, device=gen_device)
    noise = torch.randn(x0.shape, generator=generator, device=gen_device, dtype=x0.dtype)
    t, noise = t.to(x0.device), noise.to(x0.device)
    return t, noise, q_sample(schedule, x0, t, noise)
