"""Noise schedules, q_sample and the prediction-type conversions (epsilon / sample / v / hybrid)."""

from __future__ import annotations

import pytest
import torch

from dmrl.diffusion import (
    PRED_TYPES,
    make_schedule,
    output_dim,
    prediction_target,
    q_sample,
    split_prediction,
    velocity,
)


@pytest.mark.parametrize("kind", ["cosine", "linear"])
def test_schedule_tables(kind: str) -> None:
    s = make_schedule(kind, 100)
    assert s.num_train_steps == 100 and s.kind == kind
    for name in ("betas", "alphas", "alphas_cumprod", "sqrt_alphas_cumprod", "posterior_variance"):
        v = getattr(s, name)
        assert v.shape == (100,) and v.dtype == torch.float32
    ab = s.alphas_cumprod
    assert bool((ab[1:] < ab[:-1]).all()) and 0 < float(ab[-1]) < float(ab[0]) < 1
    assert torch.allclose(s.sqrt_alphas_cumprod**2 + s.sqrt_one_minus_alphas_cumprod**2, torch.ones(100), atol=1e-6)
    assert float(s.posterior_variance[0]) == 0.0 and float(s.alphas_cumprod_prev[0]) == 1.0
    assert s.to("cpu").betas.device.type == "cpu"


def test_linear_endpoints() -> None:
    s = make_schedule("linear", 50, beta_start=1e-3, beta_end=0.05)
    assert float(s.betas[0]) == pytest.approx(1e-3) and float(s.betas[-1]) == pytest.approx(0.05)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"kind": "quadratic"}, "schedule kind: got 'quadratic'"),
        ({"num_train_steps": 0}, "num_train_steps: got 0"),
        ({"kind": "linear", "beta_start": 0.1, "beta_end": 0.01}, "linear betas"),
        ({"max_beta": 1.0}, "max_beta: got 1.0"),
    ],
)
def test_schedule_bad_args(kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match) as e:
        make_schedule(**kwargs)
    assert "\n" not in str(e.value)


def test_q_sample_statistics() -> None:
    s = make_schedule("cosine", 100)
    g = torch.Generator().manual_seed(0)
    B = 20000
    x0 = torch.full((B, 2, 2), 0.5)
    for t_int in (0, 30, 99):
        t = torch.full((B,), t_int, dtype=torch.long)
        xt = q_sample(s, x0, t, torch.randn(x0.shape, generator=g))
        s0, s1 = float(s.sqrt_alphas_cumprod[t_int]), float(s.sqrt_one_minus_alphas_cumprod[t_int])
        assert float(xt.mean()) == pytest.approx(0.5 * s0, abs=0.01)
        assert float(xt.std()) == pytest.approx(s1, rel=0.02, abs=1e-3)
    with pytest.raises(ValueError, match="q_sample t: got shape"):
        q_sample(s, x0[:4], torch.zeros(3, dtype=torch.long), x0[:4])


def _true_triplet(kind: str = "cosine"):
    s = make_schedule(kind, 100)
    g = torch.Generator().manual_seed(1)
    x0 = torch.rand((6, 4, 3), generator=g) * 2 - 1
    eps = torch.randn(x0.shape, generator=g)
    t = torch.tensor([0, 1, 20, 50, 90, 99])
    return s, x0, eps, t, q_sample(s, x0, t, eps)


@pytest.mark.parametrize("pred_type", PRED_TYPES)
def test_split_round_trip(pred_type: str) -> None:
    """The output a perfect denoiser gives recovers the true x0 and ε for every prediction type."""
    s, x0, eps, t, xt = _true_triplet()
    out = prediction_target(pred_type, x0, eps, t, s)
    assert out.shape[-1] == output_dim(pred_type, 3)
    x0_hat, eps_hat = split_prediction(pred_type, out, xt, t, s)
    # epsilon divides by sqrt(ᾱ) ~ 8e-4 at t=99 of the cosine schedule: compare where it is well conditioned.
    ok = slice(None) if pred_type != "epsilon" else slice(0, 5)
    assert torch.allclose(x0_hat[ok], x0[ok], atol=1e-4)
    assert torch.allclose(eps_hat, eps, atol=1e-3 if pred_type == "sample" else 1e-5)


def test_v_matches_definition() -> None:
    s, x0, eps, t, _ = _true_triplet("linear")
    ab = s.alphas_cumprod[t][:, None, None]
    assert torch.allclose(velocity(x0, eps, t, s), ab.sqrt() * eps - (1 - ab).sqrt() * x0, atol=1e-6)


def test_hybrid_uses_each_head() -> None:
    """Hybrid: first Da channels are the ε head, last Da the x0 head, returned as-is (never derived)."""
    s, x0, eps, t, xt = _true_triplet()
    eps_head, x0_head = torch.randn_like(eps), torch.randn_like(x0)  # deliberately inconsistent with x_t
    x0_hat, eps_hat = split_prediction("hybrid", torch.cat([eps_head, x0_head], -1), xt, t, s)
    assert torch.equal(x0_hat, x0_head) and torch.equal(eps_hat, eps_head)


def test_split_bad_args() -> None:
    s, x0, eps, t, xt = _true_triplet()
    with pytest.raises(ValueError, match="pred_type: got 'x0'"):
        split_prediction("x0", eps, xt, t, s)
    with pytest.raises(ValueError, match=r"hybrid model output: got shape \(6, 4, 3\); must be \(6, 4, 6\)"):
        split_prediction("hybrid", eps, xt, t, s)
