"""OGBench 1.2.2: play-oracle rollouts, seeding, and OGBench's .npz layout read back with its own relabelling."""

from __future__ import annotations

import numpy as np
import pytest

import dmrl  # noqa: F401  (first: it picks the headless GL backend, which MuJoCo reads once, at import)

pytest.importorskip("ogbench", reason='OGBench not installed (pip install -e ".[suites]")')

from dmrl.envs import REGISTRY, make_env, make_expert  # noqa: E402
from dmrl.envs.suites import OGBENCH_ENVS  # noqa: E402
from dmrl.envs.suites.ogbench import ACTION_MEANING, OGBenchEnv  # noqa: E402
from dmrl.envs.suites.ogbench_npz import load_npz  # noqa: E402

NAME = "ogbench/cube-single-play-singletask-task2-v0"


@pytest.fixture(scope="module")
def play():
    """cube-single task 2 in play mode with its oracle, episodes cut to 200 steps (the protocol's are 1001)."""
    env = make_env(NAME, obs_modes=("joints", "state"))
    expert = make_expert(NAME, env)
    env.unwrapped.max_steps = 200
    yield env, expert
    env.close()


def _rollout(env, expert, seed):
    obs, _ = env.reset(seed=seed)
    expert.reset(seed)
    rows = {"observations": [], "actions": [], "qpos": [], "reached": [], "reward": []}
    while True:
        qpos = env.unwrapped.active._data.qpos.copy()  # the state of this row's observation
        action = expert.act(obs)
        rows["observations"].append(obs["state"])
        rows["actions"].append(action)
        rows["qpos"].append(qpos)
        obs, reward, terminated, truncated, info = env.step(action)
        rows["reached"].append(info["target_reached"])
        rows["reward"].append(reward)
        if terminated or truncated:
            return rows, obs, info


def test_names_registered():
    assert len(OGBENCH_ENVS) == 18 and all(n in REGISTRY for n in OGBENCH_ENVS)
    assert OGBENCH_ENVS["ogbench/scene-play-singletask-v0"] == ("scene", 2)


def test_play_oracle_reaches_its_targets(play):
    env, expert = play
    rows, obs, info = _rollout(env, expert, seed=0)
    reached = np.asarray(rows["reached"])
    rising = int((reached[1:] & ~reached[:-1]).sum() + reached[0])
    assert len(reached) == 200 and rising >= 2, f"oracle reached {rising} targets in 200 steps"
    assert obs["joints"].shape == (19,) and obs["state"].shape == (28,)
    np.testing.assert_array_equal(obs["joints"], obs["state"][:19])
    assert set(rows["reward"]) <= {-1.0, 0.0}  # one cube: successes - 1


def test_episode_is_a_function_of_its_seed(play):
    env, expert = play
    env.unwrapped.max_steps = 40
    try:
        a = _rollout(env, expert, seed=3)[0]["actions"]
        b = _rollout(env, expert, seed=4)[0]["actions"]
        state = np.random.get_state()[1].copy()
        c = _rollout(env, expert, seed=3)[0]["actions"]
    finally:
        env.unwrapped.max_steps = 200
    np.testing.assert_array_equal(a, c)
    assert not np.allclose(a, b)
    np.testing.assert_array_equal(np.random.get_state()[1], state)  # the oracles' draws leave numpy's global stream


def test_task_env_success_ends_the_episode():
    env = OGBenchEnv("cube-single", 2)
    env.reset(seed=0)
    goal = env.task_env._data.mocap_pos[0].copy()
    env.task_env._data.joint("object_joint_0").qpos[:3] = goal  # put the cube on the task's goal
    env.task_env.post_step()  # OGBench recomputes success there
    _, reward, terminated, truncated, info = env.step(np.zeros(5, dtype=np.float32))
    assert terminated and not truncated and info["is_success"] and reward == 0.0 and info["terminal"]
    env.close()


def test_npz_round_trip_matches_ogbench_relabelling(play, tmp_path):
    """Two short trajectories written in OGBench's layout, read by load_npz and by the wheel's own loader."""
    from ogbench.relabel_utils import relabel_dataset
    from ogbench.utils import load_dataset

    env, expert = play
    env.unwrapped.max_steps = 60
    try:
        trajs = []
        for seed in (5, 6):
            rows, last, _ = _rollout(env, expert, seed)
            rows["observations"].append(last["state"])  # the row after the last action, as the script stores it
            rows["actions"].append(np.zeros(5, np.float32))
            rows["qpos"].append(env.unwrapped.active._data.qpos.copy())
            trajs.append(rows)
    finally:
        env.unwrapped.max_steps = 200
    cat = {
        k: np.concatenate([np.asarray(t[k], np.float32) for t in trajs]) for k in ("observations", "actions", "qpos")
    }
    cat["terminals"] = np.concatenate([np.eye(61)[-1], np.eye(61)[-1]]).astype(bool)
    path = tmp_path / "cube-single-play-v0.npz"
    np.savez_compressed(path, **cat)

    episodes = list(load_npz(path, "cube-single", 2, obs_modes=("joints", "state")))
    assert [ep.length for ep in episodes] == [60, 60] and all(ep.truncated for ep in episodes)
    for ep, t in zip(episodes, trajs, strict=True):
        np.testing.assert_array_equal(ep.obs["state"], np.asarray(t["observations"][:60], np.float32))
        np.testing.assert_array_equal(ep.final_obs["state"], t["observations"][60])
        np.testing.assert_array_equal(ep.actions, np.asarray(t["actions"][:60]))
        np.testing.assert_array_equal(ep.rewards, np.asarray(t["reward"], np.float32))  # = the env's play reward

    ref = load_dataset(str(path), add_info=True)  # OGBench's own reader: transitions, last rows dropped
    relabel_dataset("cube-single-singletask-task2-v0", env.unwrapped.task_env, ref)  # the same task env
    np.testing.assert_array_equal(np.concatenate([ep.rewards for ep in episodes]), ref["rewards"])
    np.testing.assert_array_equal(np.concatenate([ep.obs["state"] for ep in episodes]), ref["observations"])
    np.testing.assert_array_equal(np.concatenate([ep.actions for ep in episodes]), ref["actions"])
    np.testing.assert_array_equal(np.concatenate([ep.terminals for ep in episodes]), ref["masks"] == 0)

    # The episodes in a store, as `dmrl collect` writes it, and a 2-step train on it.
    from dmrl.cli import main
    from dmrl.data import EpisodeStore

    spec = {"joints": ((19,), "float32"), "state": ((28,), "float32")}
    store = EpisodeStore.create(
        tmp_path / "d.zarr",
        env_id=NAME,
        obs_modes=("joints", "state"),
        action_meaning=list(ACTION_MEANING),
        obs_spec=spec,
        action_dim=5,
        episode_info={},
        terminals=True,
    )
    for ep in episodes:
        store.append(ep)
    store.close()
    run, train = (
        tmp_path / "run",
        ["--steps", "2", "--batch-size", "4", "--chunk.horizon", "8", "--chunk.n-action-steps", "4"],
    )
    assert main(["train", "--dataset", str(tmp_path / "d.zarr"), "--out", str(run), *train]) == 0
    assert (run / "checkpoint" / "policy.safetensors").is_file()
