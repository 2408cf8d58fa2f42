"""Tiny actors, critics and chunk-transition batches for the algorithm tests (state (5,), Da 3, To 2, Tp 8, Ta 4)."""

from __future__ import annotations

import torch

from dmrl.algos import ChunkCritic, CriticConfig
from dmrl.models.proprio import LowDimEncoderConfig
from dmrl.policies import ChunkConfig, DiffusionPolicyConfig, GaussianPolicyConfig, build_policy
from dmrl.train.engine import Engine, EngineConfig

CHUNK = ChunkConfig(n_obs_steps=2, horizon=8, n_action_steps=4, encoder=LowDimEncoderConfig(width=16, depth=1))
OBS_DIMS = {"state": 5}
DA = 3


def diffusion_actor(steps: int = 4, eta: float = 0.0):
    cfg = DiffusionPolicyConfig(
        denoiser_kwargs={"hidden_dim": 32, "n_blocks": 1},
        num_train_steps=20,
        num_inference_steps=steps,
        ddim_eta=eta,
        prediction_type="hybrid",  # explicit: the tests' fixed batches were chosen with it
    )
    return build_policy("diffusion", CHUNK, cfg, OBS_DIMS, DA)


def gaussian_actor():
    return build_policy("gaussian", CHUNK, GaussianPolicyConfig(hidden=16, depth=1), OBS_DIMS, DA)


def tiny_critic(actor, n_critics: int = 2, **kw) -> ChunkCritic:
    return ChunkCritic(actor, CriticConfig(n_critics=n_critics, hidden=32, depth=2, **kw))


def engine() -> Engine:
    return Engine(EngineConfig(device="cpu", precision="fp32", grad_clip=1.0))


def batch(b: int = 8, seed: int = 0) -> dict:
    """A chunk-transition batch as ChunkTransitionDataset + DataLoader give it (raw actions in [-1, 1])."""
    g = torch.Generator().manual_seed(seed)
    return {
        "obs": {"state": torch.randn(b, 2, 5, generator=g)},
        "next_obs": {"state": torch.randn(b, 2, 5, generator=g)},
        "action": torch.rand(b, 8, DA, generator=g) * 2 - 1,
        "action_mask": torch.ones(b, 8, dtype=torch.bool),
        "reward": torch.randn(b, 4, generator=g),
        "done": torch.zeros(b, 4, dtype=torch.bool),
        "valid": torch.ones(b, 4, dtype=torch.bool),
        "next_valid": torch.ones(b, dtype=torch.bool),
    }
