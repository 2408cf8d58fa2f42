"""dmrl distill's restarts: a stopped distillation continues with --resume (its saved config is read back against
DistillConfig's defaults), and benchmarks/distill.py reuses, resumes or starts each run it finds in --out."""

from __future__ import annotations

import importlib.util
import json
import shutil
import sys
from pathlib import Path

import pytest

from dmrl.cli import main

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
    path = list(sys.path)
    sys.path.insert(0, str(ROOT / "benchmarks"))
    spec = importlib.util.spec_from_file_location("distill_bench", ROOT / "benchmarks" / "distill.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses resolve the module's annotations through sys.modules
    spec.loader.exec_module(module)
    yield module
    del sys.modules[spec.name]
    sys.path[:] = path


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
