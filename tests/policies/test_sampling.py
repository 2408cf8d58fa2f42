"""sample_chunk: one loop with and without gradients, bit-identical to the DDIM sampler run on its own."""

from __future__ import annotations

import pytest
import torch

from dmrl.models.proprio import LowDimEncoderConfig
from dmrl.policies import ChunkConfig, DiffusionPolicyConfig, GaussianPolicyConfig, VAEPolicyConfig, build_policy

CHUNK = ChunkConfig(n_obs_steps=2, horizon=8, n_action_steps=4, encoder=LowDimEncoderConfig(width=16, depth=1))
S = 4


def _diffusion(eta: float, prediction_type: str = "hybrid", sample_head: str = "both"):
    torch.manual_seed(0)
    cfg = DiffusionPolicyConfig(
        denoiser_kwargs={"hidden_dim": 32, "n_blocks": 1},
        num_train_steps=20,
        num_inference_steps=S,
        ddim_eta=eta,
        prediction_type=prediction_type,
        sample_head=sample_head,
    )
    policy = build_policy("diffusion", CHUNK, cfg, {"state": 5}, 3)
    with torch.no_grad():  # the output layer starts at zero: give it weights, so the steps differ
        for p in policy.denoiser.parameters():
            if not p.abs().sum():
                p.normal_(0, 0.1)
    return policy


def _cond(policy, b: int = 3):
    return policy.encode({"state": torch.randn(b, 2, 5, generator=torch.Generator().manual_seed(1))})


SETTINGS = [(0.0, "hybrid", "both"), (1.0, "hybrid", "blend"), (0.5, "epsilon", "both"), (0.7, "hybrid", "x0")]


@pytest.mark.parametrize(("eta", "prediction_type", "head"), SETTINGS)
@pytest.mark.parametrize("k", range(S + 1))
def test_every_grad_steps_gives_the_samplers_chunk_bit_for_bit(eta, prediction_type, head, k):
    policy = _diffusion(eta, prediction_type, head)
    cond = _cond(policy)
    with torch.no_grad():  # the reference: the sampler's own loop, as predict_chunk ran it before sample_chunk
        expected = policy.sampler.sample(
            policy.denoise_fn(cond), (3, 8, 3), generator=torch.Generator().manual_seed(7), device=cond.device
        )
    got = policy.sample_chunk(cond, grad_steps=k, generator=torch.Generator().manual_seed(7))
    assert torch.equal(got, expected)
    assert got.requires_grad == (k > 0)
    # torch's global RNG, as predict_chunk draws: the same stream in the same order.
    torch.manual_seed(3)
    with torch.no_grad():
        expected = policy.sampler.sample(policy.denoise_fn(cond), (3, 8, 3), device=cond.device)
    torch.manual_seed(3)
    assert torch.equal(policy.sample_chunk(cond, grad_steps=k), expected)


def test_passed_in_noise_gives_the_samplers_chunk():
    policy = _diffusion(1.0)
    cond = _cond(policy, 2)
    init, steps = torch.randn(2, 8, 3), torch.randn(S, 2, 8, 3)
    with torch.no_grad():
        expected = policy.sampler.sample(policy.denoise_fn(cond), (2, 8, 3), init_noise=init, step_noise=steps)
    assert torch.equal(policy.sample_chunk(cond, grad_steps=2, init_noise=init, step_noise=steps), expected)


def test_predict_chunk_is_the_unnormalised_sample_chunk():
    policy = _diffusion(1.0)
    obs = {"state": torch.randn(2, 2, 5)}
    torch.manual_seed(5)
    got = policy.predict_chunk(obs)
    torch.manual_seed(5)
    with torch.no_grad():
        expected = policy.normalizer.unnormalize("actions", policy.sample_chunk(*policy.condition(obs)))
    assert torch.equal(got, expected.clamp(-1, 1))


@pytest.mark.parametrize("name", ["gaussian", "vae"])
def test_one_step_policies_read_grad_steps_as_with_or_without_gradients(name):
    cfg = GaussianPolicyConfig(hidden=16, depth=1) if name == "gaussian" else VAEPolicyConfig(hidden=16, depth=1)
    policy = build_policy(name, CHUNK, cfg, {"state": 5}, 3)
    cond = _cond(policy)
    torch.manual_seed(2)
    without = policy.sample_chunk(cond)
    torch.manual_seed(2)
    with_grad = policy.sample_chunk(cond, grad_steps=1)
    assert not without.requires_grad and with_grad.requires_grad and torch.equal(without, with_grad)
    with pytest.raises(ValueError, match="grad_steps: got 2; allowed 0 or 1"):
        policy.sample_chunk(cond, grad_steps=2)


def test_vae_latent_comes_from_the_generator_or_the_global_rng():
    policy = build_policy("vae", CHUNK, VAEPolicyConfig(hidden=16, depth=1), {"state": 5}, 3)
    cond = _cond(policy).detach()
    a = policy.sample_chunk(cond, generator=torch.Generator().manual_seed(4))
    b = policy.sample_chunk(cond, generator=torch.Generator().manual_seed(4))
    assert torch.equal(a, b)
    torch.manual_seed(9)  # None: the global stream, drawn as randn_like(z) drew it before the generator argument
    z = torch.randn_like(torch.zeros(3, policy.config.latent_dim))
    expected = policy.decoder(torch.cat([cond, z], -1)).reshape(3, 8, 3)
    torch.manual_seed(9)
    assert torch.equal(policy.sample_chunk(cond), expected.detach())
