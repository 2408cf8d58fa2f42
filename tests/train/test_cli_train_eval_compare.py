"""CLI smoke runs of train / eval / compare with a handful of steps, presets, and one-line errors."""

from __future__ import annotations

import json

import pytest

from dmrl.cli import main
from dmrl.config_utils import load_yaml, merge
from dmrl.train.config import TrainConfig


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    out = tmp_path_factory.mktemp("data") / "d.zarr"
    assert main(["collect", "--out", str(out), "--episodes", "6", "--workers", "0", "--obs-modes", "state"]) == 0
    return out


@pytest.mark.parametrize("policy", ["diffusion", "gaussian", "vae"])
def test_train_then_eval(tmp_path, dataset, policy, capsys):
    run = tmp_path / "run"
    assert (
        main(
            [
                "train",
                "--dataset",
                str(dataset),
                "--out",
                str(run),
                "--policy.type",
                policy,
                "--steps",
                "12",
                "--batch-size",
                "16",
                "--source.val-every",
                "6",
                "--chunk.horizon",
                "8",
                "--chunk.n-action-steps",
                "4",
                *(["--policy.num-inference-steps", "3"] if policy == "diffusion" else []),
            ]
        )
        == 0
    )
    assert (run / "checkpoint" / "policy.safetensors").is_file() and (run / "tb").is_dir()
    lines = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert lines[-1]["step"] == 12 and "val_loss" in lines[-1]
    capsys.readouterr()
    assert (
        main(["eval", "--checkpoint", str(run / "checkpoint"), "--episodes", "2", "--envs", "1", "--gif-episodes", "1"])
        == 0
    )
    result = json.loads((run / "eval" / "eval.json").read_text())
    assert result["episodes"] == 2 and 0.0 <= result["ci_low"] <= result["success_rate"] <= result["ci_high"]
    assert (run / "eval" / "paths.png").is_file() and (run / "eval" / "rollouts.gif").is_file()
    assert result["grasp_target"] + result["grasp_wrong"] + result["grasp_none"] == pytest.approx(1.0)
    assert result["n_action_steps"] == 4
    # Ta overridden at evaluation; out of range is a one-line error naming the flag and the allowed range
    args = ["eval", "--checkpoint", str(run / "checkpoint"), "--episodes", "1", "--envs", "1", "--gif-episodes", "0"]
    assert main([*args, "--action-steps", "1", "--out", str(tmp_path / "ta1")]) == 0
    assert json.loads((tmp_path / "ta1" / "eval.json").read_text())["n_action_steps"] == 1
    capsys.readouterr()
    assert main([*args, "--action-steps", "8"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--action-steps" in err[0] and "1 .. 7" in err[0], err
    # an existing run is never overwritten silently
    assert main(["train", "--dataset", str(dataset), "--out", str(run), "--steps", "1"]) == 2
    assert "--overwrite" in capsys.readouterr().err


def test_compare_smoke(tmp_path, dataset):
    out = tmp_path / "cmp"
    assert (
        main(
            [
                "compare",
                "--dataset",
                str(dataset),
                "--out",
                str(out),
                "--lrs",
                "1e-3",
                "--parallel",
                "1",
                "--select-episodes",
                "1",
                "--eval-episodes",
                "2",
                "--eval-envs",
                "1",
                "--no-eval-workers",
                "--no-gifs",
                "--train.steps",
                "4",
                "--train.batch-size",
                "16",
                "--train.chunk.horizon",
                "8",
                "--train.chunk.n-action-steps",
                "4",
                "--train.diffusion.num-inference-steps",
                "2",
            ]
        )
        == 0
    )
    report = json.loads((out / "compare.json").read_text())
    assert [r["policy"] for r in report["results"]] == ["gaussian", "vae", "diffusion"]
    for r in report["results"]:
        for key in (
            "success_rate",
            "ci_low",
            "ci_high",
            "episodes",
            "route_left",
            "route_right",
            "collision_rate",
            "jerk",
            "latency_ms",
        ):
            assert key in r
    assert "| policy |" in (out / "compare.md").read_text() and (out / "paths.png").is_file()


@pytest.mark.parametrize(
    "args, match",
    [
        (["train", "--policy.type", "transformerz"], "policy.type"),
        (["train", "--policy.type", "gaussian", "--policy.num-inference-steps", "3"], "--policy.num-inference-steps"),
        (["train", "--dataset", "/nonexistent/x.zarr"], "x.zarr"),
        (["train", "--algo.lr", "-1"], "need lr > 0"),
        (["train", "--config", "/nonexistent.yaml"], "nonexistent.yaml"),
        (["eval", "--checkpoint", "/nonexistent/ckpt"], "ckpt"),
        (["frobnicate"], "unknown command"),
    ],
)
def test_bad_input_is_one_line(args, match, capsys):
    assert main(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and match in err[0], err


def test_yaml_preset_and_unknown_key(tmp_path):
    p = tmp_path / "p.yaml"
    p.write_text("policy: {type: vae, beta: 0.5}\nsteps: 7\nalgo: {lr: 0.002}\n")
    cfg = merge(TrainConfig(), load_yaml(p))
    assert (cfg.policy_type, cfg.steps, cfg.algo.lr, cfg.policy.beta) == ("vae", 7, 0.002, 0.5)
    p.write_text("algo: {learning_rate: 0.1}\n")
    with pytest.raises(ValueError, match="algo.learning_rate"):
        merge(TrainConfig(), load_yaml(p))


def test_demo_preset_is_valid_and_matches_the_yaml():
    from pathlib import Path

    from dmrl.train.compare import QUICK, CompareConfig

    quick = merge(CompareConfig(), QUICK)
    assert quick.eval_episodes >= 100 and quick.train.diffusion.prediction_type == "sample"
    yaml_path = Path(__file__).resolve().parents[2] / "configs" / "compare_quick.yaml"
    assert merge(CompareConfig(), load_yaml(yaml_path)) == quick
