"""docs/extending.md as a test: its toy env, policy and algorithm register and run collect -> train -> eval."""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from dmrl.cli import main
from dmrl.envs import REGISTRY

DOC = Path(__file__).resolve().parents[1] / "docs" / "extending.md"
ENV = "toy/PointReach-v0"


def _doc_block(heading: str, index: int = 0) -> str:
    """The ``index``-th python code block under the ``## heading`` section of docs/extending.md."""
    section = DOC.read_text().split(f"## {heading}\n", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```python\n(.*?)```", section, re.S)[index]


@pytest.fixture
def toy_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The doc's toy env written as an importable module (eval's spawned workers import its factory)."""
    import gymnasium as gym

    (tmp_path / "toy_point.py").write_text(_doc_block("Add an env"))
    monkeypatch.syspath_prepend(str(tmp_path))
    import toy_point  # noqa: F401

    yield
    REGISTRY.pop(ENV, None)
    gym.registry.pop(ENV, None)
    sys.modules.pop("toy_point", None)


def test_toy_env_collect_train_eval(toy_env, tmp_path: Path):
    data, run = tmp_path / "point.zarr", tmp_path / "run"
    common = ["--obs-modes", "state", "--episodes", "6", "--workers", "0"]
    assert main(["collect", "--env", ENV, "--out", str(data), *common, "--noise-std", "0.1"]) == 0
    from dmrl.data import EpisodeStore

    store = EpisodeStore.open(data)
    assert store.attrs["action_meaning"] == ["dx", "dy"] and store.n_episodes == 6
    assert set(store.task_values("side")) <= {"left", "right"} and store.success.mean() > 0.5
    assert "routes" not in store.summary()  # a task without route has no route counts

    assert main(["train", "--dataset", str(data), "--out", str(run), "--steps", "3", "--batch-size", "8"]) == 0
    ckpt = run / "checkpoint"
    assert main(["eval", "--checkpoint", str(ckpt), "--episodes", "2", "--envs", "1", "--gif-episodes", "0"]) == 0
    result = json.loads((ckpt.parent / "eval" / "eval.json").read_text())
    assert result["env_id"] == ENV and result["episodes"] == 2
    assert result["route_left"] != result["route_left"]  # nan: the toy task reports no route


def test_multipath_flags_are_refused_for_the_toy_env(toy_env, tmp_path: Path, capsys):
    out = str(tmp_path / "x.zarr")
    assert main(["collect", "--env", ENV, "--obs-modes", "state", "--out", out, "--n-objects", "2"]) == 2
    err = capsys.readouterr().err
    assert "--n-objects" in err and ENV in err and len(err.strip().splitlines()) == 1


@pytest.fixture
def toy_data(toy_env, tmp_path: Path) -> Path:
    data = tmp_path / "point.zarr"
    args = ["collect", "--env", ENV, "--out", str(data), "--obs-modes", "state", "--episodes", "6", "--workers", "0"]
    assert main(args) == 0
    return data


def _module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str, heading: str):
    (tmp_path / f"{name}.py").write_text(_doc_block(heading))
    monkeypatch.syspath_prepend(str(tmp_path))
    return __import__(name)


def test_toy_policy_trains_saves_loads_and_evaluates(toy_data, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    from dmrl.policies import POLICIES
    from dmrl.policies.checkpoint import load_policy

    _module(tmp_path, monkeypatch, "toy_policy", "Add a policy")
    try:
        run = tmp_path / "mse"
        args = ["--policy.type", "mse", "--policy.hidden", "32", "--steps", "4", "--batch-size", "8"]
        assert main(["train", "--dataset", str(toy_data), "--out", str(run), *args]) == 0
        policy, _ = load_policy(run / "checkpoint")
        assert policy.name == "mse" and policy.config.hidden == 32
        assert json.loads((run / "config.json").read_text())["policy"] == {"type": "mse", "hidden": 32}
        eval_args = ["--episodes", "2", "--envs", "1", "--gif-episodes", "0"]
        assert main(["eval", "--checkpoint", str(run / "checkpoint"), *eval_args]) == 0
    finally:
        POLICIES.pop("mse", None)
        sys.modules.pop("toy_policy", None)


def test_toy_algorithm_trains_and_resumes(toy_data, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    from dmrl.algos import ALGOS

    _module(tmp_path, monkeypatch, "toy_algo", "Add an algorithm")
    try:
        run = tmp_path / "plain"
        args = ["--algo.type", "plain-bc", "--algo.lr", "3e-4", "--batch-size", "8", "--engine.save-every", "2"]
        assert main(["train", "--dataset", str(toy_data), "--out", str(run), *args, "--steps", "4"]) == 0
        lines = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
        assert lines[-1]["step"] == 4 and lines[-1]["loss"] > 0 and "grad_norm" in lines[-1]
        assert main(["train", "--dataset", str(toy_data), "--out", str(run), *args, "--steps", "6", "--resume"]) == 2
        assert main(["train", "--dataset", str(toy_data), "--out", str(run), *args, "--steps", "4", "--resume"]) == 0
    finally:
        ALGOS.pop("plain-bc", None)
        sys.modules.pop("toy_algo", None)
