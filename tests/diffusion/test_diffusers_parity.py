"""Parity of dmrl.diffusion with diffusers' DDPMScheduler / DDIMScheduler over whole sampling chains (1e-5)."""

from __future__ import annotations

import pytest
import torch

from dmrl.diffusion import DDIMSampler, DDPMSampler, NoiseSchedule, make_schedule, q_sample

diffusers = pytest.importorskip("diffusers")

T = 100
SHAPE = (3, 8, 3)  # (B, Tp, Da)
ATOL = 1e-5
KINDS = {"linear": "linear", "cosine": "squaredcos_cap_v2"}
PRED = {"epsilon": "epsilon", "sample": "sample", "v": "v_prediction"}
W = torch.tensor([[0.8, 0.1, -0.05], [0.05, 0.7, 0.1], [-0.1, 0.0, 0.9]])


def fake_model(pred_type: str, schedule: NoiseSchedule):
    """A fixed deterministic denoiser: the exact posterior mean for x0 ~ N(0, 0.5²) plus a nonlinear wobble.

    Being close to a real denoiser keeps every chain O(1) (so 1e-5 is a meaningful absolute tolerance), while
    the wobble (a fixed function of x_t and t) makes every step exercise the full update.
    """
    var0 = 0.25

    def fn(x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        s0 = schedule.sqrt_alphas_cumprod[t][:, None, None]
        s1 = schedule.sqrt_one_minus_alphas_cumprod[t][:, None, None]
        denom = s0 * s0 * var0 + s1 * s1
        x0, eps = s0 * var0 * x / denom, s1 * x / denom
        out = {"epsilon": eps, "sample": x0, "v": s0 * eps - s1 * x0}[pred_type]
        return out + 0.05 * torch.sin(x @ W + 0.1 * t[:, None, None].float())

    return fn


@pytest.fixture(scope="module", params=list(KINDS))
def kind(request) -> str:
    return request.param


def test_schedule_tables_match_diffusers(kind: str) -> None:
    for steps in (T, 1000):
        ref = diffusers.DDPMScheduler(num_train_timesteps=steps, beta_schedule=KINDS[kind])
        ours = make_schedule(kind, steps)
        assert torch.equal(ours.betas, ref.betas)
        assert torch.equal(ours.alphas_cumprod, ref.alphas_cumprod)
        assert (ours.sqrt_alphas_cumprod - ref.alphas_cumprod.sqrt()).abs().max() <= 1e-7
        assert (ours.sqrt_one_minus_alphas_cumprod - (1 - ref.alphas_cumprod).sqrt()).abs().max() <= 1e-7


def test_q_sample_matches_add_noise(kind: str) -> None:
    g = torch.Generator().manual_seed(0)
    x0, noise = torch.rand(SHAPE, generator=g) * 2 - 1, torch.randn(SHAPE, generator=g)
    t = torch.tensor([0, 50, T - 1])
    ref = diffusers.DDPMScheduler(num_train_timesteps=T, beta_schedule=KINDS[kind]).add_noise(x0, noise, t)
    assert (q_sample(make_schedule(kind, T), x0, t, noise) - ref).abs().max() <= ATOL


@pytest.mark.parametrize("clip", [True, False])
@pytest.mark.parametrize("pred_type", list(PRED))
def test_ddpm_full_chain(kind: str, pred_type: str, clip: bool) -> None:
    schedule = make_schedule(kind, T)
    model = fake_model(pred_type, schedule)
    ref = diffusers.DDPMScheduler(
        num_train_timesteps=T, beta_schedule=KINDS[kind], prediction_type=PRED[pred_type], clip_sample=clip
    )
    # Same seed, same draw order: diffusers draws the init noise, then one variance noise per step with t > 0.
    g = torch.Generator().manual_seed(7)
    x = torch.randn(SHAPE, generator=g)
    for t in ref.timesteps:
        x = ref.step(model(x, t.expand(SHAPE[0])), int(t), x, generator=g).prev_sample
    ours = DDPMSampler(schedule, pred_type=pred_type, clip_sample=clip)
    y = ours.sample(model, SHAPE, generator=torch.Generator().manual_seed(7))
    assert (x - y).abs().max() <= ATOL


@pytest.mark.parametrize("eta", [0.0, 1.0])
@pytest.mark.parametrize("num_steps", [1, 5, 10, 100])
@pytest.mark.parametrize("clip", [True, False])
@pytest.mark.parametrize("pred_type", list(PRED))
def test_ddim_chain(kind: str, pred_type: str, clip: bool, num_steps: int, eta: float) -> None:
    _check_ddim(kind, pred_type, clip, num_steps, eta)


@pytest.mark.parametrize(
    "extra",
    [
        {"timestep_spacing": "trailing"},
        {"set_alpha_to_one": False},
        {"steps_offset": 1},
        {"steps_offset": 1, "set_alpha_to_one": False},
    ],
)
def test_ddim_spacing_options(kind: str, extra: dict) -> None:
    for num_steps in (4, 10):
        _check_ddim(kind, "epsilon", True, num_steps, 1.0, **extra)


def test_ddim_generator_draws_match(kind: str) -> None:
    """With eta > 0 a generator (not passed-in noise) gives diffusers' numbers too."""
    schedule = make_schedule(kind, T)
    model = fake_model("epsilon", schedule)
    ref = diffusers.DDIMScheduler(num_train_timesteps=T, beta_schedule=KINDS[kind])
    ref.set_timesteps(10)
    g = torch.Generator().manual_seed(3)
    x = torch.randn(SHAPE, generator=g)
    for t in ref.timesteps:
        x = ref.step(model(x, t.expand(SHAPE[0])), int(t), x, eta=0.5, generator=g).prev_sample
    y = DDIMSampler(schedule, num_steps=10, eta=0.5).sample(model, SHAPE, generator=torch.Generator().manual_seed(3))
    assert (x - y).abs().max() <= ATOL


def _check_ddim(kind: str, pred_type: str, clip: bool, num_steps: int, eta: float, **extra) -> None:
    schedule = make_schedule(kind, T)
    model = fake_model(pred_type, schedule)
    ref = diffusers.DDIMScheduler(
        num_train_timesteps=T, beta_schedule=KINDS[kind], prediction_type=PRED[pred_type], clip_sample=clip, **extra
    )
    ref.set_timesteps(num_steps)
    ours = DDIMSampler(schedule, num_steps=num_steps, eta=eta, pred_type=pred_type, clip_sample=clip, **extra)
    assert ours.timesteps.tolist() == ref.timesteps.tolist()

    g = torch.Generator().manual_seed(num_steps)
    init, step_noise = torch.randn(SHAPE, generator=g), torch.randn((num_steps, *SHAPE), generator=g)
    x = init.clone()
    for i, t in enumerate(ref.timesteps):
        noise = step_noise[i] if eta > 0 else None
        x = ref.step(model(x, t.expand(SHAPE[0])), int(t), x, eta=eta, variance_noise=noise).prev_sample
    y = ours.sample(model, SHAPE, init_noise=init, step_noise=step_noise)
    assert (x - y).abs().max() <= ATOL
