"""Non-finite values in data: a store with NaN/inf is refused by ``dmrl train`` (one line, no checkpoint) and listed by
``dmrl info``; a clean store trains as before; an env emitting NaN stops evaluation with one line."""

from __future__ import annotations

import json
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import zarr

from dmrl.cli import main
from dmrl.data import ChunkTransitionDataset, EpisodeStore, Normalizer, fit_normalizer, nonfinite_report
from dmrl.data.nonfinite import NonFiniteError, require_finite
from dmrl.envs import REGISTRY, register_env
from dmrl.policies import GaussianPolicyConfig
from dmrl.train.config import TrainConfig
from dmrl.train.evaluate import NonFiniteObservationError, evaluate
from dmrl.train.offline import build_from_store
from state_store import state_store

FIX = "fix or drop that episode (dmrl info lists every bad one)"
CRITIC = ["--algo.critic.hidden", "32", "--algo.critic.depth", "2"]


def _plant(path: Path, key: str, index: tuple[int, ...], value: float) -> Path:
    """Overwrite one value of the committed array ``key`` (e.g. data/actions) in place."""
    arr = zarr.open_array(str(path / key), mode="r+")
    arr[index] = value
    return path


@pytest.fixture(scope="module")
def stores(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("nonfinite")
    return {
        "clean": state_store(root / "clean.zarr", episodes=4),
        # episode 2, step 17 (global row 97) and episode 3, step 1 (row 121)
        "nan_actions": _plant(
            _plant(state_store(root / "a.zarr", episodes=4), "data/actions", (97, 1), np.nan),
            "data/actions",
            (121, 0),
            np.nan,
        ),
        "inf_state": _plant(state_store(root / "s.zarr", episodes=4), "data/obs/state", (45, 4), np.inf),
    }


def _train(store: Path, out: Path, *extra: str) -> int:
    args = ["train", "--dataset", str(store), "--out", str(out), "--policy.type", "gaussian", "--steps", "2"]
    return main([*args, "--batch-size", "8", "--source.val-fraction", "0", "--engine.device", "cpu", *extra])


@pytest.mark.parametrize(
    "name, line",
    [
        (
            "nan_actions",
            "actions has NaN at episode 2, step 17; fix or drop that episode (dmrl info lists every bad one)",
        ),
        ("inf_state", "state has +inf at episode 1, step 5; fix or drop that episode (dmrl info lists every bad one)"),
    ],
)
def test_train_refuses_a_store_with_nonfinite_values(stores, tmp_path, capsys, name, line):
    capsys.readouterr()
    assert _train(stores[name], tmp_path / "run") == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"dmrl: error: dmrl store {stores[name]}: {line}"]
    assert not (tmp_path / "run").exists()  # refused before the run directory is made


def test_a_clean_store_trains(stores, tmp_path):
    assert _train(stores["clean"], tmp_path / "run") == 0
    assert (tmp_path / "run" / "checkpoint").is_dir()


def test_offline_rl_refuses_nonfinite_rewards(tmp_path, capsys):
    path = _plant(state_store(tmp_path / "r.zarr", episodes=4, rewards=True), "data/rewards", (83,), np.nan)
    capsys.readouterr()
    assert _train(path, tmp_path / "run", "--algo.type", "td3-bc", *CRITIC) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"dmrl: error: dmrl store {path}: rewards has NaN at episode 2, step 3; {FIX}"]
    assert not (tmp_path / "run").exists()


def test_info_lists_nonfinite_values(stores, capsys):
    capsys.readouterr()
    assert main(["info", str(stores["nan_actions"])]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["nonfinite"] == {"actions": {"count": 2, "first": [[2, 17], [3, 1]]}}
    assert main(["info", str(stores["inf_state"])]) == 0
    assert json.loads(capsys.readouterr().out)["nonfinite"] == {"state": {"count": 1, "first": [[1, 5]]}}
    assert main(["info", str(stores["clean"])]) == 0
    assert json.loads(capsys.readouterr().out)["nonfinite"] == {}


def test_a_clean_store_fits_the_same_statistics(stores):
    store = EpisodeStore.open(stores["clean"])
    streamed = fit_normalizer(store, ["state", "actions"])
    whole = Normalizer.fit({k: np.asarray(store.array(k)[: store.n_steps]) for k in ("state", "actions")})
    for k in ("state", "actions"):
        np.testing.assert_array_equal(streamed.scale[k], whole.scale[k])
        np.testing.assert_array_equal(streamed.offset[k], whole.offset[k])


def test_rl_transitions_refuse_nonfinite_rewards_and_final_observations(tmp_path):
    path = _plant(state_store(tmp_path / "r.zarr", episodes=3, rewards=True), "data/rewards", (83,), -np.inf)
    store = EpisodeStore.open(path)
    with pytest.raises(NonFiniteError, match=r"rewards has -inf at episode 2, step 3; fix or drop"):
        ChunkTransitionDataset(store, obs_keys=("state",))
    assert nonfinite_report(store) == {"rewards": {"count": 1, "first": [[2, 3]]}}
    path = _plant(state_store(tmp_path / "f.zarr", episodes=3), "final/state", (1, 2), np.nan)
    with pytest.raises(NonFiniteError, match=r"final/state has NaN at episode 1, step 40 \(its final observation\)"):
        ChunkTransitionDataset(path, obs_keys=("state",))


def test_depth_is_checked_chunk_by_chunk(tmp_path):
    st = EpisodeStore.create(
        tmp_path / "d.zarr",
        env_id="dmrl/MultiPathGrasp-v0",
        obs_modes=("depth",),
        action_meaning=["a"],
        obs_spec={"depth": ((1, 4, 4), "float32")},
        action_dim=1,
    )
    from dmrl.types import Episode

    for seed in range(2):
        depth = np.ones((10, 1, 4, 4), np.float32)
        if seed == 1:
            depth[6, 0, 2, 3] = np.nan
        st.append(
            Episode(
                obs={"depth": depth},
                final_obs={"depth": np.ones((1, 4, 4), np.float32)},
                actions=np.zeros((10, 1), np.float32),
                rewards=np.zeros(10, np.float32),
                terminated=True,
                truncated=False,
                instruction="",
                target="",
                route=None,
                success=True,
                seed=seed,
            )
        )
    with pytest.raises(NonFiniteError, match="depth has NaN at episode 1, step 6"):
        require_finite(st, "depth")
    assert nonfinite_report(st) == {"depth": {"count": 1, "first": [[1, 6]]}}


class NaNEnv(gym.Env):
    """state (5,) of zeros; seed 1 emits a NaN at step 3."""

    def __init__(self, obs_modes=("state",)):
        self.action_space = gym.spaces.Box(-1.0, 1.0, (3,), np.float32)
        self.observation_space = gym.spaces.Dict({"state": gym.spaces.Box(-np.inf, np.inf, (5,), np.float32)})

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.seed_, self.t = seed, 0
        return self._obs(), {}

    def step(self, action):
        self.t += 1
        return self._obs(), 0.0, False, self.t >= 6, {"is_success": False}

    def _obs(self):
        state = np.zeros(5, np.float32)
        if self.seed_ == 1 and self.t == 3:
            state[2] = np.nan
        return {"state": state}


def test_evaluate_stops_at_a_nonfinite_observation(stores):
    register_env("test/NaNEnv-v0", NaNEnv, obs_modes=("state",))
    try:
        cfg = TrainConfig(dataset=stores["clean"], policy=GaussianPolicyConfig())
        policy, _ = build_from_store(cfg, EpisodeStore.open(stores["clean"]))
        with pytest.raises(NonFiniteObservationError) as e:
            evaluate(policy, "test/NaNEnv-v0", seeds=[0, 1], n_envs=2, workers=False)
        assert str(e.value) == (
            "env test/NaNEnv-v0 (seed 1): observation 'state' has NaN at step 3; "
            "the policy cannot act on it (check the env's observations)"
        )
        assert evaluate(policy, "test/NaNEnv-v0", seeds=[0, 2], n_envs=2, workers=False).episodes == 2
    finally:
        REGISTRY.pop("test/NaNEnv-v0", None)
        gym.registry.pop("test/NaNEnv-v0", None)
