"""CLI smoke run from images + proprio + instruction: collect at 16 x 16, train the multimodal encoder for a few
steps, evaluate with every modality and with depth withheld (--drop-modality)."""

from __future__ import annotations

import json
from collections.abc import Iterator

import numpy as np
import pytest
import torch

from dmrl.cli import main
from dmrl.data import EpisodeStore, split_episodes

MODES = ["rgb", "depth", "joints", "force", "instruction"]
# A tiny multimodal policy: ViT and depth ViT of one block, 4 Perceiver latents, D = 32, frozen MiniLM.
TINY = [
    "--chunk.encoder.type", "multimodal",
    "--chunk.obs-keys", *MODES,
    "--chunk.horizon", "8",
    "--chunk.n-action-steps", "4",
    "--chunk.encoder.dim", "32",
    "--chunk.encoder.vit.width", "32",
    "--chunk.encoder.vit.depth", "1",
    "--chunk.encoder.vit.n-heads", "2",
    "--chunk.encoder.depth.width", "16",
    "--chunk.encoder.depth.depth", "1",
    "--chunk.encoder.depth.n-heads", "2",
    "--chunk.encoder.perceiver.n-latents", "4",
    "--chunk.encoder.perceiver.n-heads", "2",
    "--chunk.encoder.perceiver.n-layers", "1",
    "--chunk.encoder.language.out-dim", "32",
    "--chunk.encoder.language.trainable-layers", "0",
    "--policy.denoiser", "transformer",
    "--policy.denoiser-kwargs", "d_model", "32", "n_layers", "1", "n_heads", "2",
    "--policy.num-train-steps", "10",
    "--policy.num-inference-steps", "2",
]  # fmt: skip


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Iterator:
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("mm")
    data, out = root / "d.zarr", root / "run"
    collect = ["collect", "--out", str(data), "--episodes", "3", "--workers", "0", "--image-size", "16"]
    assert main([*collect, "--obs-modes", *MODES, "state"]) == 0  # state: the auxiliary targets only
    train = ["train", "--dataset", str(data), "--out", str(out), "--steps", "4", "--batch-size", "8"]
    aux = ["--chunk.aux-state", "7", "8", "9", "--chunk.pad-after", "6"]
    assert main([*train, "--source.val-every", "2", *aux, *TINY]) == 0
    yield out
    torch.set_num_threads(before)


def test_train_saves_a_self_contained_multimodal_checkpoint(run):
    cfg = json.loads((run / "checkpoint" / "config.json").read_text())
    assert cfg["obs_dims"] == {"rgb": [3, 16, 16], "depth": [1, 16, 16], "joints": 6, "force": 4}
    enc = cfg["chunk"]["encoder"]
    assert cfg["format"] == 2 and enc["type"] == "multimodal" and enc["language"]["out_dim"] == 32
    assert "image_size" not in enc and "modalities" not in enc, "the data decides them: read off obs_dims"
    assert cfg["meta"]["env_kwargs"] == {"image_size": 16, "cameras": ["front"], "n_objects": 3, "reward": "shaped"}
    lines = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert lines[-1]["step"] == 4 and "val_loss" in lines[-1]
    assert cfg["chunk"]["aux_state"] == [7, 8, 9] and all(x["aux"] > 0 for x in lines if "loss" in x)
    # pad_after = Tp - To (8 - 2 in TINY): one window per step of the training episodes
    summary = json.loads((run / "summary.json").read_text())
    lengths = np.diff(EpisodeStore.open(run.parent / "d.zarr", "r").episode_ends, prepend=0)
    run_cfg = json.loads((run / "config.json").read_text())
    train_eps, _ = split_episodes(len(lengths), run_cfg["source"]["val_fraction"], run_cfg["seed"])
    assert summary["train_episodes"] == len(train_eps) and summary["train_windows"] == lengths[train_eps].sum()


def test_eval_with_all_modalities_and_with_depth_dropped(run, capsys):
    base = ["eval", "--checkpoint", str(run / "checkpoint"), "--episodes", "2", "--envs", "1"]
    assert main([*base, "--gif-episodes", "1"]) == 0  # the GIF renders apart from the policy's 16 x 16 frames
    assert (run / "eval" / "rollouts.gif").is_file()
    full = json.loads((run / "eval" / "eval.json").read_text())
    assert full["episodes"] == 2 and full["dropped_modalities"] == [] and full["obs_keys"] == MODES
    assert main([*base, "--gif-episodes", "0", "--drop-modality", "depth"]) == 0
    dropped = json.loads((run / "eval_drop-depth" / "eval.json").read_text())
    assert dropped["episodes"] == 2 and dropped["dropped_modalities"] == ["depth"]
    capsys.readouterr()
    assert main([*base, "--drop-modality", "state"]) == 2  # a key the policy does not read
    assert "does not read it" in capsys.readouterr().err


def test_lowdim_encoder_with_images_is_a_one_line_error(run, capsys):
    data = run.parent / "d.zarr"
    args = ["train", "--dataset", str(data), "--out", str(run.parent / "bad"), "--chunk.obs-keys", "rgb", "joints"]
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert "chunk.encoder.type multimodal" in err and len(err.splitlines()) == 1
