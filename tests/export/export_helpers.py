"""Helpers of the export tests: tiny policies of every kind (the fixtures in conftest.py export them once).

Exports are the slow part (several seconds each on two cores), so every test reads these: a multimodal diffusion
policy (rgb, depth, joints, force and an instruction; transformer denoiser on the fused tokens; stochastic DDIM, so
its graph takes step noise), and state policies for the other kinds (gaussian exported through ``dmrl export``,
VAE with sampled z, the two-step student).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from dmrl.export import ExportReport
from dmrl.models import (
    DepthConfig,
    LanguageConfig,
    LanguageEncoder,
    MultimodalEncoderConfig,
    PerceiverConfig,
    ViTConfig,
)
from dmrl.policies import ChunkConfig, DiffusionPolicyConfig, build_policy

pytest.importorskip("onnxruntime")

STATE_DIM, ACTION_DIM = 31, 6  # MultiPathGrasp-v0 with 3 cups: state (31,), action (6,)
HW, TO, TP, TA, DA = 16, 2, 8, 4, 3
MM_DIMS = {"rgb": (3, HW, HW), "depth": (1, HW, HW), "joints": 6, "force": 4}
MM_KEYS = ("rgb", "depth", "joints", "force", "instruction")
LANG = LanguageConfig(out_dim=32, max_tokens=12, trainable_layers=0)
TEXTS = ("pick up the red cup", "move the blue mug to the pad", "grab the green cup")


@dataclass
class Exported:
    """A policy, its graph and the export's report (the sidecar is ``path.json``)."""

    policy: torch.nn.Module
    path: Path
    report: ExportReport | None
    batch: int

    @property
    def sidecar(self) -> dict:
        return json.loads(Path(f"{self.path}.json").read_text())


def randomise(policy: torch.nn.Module) -> torch.nn.Module:
    """Random weights everywhere: a zero-initialised output layer would make every chunk the same constant."""
    torch.manual_seed(0)
    for q in policy.parameters():
        if q.requires_grad or not q.any():
            torch.nn.init.normal_(q, std=0.1)
    return policy.eval()


def state_policy(name: str, config) -> torch.nn.Module:  # noqa: ANN001
    torch.manual_seed(0)
    chunk = ChunkConfig(obs_keys=("state",), horizon=8, n_action_steps=4)
    return randomise(build_policy(name, chunk, config, {"state": STATE_DIM}, ACTION_DIM))


def multimodal_policy(text: LanguageEncoder) -> torch.nn.Module:
    mm = MultimodalEncoderConfig(
        dim=32,
        vit=ViTConfig(width=32, depth=1, n_heads=2, patch_size=8),
        depth=DepthConfig(width=16, depth=1, n_heads=2, patch_size=8),
        perceiver=PerceiverConfig(n_latents=4, n_heads=2, n_layers=1),
        language=LANG,
    )
    chunk = ChunkConfig(obs_keys=MM_KEYS, n_obs_steps=TO, horizon=TP, n_action_steps=TA, encoder=mm)
    cfg = DiffusionPolicyConfig(
        denoiser="transformer",
        denoiser_kwargs={"d_model": 32, "n_layers": 1, "n_heads": 2},
        num_train_steps=10,
        num_inference_steps=2,
        ddim_eta=1.0,
    )
    torch.manual_seed(0)
    policy = build_policy("diffusion", chunk, cfg, MM_DIMS, DA, text_encoder=text)
    before = {k: v.clone() for k, v in text.state_dict().items()}
    randomise(policy)
    text.load_state_dict(before)  # keep MiniLM's real weights: only the policy's own layers get random ones
    return policy
