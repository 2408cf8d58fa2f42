"""A policy trains a few steps on each imported store and acts in the data's own units; where an env exists
(a dmrl task exported to LeRobot and imported back under its env id) ``dmrl eval`` runs the checkpoint."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from fixtures import write_robomimic

from dmrl.cli import main
from dmrl.data import EpisodeStore
from dmrl.policies.checkpoint import load_policy

# A tiny multimodal policy over two stacked 32 x 32 cameras + joints (as tests/train/test_multimodal_cli.py).
TINY_MM = [
    "--chunk.encoder.type", "multimodal",
    "--chunk.obs-keys", "rgb", "joints",
    "--chunk.encoder.dim", "32",
    "--chunk.encoder.vit.width", "32",
    "--chunk.encoder.vit.depth", "1",
    "--chunk.encoder.vit.n-heads", "2",
    "--chunk.encoder.perceiver.n-latents", "4",
    "--chunk.encoder.perceiver.n-heads", "2",
    "--chunk.encoder.perceiver.n-layers", "1",
]  # fmt: skip
SHORT = ["--steps", "2", "--batch-size", "4", "--chunk.horizon", "4", "--chunk.n-action-steps", "2"]


@pytest.fixture(autouse=True)
def one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def test_train_multimodal_on_imported_lerobot_store_acts_in_robot_units(lerobot_ds, tmp_path):
    root, _ = lerobot_ds
    data, run = tmp_path / "d.zarr", tmp_path / "run"
    assert main(["data", "import", str(root), "--out", str(data)]) == 0
    assert (
        main(["train", "--dataset", str(data), "--out", str(run), *SHORT, *TINY_MM, "--policy.type", "gaussian"]) == 0
    )
    policy, _ = load_policy(run / "checkpoint")
    store = EpisodeStore.open(data)
    low, high = (np.asarray(store.attrs["action_range"][k], np.float32) for k in ("low", "high"))
    lo, hi = (b.numpy() for b in policy.action_bounds())
    assert np.allclose(lo, np.minimum(low, -1), atol=1e-4) and np.allclose(hi, np.maximum(high, 1), atol=1e-4)
    assert hi.max() > 5  # the checkpoint keeps the robot's range, not [-1, 1]
    ep = store.episode(1)
    action = policy.act({"rgb": ep.obs["rgb"][0], "joints": ep.obs["joints"][0]})
    assert action.shape == (3,) and np.all(action >= lo - 1e-5) and np.all(action <= hi + 1e-5)


def test_train_on_imported_hdf5_store(tmp_path):
    src, data, run = tmp_path / "lift.hdf5", tmp_path / "d.zarr", tmp_path / "run"
    write_robomimic(src, lengths=(8, 6, 7))
    assert main(["data", "import", str(src), "--out", str(data), "--rgb", "none"]) == 0
    args = ["--chunk.obs-keys", "joints", "--policy.num-inference-steps", "2"]
    assert main(["train", "--dataset", str(data), "--out", str(run), *SHORT, *args]) == 0
    lines = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert lines[-1]["step"] == 2 and np.isfinite(lines[-1]["loss"])


def test_dmrl_task_through_lerobot_then_eval(tmp_path):
    collected, lerobot, data, run = (tmp_path / n for n in ("c.zarr", "lr", "i.zarr", "run"))
    env = "dmrl/MultiPathReach-v0"
    assert main(["collect", "--out", str(collected), "--env", env, "--episodes", "2", "--workers", "0"]) == 0
    assert main(["data", "export", str(collected), "--out", str(lerobot), "--fps", "10"]) == 0
    imp = [
        "data",
        "import",
        str(lerobot),
        "--out",
        str(data),
        "--env-id",
        env,
        "--state",
        "observation.environment_state",
    ]
    assert main([*imp, "--joints", "observation.state", "--force", "observation.force"]) == 0
    a, b = EpisodeStore.open(collected), EpisodeStore.open(data)
    assert b.instructions() == a.instructions()
    for key in ("state", "joints", "force"):
        assert np.array_equal(a.array(key)[: a.n_steps], b.array(key)[: b.n_steps])
    assert np.array_equal(a.array("actions")[: a.n_steps], b.array("actions")[: b.n_steps])
    args = ["--chunk.obs-keys", "joints", "force", "--policy.num-inference-steps", "2"]
    assert main(["train", "--dataset", str(data), "--out", str(run), *SHORT, *args]) == 0
    assert (
        main(["eval", "--checkpoint", str(run / "checkpoint"), "--episodes", "1", "--envs", "1", "--gif-episodes", "0"])
        == 0
    )
    result = json.loads((run / "eval" / "eval.json").read_text())
    assert result["episodes"] == 1 and 0.0 <= result["success_rate"] <= 1.0
