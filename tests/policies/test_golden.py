"""Golden checkpoints (tests/artifacts/): saved by an earlier dmrl, they must load and predict the same chunks."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from dmrl.config_utils import from_dict
from dmrl.models.multimodal import MultimodalEncoderConfig, MultimodalGeometry
from dmrl.policies import ChunkConfig
from dmrl.policies.checkpoint import FORMAT, load_policy, upgrade_config
from dmrl.policies.observations import checked_obs_dims, multimodal_geometry

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


def test_format_1_multimodal_config_with_instruction_migrates():
    """Format 1 -> 2: chunk.{encoder_type, multimodal, language} -> chunk.encoder {type: multimodal, ...,
    language}; the geometry the data decides is dropped (format 2 reads it off obs_keys, To and obs_dims)."""
    old = json.loads((ART / "format1_multimodal_instruction_config.json").read_text())
    assert old["format"] == 1 and old["chunk"]["encoder_type"] == "multimodal"
    new = upgrade_config(old)
    assert new["format"] == FORMAT and old["format"] == 1, "the caller's dict stays as read"
    enc = new["chunk"]["encoder"]
    assert enc["type"] == "multimodal" and enc["dim"] == old["chunk"]["multimodal"]["dim"] == 32
    assert enc["language"] == {k: v for k, v in old["chunk"]["language"].items() if k != "cache_size"}
    assert enc["experimental"] == {"instruction_pool": "mean"}
    assert not {"encoder_type", "multimodal", "language"} & set(new["chunk"])
    assert not {"modalities", "n_obs_steps", "image_size", "n_cameras", "joints_dim", "force_dim"} & set(enc)
    chunk = from_dict(ChunkConfig, new["chunk"], "chunk")
    assert isinstance(chunk.encoder, MultimodalEncoderConfig) and chunk.encoder.language.out_dim == 32
    assert chunk.encoder.instruction_queries and chunk.encoder.proprio_skip and chunk.aux_state == (7, 8, 9)
    geometry = multimodal_geometry(chunk.obs_keys, chunk.n_obs_steps, checked_obs_dims(new["obs_dims"], chunk.obs_keys))
    mm = old["chunk"]["multimodal"]
    assert geometry == MultimodalGeometry(
        tuple(mm["modalities"]), mm["n_obs_steps"], tuple(mm["image_size"]), mm["n_cameras"], mm["joints_dim"],
        mm["force_dim"],
    )  # fmt: skip
