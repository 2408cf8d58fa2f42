"""Fixtures of the policy server tests: a tiny state diffusion checkpoint and a server on a free localhost port."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from dmrl.policies import build_policy
from dmrl.policies.base import ChunkConfig
from dmrl.policies.checkpoint import load_policy, save_policy
from dmrl.policies.diffusion import DiffusionPolicyConfig

pytest.importorskip("websockets")
pytest.importorskip("msgpack")

from serve_helpers import ACTION_DIM, STATE_DIM


@pytest.fixture(scope="session")
def state_checkpoint(tmp_path_factory) -> Path:
    """A state diffusion policy (To 2, Tp 8, Ta 4, stochastic DDIM-3 so every step draws noise), saved.

    Random weights (std 0.1, the zero-initialised head opened) stand in for training: what the server must keep
    is the policy's numbers, whatever they are, and random weights make every chunk depend on obs and noise."""
    torch.manual_seed(0)
    cfg = DiffusionPolicyConfig(
        denoiser_kwargs={"hidden_dim": 32, "n_blocks": 1}, num_train_steps=10, num_inference_steps=3, ddim_eta=1.0
    )
    chunk = ChunkConfig(obs_keys=("state",), n_obs_steps=2, horizon=8, n_action_steps=4)
    policy = build_policy("diffusion", chunk, cfg, {"state": STATE_DIM}, ACTION_DIM)
    for q in policy.parameters():
        torch.nn.init.normal_(q, std=0.1)
    return save_policy(tmp_path_factory.mktemp("serve") / "checkpoint", policy)


@pytest.fixture(scope="module")
def server(state_checkpoint) -> Iterator:
    """A running in-process server of the state checkpoint (4 clients at most, requests up to 64 KiB)."""
    from dmrl.serve.server import PolicyServer
    from dmrl.serve.session import PolicyHost

    torch.set_num_threads(1)
    host = PolicyHost(load_policy(state_checkpoint)[0])
    with PolicyServer(host, port=0, max_clients=4, max_mb=1 / 16) as s:
        yield s
