"""The training loop gives the weights the code before it gave (commit 585fb9d, tests/artifacts/runs_585fb9d/): a
behaviour-cloning run with gradient accumulation and a Diffusion-QL run on the same synthetic store and seeds.

Bit-identical on the machine that made the artifacts; other CPUs may pick other kernels, hence a tolerance far below
what one optimizer step moves (a changed update order, noise draw or data order moves weights by ~1e-3)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from dmrl.cli import main
from state_store import state_store

ART = Path(__file__).resolve().parents[1] / "artifacts" / "runs_585fb9d"


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> Path:
    """8 episodes of 40 steps, state (5,), 3-D actions, random rewards; odd seeds terminate (as when made)."""
    return state_store(tmp_path_factory.mktemp("same") / "d.zarr", rewards=True)


COMMON = ["--source.val-fraction", "0", "--engine.device", "cpu", "--seed", "3", "--batch-size", "16"]
COMMON += ["--chunk.encoder.width", "32", "--engine.accumulate", "2"]
DIFFUSION = ["--policy.denoiser-kwargs", "hidden_dim", "32", "n_blocks", "1", "--policy.prediction-type", "hybrid"]


@pytest.mark.parametrize(
    "name, args",
    [
        ("bc_diffusion", ["--steps", "20", "--engine.save-every", "10"]),
        ("diffusion_ql", ["--algo.type", "diffusion-ql", "--steps", "10", "--algo.critic.hidden", "32"]),
    ],
)
def test_weights_match_the_code_before_the_one_loop(store, tmp_path, name, args):
    if name == "diffusion_ql":
        args = [*args, "--algo.critic.depth", "2"]
    out = tmp_path / name
    assert main(["train", "--dataset", str(store), "--out", str(out), *COMMON, *DIFFUSION, *args]) == 0
    now = load_file(str(out / "checkpoint" / "policy.safetensors"))
    before = load_file(str(ART / f"{name}.safetensors"))
    assert now.keys() == before.keys()
    for k in before:
        torch.testing.assert_close(now[k], before[k], rtol=0, atol=1e-6, msg=k)
