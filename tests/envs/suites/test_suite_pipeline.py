"""A suite env through the CLI as MultiPath goes: collect -> episode store -> 2-step trains -> eval.

(OGBench's store -> train path runs in test_suite_ogbench.py, from an .npz: its play episodes are 1001 steps.)"""

from __future__ import annotations

import json
import sys

import pytest

import dmrl  # noqa: F401  (first: it picks the headless GL backend, which MuJoCo reads once, at import)
from dmrl.cli import main
from dmrl.data import EpisodeStore

TRAIN = ["--steps", "2", "--batch-size", "4", "--chunk.horizon", "8", "--chunk.n-action-steps", "4"]


def test_metaworld_collect_train_eval(tmp_path):
    pytest.importorskip("metaworld", reason="Meta-World not installed (make install puts it in with --no-deps)")
    env, data = "metaworld/button-press-v3", tmp_path / "d.zarr"
    collect = ["collect", "--env", env, "--out", str(data), "--episodes", "1", "--workers", "0"]
    assert main([*collect, "--obs-modes", "rgb,joints,instruction,state"]) == 0
    store = EpisodeStore.open(data)
    assert store.attrs["env_id"] == env and store.success.all() and list(store.lengths) == [200]
    assert store.obs_spec["rgb"] == ((3, 84, 84), "uint8") and store.obs_spec["joints"][0] == (4,)
    assert store.attrs["action_meaning"] == ["dx", "dy", "dz", "gripper"]
    assert store.instructions()[0] in {"press the button", "push the button in"}  # a train paraphrase
    # From pixels: RGB + proprio through the multimodal encoder (ResNet: 84 is no multiple of ViT's patch 8).
    image = ["--chunk.obs-keys", "rgb", "joints", "--chunk.encoder.type", "multimodal", "--chunk.encoder.dim", "32"]
    image += ["--chunk.encoder.rgb-encoder", "resnet"]
    assert main(["train", "--dataset", str(data), "--out", str(tmp_path / "img"), *TRAIN, *image]) == 0
    assert (tmp_path / "img" / "checkpoint" / "policy.safetensors").is_file()
    # From the state, then a closed-loop evaluation on the env the store names.
    run = tmp_path / "state"
    assert main(["train", "--dataset", str(data), "--out", str(run), *TRAIN, "--chunk.obs-keys", "state"]) == 0
    ev = ["eval", "--checkpoint", str(run / "checkpoint"), "--episodes", "1", "--envs", "1", "--gif-episodes", "0"]
    assert main([*ev, "--inference-steps", "2"]) == 0
    result = json.loads((run / "eval" / "eval.json").read_text())
    assert result["env_id"] == env and result["episodes"] == 1 and result["mean_length"] == 200


@pytest.mark.parametrize(
    ("env", "module"),
    [
        ("metaworld/reach-v3", "metaworld.env_dict"),
        ("ogbench/cube-single-play-singletask-v0", "ogbench.manipspace.envs.cube_env"),
    ],
)
def test_missing_package_is_one_line(tmp_path, monkeypatch, capsys, env, module):
    monkeypatch.setitem(sys.modules, module, None)  # as if the suite were not installed
    out = tmp_path / "d.zarr"
    assert main(["collect", "--env", env, "--obs-modes", "state", "--out", str(out), "--workers", "0"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "install" in err[0] and not out.exists(), err
