"""Actions outside [-1, 1] (imported in a robot's own units) come back from a policy in those units, clipped to the
range its checkpoint's normaliser saw; dmrl's own [-1, 1] data is clipped to [-1, 1] as before."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from dmrl.data import Normalizer
from dmrl.policies import POLICIES, build_policy
from dmrl.policies.base import ChunkConfig
from dmrl.policies.checkpoint import load_policy, save_policy


def _policy(low: np.ndarray, high: np.ndarray, name: str = "gaussian"):
    acts = np.stack([low, high, (low + high) / 2]).astype(np.float32)
    norm = Normalizer.fit({"state": np.random.default_rng(0).normal(size=(8, 3)).astype(np.float32), "actions": acts})
    chunk = ChunkConfig(obs_keys=("state",), n_obs_steps=1, horizon=4, n_action_steps=2)
    return build_policy(name, chunk, POLICIES[name][1](), {"state": 3}, len(low), norm)


@pytest.mark.parametrize(
    ("low", "high", "want_low", "want_high"),
    [
        ([0.0, -3.0], [5.0, 2.0], [-1.0, -3.0], [5.0, 2.0]),  # robot units: the data range, at least [-1, 1]
        ([-0.5, -1.0], [0.5, 1.0], [-1.0, -1.0], [1.0, 1.0]),  # dmrl's env units: [-1, 1] as before
    ],
)
def test_predict_chunk_clips_to_the_checkpoint_bounds(tmp_path, low, high, want_low, want_high):
    policy = _policy(np.array(low), np.array(high))
    lo, hi = policy.action_bounds()
    assert torch.allclose(lo, torch.tensor(want_low)) and torch.allclose(hi, torch.tensor(want_high))
    save_policy(tmp_path, policy)
    loaded, _ = load_policy(tmp_path)  # the bounds come from the saved normaliser buffers alone
    for p in (policy, loaded):
        for normalised, expect in ((1.0, high), (-1.0, low), (3.0, want_high), (-3.0, want_low)):
            p.sample_chunk = lambda cond, mask=None, *a, v=normalised, **k: torch.full((cond.shape[0], 4, 2), v)
            out = p.predict_chunk({"state": torch.zeros(1, 1, 3)})
            assert torch.allclose(out[0, 0], torch.tensor(expect, dtype=torch.float32), atol=1e-5), (normalised, out)
        p.reset()
        a = p.act({"state": np.zeros(3, np.float32)})  # act() hands the same units to the robot
        assert a.shape == (2,) and np.allclose(a, want_low, atol=1e-5)


def test_every_planner_hands_out_the_same_units():
    """Best-of-N with a critic, the ONNX graph's module and the policy server's planner use the same bounds as
    predict_chunk (a chunk of +-3 in normalised units comes back as the data range, not cut at 1)."""
    from dmrl.algos.best_of_n import CriticRankedPolicy
    from dmrl.export.graphs import ChunkGraph, input_spec
    from dmrl.serve.session import PolicyHost

    policy = _policy(np.array([0.0, -3.0]), np.array([5.0, 2.0]), name="diffusion").eval()
    policy.sample_chunk = lambda cond, mask=None, *a, **k: torch.full((cond.shape[0], 4, 2), 3.0)
    obs = {"state": torch.zeros(1, 1, 3)}
    want = torch.tensor([5.0, 2.0])

    class Critic(torch.nn.Module):
        def executed(self, chunk):
            return chunk

        def forward(self, obs, chunk):
            return chunk.new_zeros(1, chunk.shape[0])

    ranked = CriticRankedPolicy(policy, Critic(), 2)
    assert torch.allclose(ranked.predict_chunk(obs)[0, 0], want)
    assert torch.allclose(PolicyHost(policy).torch_planner(torch.Generator())(obs)[0, 0], want)
    graph = ChunkGraph(policy)
    spec = input_spec(policy, 1)
    args = [obs["state"] if k == "state" else torch.zeros(s) for k, (s, _) in spec.items()]
    assert torch.allclose(graph(*args)[0, 0], want)
