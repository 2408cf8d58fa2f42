"""CLI smoke runs of offline RL (--algo.type diffusion-ql | td3-bc): eval of the exported actor, --init, resume."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from dmrl.cli import main
from dmrl.policies.checkpoint import load_policy

TINY = ["--batch-size", "8", "--chunk.horizon", "8", "--chunk.n-action-steps", "4", "--chunk.encoder.width", "32"]
DIFFUSION = ["--policy.num-train-steps", "20", "--policy.num-inference-steps", "3"]
DIFFUSION += ["--policy.denoiser-kwargs", "hidden_dim", "32"]
CRITIC = ["--algo.critic.hidden", "32", "--algo.critic.depth", "2"]


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    out = tmp_path_factory.mktemp("data") / "d.zarr"
    assert main(["collect", "--out", str(out), "--episodes", "3", "--workers", "0", "--obs-modes", "state"]) == 0
    return out


def _train(dataset, run, *extra) -> int:
    return main(["train", "--dataset", str(dataset), "--out", str(run), *TINY, *extra])


def test_diffusion_ql_train_eval_and_init_from_bc(tmp_path, dataset, capsys):
    bc = tmp_path / "bc"
    assert _train(dataset, bc, *DIFFUSION, "--steps", "3") == 0
    run = tmp_path / "dql"
    args = ["--algo.type", "diffusion-ql", "--steps", "5", "--init", str(bc / "checkpoint"), "--source.val-every", "5"]
    assert _train(dataset, run, *args, *DIFFUSION, *CRITIC, "--algo.grad-steps-through-chain", "2") == 0
    lines = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert lines[-1]["step"] == 5 and {"critic_loss", "actor_loss", "actor_q_loss", "val_loss"} <= set(lines[-1])
    policy, meta = load_policy(run / "checkpoint")  # the actor alone, a plain diffusion policy
    assert policy.name == "diffusion" and meta["algo"] == "diffusion-ql" and meta["init"] == str(bc / "checkpoint")
    # The BC actor's normaliser came with --init (its weights then moved for 5 steps).
    bc_policy, _ = load_policy(bc / "checkpoint")
    torch.testing.assert_close(policy.normalizer.actions_scale, bc_policy.normalizer.actions_scale)
    capsys.readouterr()
    assert (
        main(["eval", "--checkpoint", str(run / "checkpoint"), "--episodes", "1", "--envs", "1", "--gif-episodes", "0"])
        == 0
    )
    assert json.loads((run / "eval" / "eval.json").read_text())["episodes"] == 1
    # --init whose settings differ from the run's: one line naming the key
    bad = [
        "--algo.type",
        "diffusion-ql",
        "--steps",
        "1",
        "--init",
        str(bc / "checkpoint"),
        "--chunk.n-action-steps",
        "2",
    ]
    capsys.readouterr()  # eval's progress lines
    assert _train(dataset, tmp_path / "bad", *bad, *DIFFUSION) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "chunk.n_action_steps" in err[0], err


def test_td3_bc_runs_and_resumes_exactly(tmp_path, dataset):
    run = tmp_path / "td3"
    args = ["--algo.type", "td3-bc", "--policy.type", "gaussian", "--policy.hidden", "32", *CRITIC]
    args += ["--steps", "6", "--engine.save-every", "2"]
    assert _train(dataset, run, *args) == 0
    full = json.loads((run / "metrics.jsonl").read_text().splitlines()[-1])
    assert full["step"] == 6 and "actor_loss" in full and load_policy(run / "checkpoint")[0].name == "gaussian"
    # Drop the final state: the resumed run restarts from step 4 (critic, targets, both optimizers, RNG, counter).
    shutil.rmtree(run / "state" / "step_00000006")
    assert _train(dataset, run, *args, "--resume") == 0
    lines = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [x["step"] for x in lines] == [6]
    for key in ("critic_loss", "critic_q", "actor_loss", "actor_bc_loss"):
        assert lines[-1][key] == pytest.approx(full[key], rel=1e-6), key


@pytest.mark.parametrize(
    "args, match",
    [
        (["train", "--algo.type", "sac"], "algo.type"),
        (["train", "--algo.type", "td3-bc"], "--policy.type gaussian"),
        (["train", "--init", "/nonexistent/ckpt"], "--init"),
        (["train", "--algo.type", "diffusion-ql", "--algo.eta-schedule", "cosine"], "eta_schedule"),
        (["train", "--algo.eta-schedule", "cosine"], "--algo.eta-schedule"),  # a diffusion-ql flag; bc has none
        (["train", "--algo.type", "diffusion-ql", "--chunk.pad-after", "14"], "--chunk.pad-after"),
    ],
)
def test_bad_offline_rl_input_is_one_line(args, match, capsys):
    assert main(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and match in err[0], err


def test_bc_run_from_before_the_algo_keys_still_resumes(tmp_path, dataset):
    run = tmp_path / "old"
    args = ["train", "--dataset", str(dataset), "--out", str(run), *TINY, "--steps", "2"]
    assert main(args) == 0
    saved = json.loads((run / "config.json").read_text())
    for key in ("algo", "init"):  # absent from a run's config.json: they take their defaults
        del saved[key]
    (run / "config.json").write_text(json.dumps(saved))
    assert main([*args, "--resume"]) == 0


@pytest.mark.parametrize("algo", ["bc", "diffusion-ql"])
def test_curve_points_are_logged_and_leave_training_unchanged(tmp_path, dataset, algo):
    args = ["--algo.type", algo, "--steps", "4", "--eval-envs", "1", *DIFFUSION, *(CRITIC if algo != "bc" else [])]
    assert _train(dataset, tmp_path / "plain", *args) == 0
    curve = ["--source.curve-every", "2", "--source.curve-episodes", "1"]
    assert _train(dataset, tmp_path / "curve", *args, *curve) == 0
    records = [json.loads(x) for x in (tmp_path / "curve" / "metrics.jsonl").read_text().splitlines()]
    points = [r for r in records if "curve_success" in r]
    assert [p["step"] for p in points] == [2, 4]
    for p in points:
        assert 0 <= p["curve_ci_low"] <= p["curve_success"] <= p["curve_ci_high"] <= 1
        assert p["curve_success"] in (0.0, 1.0) and p["curve_collision"] in (0.0, 1.0)  # one episode each
    # evaluate() reseeds torch; the points run inside fork_rng, so training draws the same noise either way.
    plain, _ = load_policy(tmp_path / "plain" / "checkpoint")
    curve, _ = load_policy(tmp_path / "curve" / "checkpoint")
    for (name, a), b in zip(plain.state_dict().items(), curve.state_dict().values(), strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0, msg=name)


def test_curve_flags_are_checked(capsys):
    assert main(["train", "--source.curve-every", "-1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--source.curve-every" in err[0], err


def test_training_envs_take_the_reward_the_store_was_collected_with(dataset):
    from types import SimpleNamespace

    from dmrl.data import EpisodeStore
    from dmrl.train.offline import env_kwargs_from_store

    assert env_kwargs_from_store(EpisodeStore.open(dataset))["reward"] == "shaped"  # collect's default, recorded
    env_id = "dmrl/MultiPathGrasp-v0"
    old = SimpleNamespace(path="old.zarr", attrs={"env_id": env_id, "collect": {"image_size": "64", "n_objects": "3"}})
    assert env_kwargs_from_store(old)["reward"] == "shaped_v1"  # collected before the reward option existed
    synthetic = SimpleNamespace(path="s.zarr", attrs={"env_id": env_id})  # not written by dmrl collect
    assert "reward" not in env_kwargs_from_store(synthetic)
