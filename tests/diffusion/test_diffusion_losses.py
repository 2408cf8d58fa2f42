"""Diffusion training losses: targets, action masks, hybrid components and the HybridWeights schedule."""

from __future__ import annotations

import pytest
import torch

from dmrl.diffusion import (
    PRED_TYPES,
    HybridWeights,
    diffusion_loss,
    make_schedule,
    prediction_target,
    sample_training_inputs,
)

SCHED = make_schedule("cosine", 100)


def _batch(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    x0 = torch.rand((4, 6, 2), generator=g) * 2 - 1
    t, noise, xt = sample_training_inputs(SCHED, x0, g)
    return x0, t, noise, xt


def test_sample_training_inputs() -> None:
    x0 = torch.zeros((4096, 2, 1))
    t, noise, xt = sample_training_inputs(SCHED, x0, torch.Generator().manual_seed(0))
    assert t.dtype == torch.long and t.shape == (4096,) and int(t.min()) == 0 and int(t.max()) == 99
    assert noise.shape == x0.shape and torch.allclose(xt, SCHED.sqrt_one_minus_alphas_cumprod[t][:, None, None] * noise)
    again = sample_training_inputs(SCHED, x0, torch.Generator().manual_seed(0))
    assert torch.equal(again[0], t) and torch.equal(again[1], noise)


@pytest.mark.parametrize("pred_type", PRED_TYPES)
def test_perfect_prediction_has_zero_loss(pred_type: str) -> None:
    x0, t, noise, xt = _batch()
    out = diffusion_loss(pred_type, prediction_target(pred_type, x0, noise, t, SCHED), x0, noise, xt, t, SCHED)
    assert float(out["loss"]) == pytest.approx(0.0, abs=1e-12)
    assert float(out["x0_mse"]) < 1e-4  # epsilon's implied x0 carries float error at t near T
    assert ("loss_eps" in out) == ("loss_x0" in out) == (pred_type == "hybrid")


def test_v_target_definition() -> None:
    x0, t, noise, xt = _batch()
    ab = SCHED.alphas_cumprod[t][:, None, None]
    v = ab.sqrt() * noise - (1 - ab).sqrt() * x0
    assert float(diffusion_loss("v", v, x0, noise, xt, t, SCHED)["loss"]) < 1e-12


@pytest.mark.parametrize("pred_type", PRED_TYPES)
def test_mask_ignores_padded_steps(pred_type: str) -> None:
    x0, t, noise, xt = _batch()
    g = torch.Generator().manual_seed(5)
    pred = torch.randn(prediction_target(pred_type, x0, noise, t, SCHED).shape, generator=g)
    mask = torch.ones((4, 6), dtype=torch.bool)
    mask[0, 4:] = False
    mask[2, 1:] = False
    garbage = pred.clone()
    garbage[~mask] = 1e6  # whatever the model says on padded steps must not matter
    a = diffusion_loss(pred_type, pred, x0, noise, xt, t, SCHED, mask=mask)
    b = diffusion_loss(pred_type, garbage, x0, noise, xt, t, SCHED, mask=mask)
    for k in a:
        assert torch.allclose(a[k], b[k]), k
    # Exactly the mean over real steps: compare with the unmasked loss on the kept rows of one sample.
    one = diffusion_loss(pred_type, pred[1:2], x0[1:2], noise[1:2], xt[1:2], t[1:2], SCHED)
    one_masked = diffusion_loss(pred_type, pred[1:2], x0[1:2], noise[1:2], xt[1:2], t[1:2], SCHED, mask=mask[1:2])
    assert torch.allclose(one["loss"], one_masked["loss"])
    # Padding in the batch: the loss of the whole batch is the mean of its halves' losses (accumulation / DDP).
    halves = [
        diffusion_loss(
            pred_type,
            pred[i : i + 2],
            x0[i : i + 2],
            noise[i : i + 2],
            xt[i : i + 2],
            t[i : i + 2],
            SCHED,
            mask=mask[i : i + 2],
        )["loss"]
        for i in (0, 2)
    ]
    assert torch.allclose(a["loss"], (halves[0] + halves[1]) / 2)
    with pytest.raises(ValueError, match=r"action mask: got shape \(4, 5\)"):
        diffusion_loss(pred_type, pred, x0, noise, xt, t, SCHED, mask=mask[:, :5])


def test_hybrid_components_and_weights() -> None:
    x0, t, noise, xt = _batch()
    pred = torch.randn((4, 6, 4), generator=torch.Generator().manual_seed(2), requires_grad=True)
    out = diffusion_loss("hybrid", pred, x0, noise, xt, t, SCHED, hybrid_weights=(0.3, 0.7))
    assert torch.allclose(out["loss_eps"], (pred[..., :2] - noise).square().mean())
    assert torch.allclose(out["loss_x0"], (pred[..., 2:] - x0).square().mean())
    assert torch.allclose(out["loss"], 0.3 * out["loss_eps"] + 0.7 * out["loss_x0"])
    out["loss"].backward()
    assert pred.grad is not None and float(pred.grad.abs().sum()) > 0
    with pytest.raises(ValueError, match="hybrid_weights: got"):
        diffusion_loss("epsilon", pred[..., :2], x0, noise, xt, t, SCHED, hybrid_weights=(0.5, 0.5))


@pytest.mark.parametrize("kind", ["linear", "cosine", "step"])
def test_hybrid_weights_schedule(kind: str) -> None:
    hw = HybridWeights(kind=kind)
    ps = [i / 100 for i in range(101)]
    w = [hw.w_x0(p) for p in ps]
    assert w[0] == pytest.approx(0.9) and w[-1] == pytest.approx(0.1)
    assert all(0.0 <= v <= 1.0 for v in w)
    assert all(b <= a + 1e-12 for a, b in zip(w, w[1:], strict=False))  # x0 weight never grows
    assert hw.weights(0.25) == pytest.approx((1 - hw.w_x0(0.25), hw.w_x0(0.25)))
    assert hw.w_eps(0.4) == pytest.approx(1 - hw.w_x0(0.4))
    assert hw.w_x0(1.5) == pytest.approx(0.1) and hw.w_x0(-1.0) == pytest.approx(0.9)  # clamped


def test_hybrid_weights_step_switch() -> None:
    hw = HybridWeights(kind="step", x0_start=0.8, x0_end=0.2, switch_at=0.3)
    assert hw.w_x0(0.29) == 0.8 and hw.w_x0(0.3) == 0.2


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"kind": "exp"}, "HybridWeights kind: got 'exp'"),
        ({"x0_start": 1.2}, "HybridWeights x0_start: got 1.2; must be in"),
        ({"x0_end": -0.1}, "HybridWeights x0_end: got -0.1"),
        ({"switch_at": 2.0}, "HybridWeights switch_at: got 2.0"),
    ],
)
def test_hybrid_weights_bad_args(kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match) as e:
        HybridWeights(**kwargs)
    assert "\n" not in str(e.value)
