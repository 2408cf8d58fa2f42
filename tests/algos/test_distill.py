"""dmrl distill's restarts: a stopped distillation continues with --resume (its saved config is read back against
DistillConfig's defaults), and benchmarks/distill.py reuses, resumes or starts each run it finds in --out."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from dmrl.cli import main
from script_module import script_module

ROOT = Path(__file__).resolve().parents[2]
TINY = ["--batch-size", "8", "--chunk.horizon", "8", "--chunk.n-action-steps", "4", "--chunk.encoder.width", "32"]
DIFFUSION = ["--policy.num-train-steps", "20", "--policy.num-inference-steps", "4"]
DIFFUSION += ["--policy.denoiser-kwargs", "hidden_dim", "32"]


@pytest.fixture(scope="module")
def teacher(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("distill_resume")
    data = root / "d.zarr"
    assert main(["collect", "--out", str(data), "--episodes", "2", "--workers", "0", "--obs-modes", "state"]) == 0
    run = root / "teacher"
    assert main(["train", "--dataset", str(data), "--out", str(run), *TINY, *DIFFUSION, "--steps", "2"]) == 0
    return run / "checkpoint"


@pytest.fixture(scope="module")
def bench():
    """benchmarks/distill.py as a module (its ``_common`` import needs benchmarks/ on the path while it loads)."""
    yield from script_module("benchmarks/distill.py", "distill_bench", on_path="benchmarks")


def test_a_stopped_distillation_resumes_and_writes_its_student(tmp_path, teacher):
    out = tmp_path / "student"
    argv = ["distill", "--teacher", str(teacher), "--out", str(out), "--steps", "4", "--batch-size", "8"]
    assert main([*argv, "--engine.save-every", "2"]) == 0
    # As if stopped after step 2's state: the later log lines, the student and the summary are not there yet.
    shutil.rmtree(out / "checkpoint")
    (out / "summary.json").unlink()
    for state in sorted((out / "state").iterdir())[1:]:
        shutil.rmtree(state)
    assert main([*argv, "--resume"]) == 0
    assert (out / "checkpoint" / "config.json").is_file()
    steps = [json.loads(x)["step"] for x in (out / "metrics.jsonl").read_text().splitlines() if '"step"' in x]
    assert steps[-1] == 4 and json.loads((out / "summary.json").read_text())["train_steps"] == 4


def test_a_distillation_without_a_teacher_is_one_line_and_writes_nothing(tmp_path, teacher, capsys):
    data = json.loads((teacher / "config.json").read_text())["meta"]["dataset"]
    out = tmp_path / "run"
    argv = ["train", "--dataset", data, "--out", str(out), "--algo.type", "distill", "--policy.type", "student"]
    assert main([*argv, "--steps", "1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--algo.teacher: required" in err[0]
    assert not out.exists()


def test_benchmark_reuses_finished_runs_resumes_started_ones_and_starts_new_ones(tmp_path, bench):
    run = tmp_path / "student1_s500_seed0"
    assert bench.run_flags(run) == []  # new
    run.mkdir()
    assert bench.run_flags(run) == []  # an empty directory: dmrl starts into it
    (run / "config.json").write_text("{}")
    assert bench.run_flags(run) == ["--resume"]  # started, no checkpoint yet
    (run / "checkpoint").mkdir()
    assert bench.run_flags(run) == ["--resume"]  # a checkpoint being written is not a finished run
    (run / "checkpoint" / "config.json").write_text("{}")
    assert bench.run_flags(run) is None  # finished: evaluated again, not retrained
    # A DAgger run stopped in round 0 or during its rollouts has only its rounds directory.
    dagger = tmp_path / "student1_s500_d1x100e200_seed0"
    Path(f"{dagger}-dagger").mkdir()
    assert bench.run_flags(dagger) == ["--resume"]


def _student(steps: int):
    import torch

    from dmrl.policies import ChunkConfig, DiffusionPolicy, DiffusionPolicyConfig, StudentPolicy, StudentPolicyConfig

    chunk = ChunkConfig(obs_keys=("state",), n_obs_steps=2, horizon=8, n_action_steps=4)
    tcfg = DiffusionPolicyConfig(denoiser_kwargs={"hidden_dim": 32}, num_train_steps=20, num_inference_steps=4)
    torch.manual_seed(0)
    teacher = DiffusionPolicy(chunk, tcfg, {"state": 3}, 2)
    scfg = StudentPolicyConfig(denoiser_kwargs={"hidden_dim": 32}, num_train_steps=20, teacher_steps=4, steps=steps)
    student = StudentPolicy(chunk, scfg, {"state": 3}, 2)
    student.attach_teacher(teacher)
    return student


@pytest.mark.parametrize("fraction", [1.0, 0.5])
def test_start_fraction_is_the_share_of_items_trained_from_the_chains_start(fraction):
    import torch

    student = _student(1)
    student.start_fraction = fraction
    seen: list = []
    forward = student.denoiser.forward
    student.denoiser.forward = lambda x, t, *a: seen.append(t) or forward(x, t, *a)
    batch = {"obs": {"state": torch.randn(400, 2, 3)}, "action": torch.zeros(400, 8, 2)}
    out = student.loss(batch)
    at_start = (seen[0] == student.grid[0]).float().mean().item()
    if fraction == 1.0:  # every item from z: the one-step loss is the whole loss
        assert at_start == 1.0 and torch.equal(out["loss"], out["distill_first"])
    else:  # half from z, and the rest uniformly over the 4 grid points (a quarter of them at the start too)
        assert 0.55 < at_start < 0.70, at_start


def test_a_two_step_student_trained_only_from_the_start_is_refused(tmp_path, teacher, capsys):
    out = tmp_path / "student"
    argv = ["distill", "--teacher", str(teacher), "--out", str(out), "--steps", "1", "--batch-size", "8"]
    assert main([*argv, "--student-steps", "2", "--start-fraction", "1.0"]) == 2
    assert "samples mid-chain" in capsys.readouterr().err and not out.exists()


def test_a_dagger_round_warms_up_for_a_tenth_of_its_steps_and_decays_to_zero(tmp_path, teacher):
    out = tmp_path / "student"
    argv = ["distill", "--teacher", str(teacher), "--out", str(out), "--steps", "2", "--batch-size", "8"]
    argv += ["--dagger-rounds", "1", "--dagger-episodes", "1", "--dagger-steps", "20", "--eval-envs", "1"]
    assert main(argv) == 0
    assert json.loads((out / "config.json").read_text())["algo"]["warmup_steps"] == 2
    round0 = json.loads((tmp_path / "student-dagger" / "round0" / "config.json").read_text())
    assert round0["algo"]["warmup_steps"] == 200  # round 0 keeps BC's
    assert json.loads((out / "summary.json").read_text())["lr"] < 1e-8  # the last round's cosine reached 0


def test_pseudo_huber_is_about_the_errors_norm_and_still_logs_the_squared_error():
    import torch

    from dmrl.policies.student import PSEUDO_HUBER_C

    student = _student(1)
    student.start_fraction = 1.0
    batch = {"obs": {"state": torch.randn(6, 2, 3)}, "action": torch.zeros(6, 8, 2)}
    z_seen: list = []
    target = torch.randn(6, 8, 2).clamp(-1, 1)
    student.teacher_chain = lambda obs, z, enc=None: (z_seen.append(z) or torch.stack([z] * 4), target)
    torch.manual_seed(0)
    l2 = student.loss(batch)
    student.distance = "pseudo_huber"
    torch.manual_seed(0)
    ph = student.loss(batch)
    torch.testing.assert_close(z_seen[0], z_seen[1])  # the same noise: the same predictions
    torch.testing.assert_close(ph["distill_mse"], l2["loss"])
    with torch.no_grad():
        pred = student.denoiser(
            z_seen[0], student.grid[torch.zeros(6, dtype=torch.long)], *student.condition(batch["obs"])
        )
    err = (pred - target).pow(2).mean(dim=(1, 2))
    torch.testing.assert_close(ph["loss"], ((err + PSEUDO_HUBER_C**2).sqrt() - PSEUDO_HUBER_C).mean())
    # Far from the target it grows as the RMS error, not its square: a route's blend weighs less than under l2.
    assert ph["loss"] < err.sqrt().mean() and ph["loss"] > err.sqrt().mean() - PSEUDO_HUBER_C


def test_benchmark_gap_is_zero_for_the_teachers_own_chain_and_not_for_its_one_step(teacher, bench):
    from dmrl.policies.checkpoint import load_policy

    store = Path(json.loads((teacher / "config.json").read_text())["meta"]["dataset"])
    windows = bench.store_windows(store, 2, n=50)
    assert windows.shape == (50, 2, 31)
    reference, _ = load_policy(teacher)
    reference.set_sampler(reference.sampler.num_steps, eta=0.0)
    same = bench.teacher_gap(reference, reference, windows, "store")
    assert same == {"gap_mse_store": 0.0, "far_store": 0.0}
    one_step, _ = load_policy(teacher)
    one_step.set_sampler(1, eta=0.0)
    assert bench.teacher_gap(one_step, reference, windows, "own")["gap_mse_own"] > 0.0


def test_benchmark_pools_seeds_and_pairs_each_episode_with_the_teachers(bench):
    def made(policy: str, seed: int, failed: list[int]) -> dict:
        shares = {k: 0.5 for k in ("route_left", "route_right")}
        shares |= {k: 0.0 for k in ("collision_rate", "route_none", "grasp_none", "grasp_wrong")}
        row = {"policy": policy, "seed": seed, "eval_seed": 10, "episodes": 4, "success_rate": 1 - len(failed) / 4}
        return row | shares | {"failed_seeds": failed}

    rows = [made("teacher DDIM-10", 0, [10]), made("student", 0, [10, 11]), made("teacher DDIM-10", 1, [])]
    rows += [made("student", 1, [13])]
    teacher, student = bench.pooled(rows, "teacher DDIM-10")
    assert (teacher["episodes"], teacher["success_rate"], "teacher_minus" in teacher) == (8, 7 / 8, False)
    assert student["seed"] == "all" and student["success_rate"] == 5 / 8
    # Episode (0, 11) and (1, 13): the teacher succeeded, the student did not; (0, 10) failed for both.
    assert student["teacher_minus"] == 2 / 8
    assert student["teacher_minus_ci_low"] <= 2 / 8 <= student["teacher_minus_ci_high"]


def test_benchmark_cost_is_the_distillations_wall_time_over_the_teachers_and_a_resumed_run_gets_none(
    tmp_path, bench, monkeypatch
):
    import json
    from types import SimpleNamespace

    teacher = tmp_path / "teacher_seed0"
    teacher.mkdir()
    (teacher / "summary.json").write_text(json.dumps({"train_steps": 1000}))
    monkeypatch.setattr(bench, "teacher_step_seconds", lambda steps, store, config: 0.5)
    monkeypatch.setattr(bench, "distill", lambda *a: 100.0)
    args = SimpleNamespace(cost_steps=10)
    for flags in (["--resume"], []):
        out = tmp_path / f"student{len(flags)}"
        out.mkdir()
        bench.distill_with_cost(args, teacher, out, 0, 1, flags, tmp_path / "store.zarr")
        assert (out / "cost.json").exists() == (flags == [])
    cost = json.loads((tmp_path / "student0" / "cost.json").read_text())
    assert cost["distill_wall_s"] == 100.0 and cost["cost_vs_teacher"] == 100.0 / (1000 * 0.5)
