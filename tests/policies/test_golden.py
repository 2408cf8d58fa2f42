"""Golden checkpoints (tests/artifacts/): saved by an earlier dmrl, they must load and predict the same chunks."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from dmrl.policies.checkpoint import load_policy

ART = Path(__file__).resolve().parents[1] / "artifacts"


@pytest.mark.parametrize("name", ["diffusion", "gaussian", "vae"])
def test_golden_checkpoint_loads_and_predicts_the_saved_chunk(name):
    golden = load_file(str(ART / "golden_outputs.safetensors"))
    policy, _ = load_policy(ART / f"golden_{name}")
    assert policy.name == name
    torch.manual_seed(0)
    chunk = policy.predict_chunk({"state": golden["obs.state"]})
    assert chunk.shape == golden[name].shape == (4, 16, 3)
    # Not bit-exact: other CPUs may pick other kernels; a format or forward-pass change moves far more than this.
    torch.testing.assert_close(chunk, golden[name], atol=1e-5, rtol=1e-4)


def test_golden_multimodal_checkpoint_loads_and_predicts_the_saved_chunk():
    """A format-1 multimodal checkpoint (rgb, depth, joints, force; ViT, depth ViT, Perceiver, aux head)."""
    golden = load_file(str(ART / "golden_multimodal_outputs.safetensors"))
    policy, _ = load_policy(ART / "golden_multimodal")
    assert policy.chunk.obs_keys == ("rgb", "depth", "joints", "force")
    obs = {k.removeprefix("obs."): v for k, v in golden.items() if k.startswith("obs.")}
    torch.manual_seed(0)
    chunk = policy.predict_chunk(obs)
    assert chunk.shape == golden["chunk"].shape == (3, 8, 6)
    torch.testing.assert_close(chunk, golden["chunk"], atol=1e-5, rtol=1e-4)
