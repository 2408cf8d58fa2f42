"""Contracts of every registered policy, the receding-horizon queue, save/load, and the two-mode learning test."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from teachers import with_teacher

from dmrl.data import Normalizer
from dmrl.policies import POLICIES, ChunkConfig, build_policy
from dmrl.policies.checkpoint import load_policy, save_policy

OBS = {"state": 5}


def _batch(b: int = 4, seed: int = 0) -> dict:
    g = torch.Generator().manual_seed(seed)
    return {
        "obs": {"state": torch.randn(b, 2, 5, generator=g)},
        "action": torch.rand(b, 16, 3, generator=g) * 2 - 1,
        "action_mask": torch.ones(b, 16, dtype=torch.bool),
    }


@pytest.fixture(autouse=True)
def _one_thread():
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.mark.parametrize("name", sorted(POLICIES))
def test_contract_shapes_and_gradients(name):
    policy = with_teacher(build_policy(name, ChunkConfig(), POLICIES[name][1](), OBS, 3))
    opt = torch.optim.Adam(policy.parameters(), lr=1e-3)
    for _ in range(2):  # the diffusion denoiser's output layer starts at zero: one step opens the path
        out = policy.loss(_batch())
        assert out["loss"].ndim == 0 and torch.isfinite(out["loss"])
        opt.zero_grad()
        out["loss"].backward()
        opt.step()
    grads = [p.grad for p in policy.parameters() if p.requires_grad]
    assert sum(g is not None and g.abs().sum() > 0 for g in grads) >= len(grads) // 2
    chunk = policy.predict_chunk({"state": torch.randn(3, 2, 5)})
    assert chunk.shape == (3, 16, 3) and chunk.abs().max() <= 1.0
    a = policy.act({"state": np.zeros(5, dtype=np.float32)})
    assert a.shape == (3,) and a.dtype == np.float32
    policy.reset()
    a = policy.act({"state": np.zeros((2, 5), dtype=np.float32)})
    assert a.shape == (2, 3)


def test_missing_observation_key_raises():
    policy = build_policy("gaussian", ChunkConfig(), POLICIES["gaussian"][1](), OBS, 3)
    with pytest.raises(KeyError, match="state"):
        policy.loss({"obs": {"joints": torch.zeros(2, 2, 5)}, "action": torch.zeros(2, 16, 3)})


def test_receding_horizon_queue_replans_every_ta_steps():
    chunk = ChunkConfig(n_obs_steps=2, horizon=16, n_action_steps=8)
    policy = build_policy("gaussian", chunk, POLICIES["gaussian"][1](), OBS, 3)
    calls = []
    original = policy.predict_chunk

    def counting(obs):
        calls.append(obs["state"].shape[0])
        return original(obs)

    policy.predict_chunk = counting
    obs = {"state": np.zeros((2, 5), dtype=np.float32)}
    for _ in range(17):
        policy.act(obs)
    assert calls == [2, 2, 2], "one plan per Ta = 8 steps for both envs"
    policy.reset(mask=np.array([False, True]))
    policy.act(obs)
    assert calls[-1] == 1, "only the env that was reset replans"


def test_history_uses_first_frame_padding_and_chunk_offset():
    chunk = ChunkConfig(n_obs_steps=2, horizon=4, n_action_steps=2)
    policy = build_policy("gaussian", chunk, POLICIES["gaussian"][1](), {"state": 1}, 1)
    seen = []
    policy.predict_chunk = lambda obs: (
        seen.append(obs["state"].clone()),
        torch.arange(4.0).reshape(1, 4, 1).expand(obs["state"].shape[0], 4, 1),
    )[1]
    actions = [float(policy.act({"state": np.array([float(t)], dtype=np.float32)})[0]) for t in range(4)]
    assert seen[0].flatten().tolist() == [0.0, 0.0], "a fresh episode repeats its first frame"
    assert seen[1].flatten().tolist() == [1.0, 2.0]
    assert actions == [1.0, 2.0, 1.0, 2.0], "execution starts at chunk index To-1 (the current step)"


@pytest.mark.parametrize("name", sorted(POLICIES))
def test_save_load_gives_identical_actions(tmp_path, name):
    norm = Normalizer()
    norm.set("state", np.full(5, 0.5), np.zeros(5), "limits")
    norm.set("actions", np.full(3, 2.0), np.full(3, 0.1), "limits")
    policy = build_policy(name, ChunkConfig(), POLICIES[name][1](), OBS, 3, norm).eval()
    save_policy(tmp_path / "ckpt", policy, {"env_id": "x"})
    loaded, meta = load_policy(tmp_path / "ckpt")
    assert meta["env_id"] == "x"
    obs = {"state": torch.randn(2, 2, 5)}
    torch.manual_seed(3)
    a = policy.predict_chunk(obs)
    torch.manual_seed(3)
    b = loaded.predict_chunk(obs)
    assert torch.equal(a, b)


def test_load_errors_are_one_line(tmp_path):
    with pytest.raises(FileNotFoundError, match="config.json"):
        load_policy(tmp_path)
    policy = build_policy("gaussian", ChunkConfig(), POLICIES["gaussian"][1](), OBS, 3)
    save_policy(tmp_path / "c", policy)
    (tmp_path / "c" / "policy.safetensors").write_bytes(b"garbage")
    with pytest.raises(ValueError, match="unreadable weights"):
        load_policy(tmp_path / "c")


def _fit_two_modes(name: str, steps: int = 400) -> torch.Tensor:
    """Fit a policy on chunks that are all +0.5 or all -0.5 (p = 0.5) for the same observation; sample 300."""
    torch.manual_seed(0)
    chunk = ChunkConfig(n_obs_steps=1, horizon=4, n_action_steps=2)
    cfg = POLICIES[name][1]()
    policy = build_policy(name, chunk, cfg, {"state": 2}, 2)
    opt = torch.optim.Adam(policy.parameters(), lr=1e-3)
    for _ in range(steps):
        sign = torch.where(torch.rand(128, 1, 1) < 0.5, -1.0, 1.0)
        batch = {"obs": {"state": torch.zeros(128, 1, 2)}, "action": 0.5 * sign.expand(128, 4, 2)}
        loss = policy.loss(batch)["loss"]
        opt.zero_grad()
        loss.backward()
        opt.step()
    policy.eval()
    return policy.predict_chunk({"state": torch.zeros(300, 1, 2)}).mean(dim=(1, 2))


def test_diffusion_keeps_both_modes_and_mlp_collapses_to_the_mean():
    diff = _fit_two_modes("diffusion")
    plus, minus = (diff > 0.3).float().mean(), (diff < -0.3).float().mean()
    between = (diff.abs() < 0.2).float().mean()
    assert plus > 0.25 and minus > 0.25, f"diffusion lost a mode: +{plus:.2f} / -{minus:.2f}"
    assert between < 0.1, f"diffusion put {between:.2f} of samples between the modes"
    mlp = _fit_two_modes("gaussian")
    assert (mlp.abs() < 0.2).float().mean() > 0.9, "the Gaussian MLP should output the average of the modes"


def test_hybrid_sampling_heads():
    from dmrl.policies import DiffusionPolicyConfig

    policy = build_policy("diffusion", ChunkConfig(), DiffusionPolicyConfig(prediction_type="hybrid"), OBS, 3).eval()
    obs = {"state": torch.randn(2, 2, 5)}
    for head in ("both", "eps", "x0", "blend"):
        policy.set_sampler(4, head=head)
        assert policy.predict_chunk(obs).shape == (2, 16, 3)
    with pytest.raises(ValueError, match="sample_head"):
        DiffusionPolicyConfig(prediction_type="epsilon", sample_head="x0")
    eps_policy = build_policy("diffusion", ChunkConfig(), DiffusionPolicyConfig(prediction_type="epsilon"), OBS, 3)
    with pytest.raises(ValueError, match="hybrid"):
        eps_policy.set_sampler(4, head="x0")


def test_noise_samples_repeat_each_condition_for_the_denoiser():
    from dmrl.policies.diffusion import DiffusionPolicyConfig

    torch.manual_seed(0)
    policy = build_policy("diffusion", ChunkConfig(), DiffusionPolicyConfig(noise_samples=3), OBS, 3)
    seen = []
    policy.denoiser.register_forward_hook(lambda m, args, out: seen.append((args[0], args[2])))
    out = policy.loss(_batch(b=4))
    x_t, cond = seen[0]
    assert x_t.shape == (12, 16, 3) and cond.shape == (12, policy.encoder.out_dim)
    rows = cond.view(4, 3, -1)
    assert torch.equal(rows, rows[:, :1].expand_as(rows)), "each observation's condition is repeated, in order"
    assert not torch.equal(x_t[0], x_t[1]), "with independent noise draws"
    assert torch.isfinite(out["loss"])
    with pytest.raises(ValueError, match="noise_samples"):
        DiffusionPolicyConfig(noise_samples=0)
