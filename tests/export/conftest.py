"""Shared exports for the export tests: one tiny policy of every kind, exported once per session.

Exports are the slow part (several seconds each on two cores), so every test reads these: a multimodal diffusion
policy (rgb, depth, joints, force and an instruction; transformer denoiser on the fused tokens; stochastic DDIM, so
its graph takes step noise), and state policies for the other kinds (gaussian exported through ``dmrl export``,
VAE with sampled z, the two-step student).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch
from export_helpers import LANG, Exported, multimodal_policy, state_policy

from dmrl.cli import main
from dmrl.export import export_onnx
from dmrl.models import LanguageEncoder
from dmrl.policies import POLICIES
from dmrl.policies.checkpoint import save_policy
from dmrl.policies.gaussian import GaussianPolicyConfig
from dmrl.policies.vae import VAEPolicyConfig

pytest.importorskip("onnxruntime")


@pytest.fixture(scope="session")
def text() -> Iterator[LanguageEncoder]:
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    yield LanguageEncoder(LANG)
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def exported(tmp_path_factory: pytest.TempPathFactory, text: LanguageEncoder) -> dict[str, Exported]:
    """kind -> its export: "multimodal-diffusion", "gaussian" (by the CLI, from a checkpoint), "vae", "student"."""
    root = tmp_path_factory.mktemp("exports")
    out: dict[str, Exported] = {}
    mm = multimodal_policy(text)
    out["multimodal-diffusion"] = Exported(mm, root / "mm.onnx", export_onnx(mm, root / "mm.onnx", batch_size=2), 2)
    vae = state_policy("vae", VAEPolicyConfig(hidden=32, depth=1, latent_dim=4))
    out["vae"] = Exported(vae, root / "vae.onnx", export_onnx(vae, root / "vae.onnx"), 1)
    if "student" in POLICIES:
        from dmrl.policies.student import StudentPolicyConfig

        cfg = StudentPolicyConfig(steps=2, denoiser_kwargs={"hidden_dim": 32, "n_blocks": 1}, teacher_steps=4)
        student = state_policy("student", cfg)
        out["student"] = Exported(student, root / "st.onnx", export_onnx(student, root / "st.onnx"), 1)
    gaussian = state_policy("gaussian", GaussianPolicyConfig(hidden=32, depth=1))
    ckpt = save_policy(root / "run" / "checkpoint", gaussian, {"env_id": "dmrl/MultiPathGrasp-v0"})
    assert main(["export", "--checkpoint", str(ckpt)]) == 0
    out["gaussian"] = Exported(gaussian, ckpt / "policy.onnx", None, 1)
    return out
