"""Per-step terminals (issue 28 §4): stored by the episode store, recorded by collect, ending chunk transitions.

OGBench's single-task datasets mark every step where the task holds as terminal for the TD backup while the play
recording goes on; the chunk transitions end a chunk at its first terminal step (dmrl.data.transitions' table)."""

from __future__ import annotations

import hashlib

import gymnasium as gym
import numpy as np
import pytest
import torch
import zarr
from synthetic_episodes import create_store

from dmrl.algos.critic import chunk_td_target
from dmrl.data import ChunkTransitionDataset, EpisodeStore
from dmrl.data.collect import CollectConfig, collect
from dmrl.envs.registry import REGISTRY, register_env
from dmrl.types import Episode


def _episode(i: int, length: int, terminated: bool, terminals: np.ndarray | None = None) -> Episode:
    """Deterministic, no RNG: state[t] = t * (1..5) + 100 i, rgb[t] = t + 10 i, reward[t] = t / 2 - i."""
    t = np.arange(length, dtype=np.float32)
    rgb = np.broadcast_to(((t + 10 * i) % 256).astype(np.uint8)[:, None, None, None], (length, 3, 8, 8)).copy()
    return Episode(
        obs={"rgb": rgb, "state": t[:, None] * np.arange(1, 6, dtype=np.float32) + 100 * i},
        final_obs={"rgb": np.full((3, 8, 8), 200 + i, np.uint8), "state": np.full(5, -1.0 - i, np.float32)},
        actions=np.stack([np.sin(t + i), np.cos(t), t / 10], 1).astype(np.float32),
        rewards=(t * 0.5 - i).astype(np.float32),
        terminated=terminated,
        truncated=not terminated,
        instruction="",
        success=terminated,
        seed=i,
        target="",
        route=None,
        terminals=terminals,
    )


def _digest(ds: ChunkTransitionDataset) -> str:
    h = hashlib.sha256()
    for j in range(len(ds)):
        item = ds[j]
        for outer in ("obs", "next_obs"):
            for k in sorted(item[outer]):
                h.update(item[outer][k].numpy().tobytes())
        for k in ("action", "action_mask", "reward", "done", "valid", "next_valid"):
            h.update(item[k].numpy().tobytes())
    return h.hexdigest()[:16]


LAYOUT = [(5, True), (7, False), (1, True), (3, False), (9, True)]  # (length, terminated) per episode
#: (To, Tp, Ta) -> digest of every item, computed with transitions.py as it was before per-step terminals (77acb6a).
GOLDEN = {
    (2, 3, 2): "48c4157899b44da9",
    (1, 5, 5): "db43c5d6544d62fd",
    (3, 8, 4): "072eb4ec960dfd47",
    (2, 16, 8): "313d287933f53910",
}


def test_a_store_without_terminals_gives_the_same_transitions_as_before(tmp_path):
    old = create_store(tmp_path / "old.zarr")
    quiet = create_store(tmp_path / "quiet.zarr", terminals=True)  # terminals kept, none set: the same items
    for i, (length, term) in enumerate(LAYOUT):
        old.append(_episode(i, length, term))
        quiet.append(_episode(i, length, term, terminals=np.zeros(length, bool)))
    assert not old.has_terminals and quiet.has_terminals
    for cfg, digest in GOLDEN.items():
        assert _digest(ChunkTransitionDataset(old, ["state", "rgb"], *cfg)) == digest, cfg
        assert _digest(ChunkTransitionDataset(quiet, ["state", "rgb"], *cfg)) == digest, cfg


def test_mid_episode_terminals_docstring_example(tmp_path):
    """L=6, To=2, Ta=3, terminals at steps 2 and 3, truncated (the example in dmrl.data.transitions)."""
    store = create_store(tmp_path / "s.zarr", terminals=True)
    ep = _episode(0, 6, terminated=False, terminals=np.isin(np.arange(6), [2, 3]))
    ep.rewards = np.arange(1, 7, dtype=np.float32)  # r_t = t + 1: no reward is 0, so padding shows
    store.append(ep)
    ds = ChunkTransitionDataset(store, ["state"], n_obs_steps=2, horizon=4, n_action_steps=3)
    T, F = True, False
    expected = {  # t: reward, valid, done, next frames (-1: the final observation), next_valid
        0: ([1, 2, 3], [T, T, T], [F, F, T], [2, 3], T),
        1: ([2, 3, 0], [T, T, F], [F, T, F], [3, 3], F),
        2: ([3, 0, 0], [T, F, F], [T, F, F], [3, 3], F),
        3: ([4, 0, 0], [T, F, F], [T, F, F], [4, 4], F),
        4: ([5, 6, 0], [T, T, F], [F, F, F], [-1, -1], F),
        5: ([6, 0, 0], [T, F, F], [F, F, F], [-1, -1], F),
    }
    assert len(ds) == 6
    for t, (reward, valid, done, frames, next_valid) in expected.items():
        item = ds[t]
        assert item["obs"]["state"][-1, 0].item() == t
        assert item["reward"].tolist() == reward and item["valid"].tolist() == valid, t
        assert item["done"].tolist() == done and item["next_valid"].item() is next_valid, t
        assert item["next_obs"]["state"][:, 0].tolist() == frames, t
    # The critic's target (dmrl.algos) agrees: t=1 adds r1 and r2, then stops; t=0 bootstraps from nothing.
    batch = {k: torch.stack([ds[t][k] for t in (0, 1, 4)]) for k in ("reward", "done", "valid", "next_valid")}
    y = chunk_td_target(batch["reward"], batch["done"], batch["valid"], batch["next_valid"], torch.ones(3), 0.5)
    torch.testing.assert_close(y, torch.tensor([1 + 0.5 * 2 + 0.25 * 3, 2 + 0.5 * 3, 5 + 0.5 * 6]))


def test_terminated_episode_keeps_its_last_step_terminal(tmp_path):
    store = create_store(tmp_path / "s.zarr", terminals=True)
    store.append(_episode(0, 4, terminated=True, terminals=np.zeros(4, bool)))
    ds = ChunkTransitionDataset(store, ["state"], n_obs_steps=1, horizon=2, n_action_steps=2)
    assert ds[2]["done"].tolist() == [False, True] and ds[3]["done"].tolist() == [True, False]


def test_terminals_round_trip_and_an_old_store_reads_as_before(tmp_path):
    store = create_store(tmp_path / "s.zarr", terminals=True)
    store.append(_episode(0, 5, False, terminals=np.array([0, 1, 1, 0, 0], bool)))
    store.append(_episode(1, 3, True, terminals=np.array([0, 0, 1], bool)))
    store.close()
    back = EpisodeStore.open(tmp_path / "s.zarr")
    assert back.has_terminals and back.episode(0).terminals.tolist() == [False, True, True, False, False]
    assert np.asarray(back.array("terminals")[: back.n_steps]).tolist() == [0, 1, 1, 0, 0, 0, 0, 1]

    old = create_store(tmp_path / "old.zarr")  # the layout of every store written before per-step terminals
    old.append(_episode(0, 3, True))
    assert "terminals" not in dict(zarr.open_group(str(tmp_path / "old.zarr"), mode="r").attrs)
    assert not (tmp_path / "old.zarr" / "data" / "terminals").exists()
    old = EpisodeStore.open(tmp_path / "old.zarr")
    assert not old.has_terminals and old.episode(0).terminals is None
    with pytest.raises(ValueError, match=r"no per-step terminals .*re-collect") as e:
        old.array("terminals")
    assert "\n" not in str(e.value)


def test_bad_terminals_are_one_line_errors(tmp_path):
    with pytest.raises(ValueError, match=r"Episode.terminals must be bool \(5,\), got bool\[6\]"):
        _episode(0, 5, False, terminals=np.zeros(6, bool))
    with pytest.raises(ValueError, match=r"Episode.terminals must be bool \(5,\), got float32\[5\]"):
        _episode(0, 5, False, terminals=np.zeros(5, np.float32))
    plain, kept = create_store(tmp_path / "plain.zarr"), create_store(tmp_path / "kept.zarr", terminals=True)
    errors = []
    for store, ep in ((plain, _episode(0, 5, False, np.zeros(5, bool))), (kept, _episode(0, 5, False))):
        with pytest.raises(ValueError, match=r"Episode.terminals: got .* per-step terminals") as e:
            store.append(ep)
        errors.append(str(e.value))
    ep = _episode(0, 5, False, np.zeros(5, bool))
    ep.terminals = np.zeros((5, 2), bool)  # an edit after construction
    with pytest.raises(ValueError, match=r"Episode.terminals: got bool\[5, 2\], store expects bool\[5\]") as e:
        kept.append(ep)
    errors.append(str(e.value))
    kept.append(_episode(0, 5, False, np.zeros(5, bool)))
    kept.close()
    root = zarr.open_group(str(tmp_path / "kept.zarr"), mode="r+")  # damaged outside dmrl: float, 2 columns
    del root["data/terminals"]
    root.create_array("data/terminals", shape=(5, 2), dtype="float32")
    with pytest.raises(ValueError, match=r"'data/terminals' must be bool \(N,\), got float32\[5, 2\]") as e:
        EpisodeStore.open(tmp_path / "kept.zarr")
    errors.append(str(e.value))
    assert all("\n" not in m for m in errors)


def test_uncommitted_terminal_rows_are_dropped_on_reopen(tmp_path):
    store = create_store(tmp_path / "s.zarr", terminals=True)
    store.append(_episode(0, 4, False, np.zeros(4, bool)))
    store.close()
    root = zarr.open_group(str(tmp_path / "s.zarr"), mode="r+")  # a crash after the data, before the commit
    root["data/terminals"].resize((7,))
    root["data/terminals"][4:] = True
    store = EpisodeStore.open(tmp_path / "s.zarr", "a")
    assert store.array("terminals").shape == (4,)
    store.append(_episode(1, 2, False, np.array([False, True])))
    assert store.episode(1).terminals.tolist() == [False, True] and store.episode(0).terminals.tolist() == [0] * 4


class TermEnv(gym.Env):
    """state (2,) = (t, 0); 6 steps; info["terminal"] at steps 1 and 2 (when ``report``), terminated at the end
    for odd seeds."""

    report = True

    def __init__(self, obs_modes=("state",)):
        self.action_space = gym.spaces.Box(-1.0, 1.0, (1,), np.float32)
        self.observation_space = gym.spaces.Dict({"state": gym.spaces.Box(-np.inf, np.inf, (2,), np.float32)})

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t, self.odd = 0, bool((seed or 0) % 2)
        return {"state": np.zeros(2, np.float32)}, {}

    def step(self, action):
        info = {"is_success": False} | ({"terminal": self.t in (1, 2)} if self.report else {})
        self.t += 1
        end = self.t >= 6
        return {"state": np.array([self.t, 0], np.float32)}, 0.0, end and self.odd, end and not self.odd, info


class ZeroExpert:
    def __init__(self, env):
        pass

    def reset(self, seed):
        pass

    def act(self, obs):
        return np.zeros(1, np.float32)


@pytest.fixture
def term_env(monkeypatch):
    register_env("test/TermEnv-v0", TermEnv, obs_modes=("state",), expert=ZeroExpert)
    yield "test/TermEnv-v0"
    REGISTRY.pop("test/TermEnv-v0", None)
    gym.registry.pop("test/TermEnv-v0", None)


def test_collect_keeps_the_terminals_an_env_reports(term_env, tmp_path, monkeypatch):
    cfg = dict(env=term_env, episodes=2, workers=0, obs_modes=("state",))
    store = collect(CollectConfig(out=tmp_path / "t.zarr", **cfg), progress=False)
    assert store.has_terminals and store.terminated.tolist() == [False, True]
    assert store.episode(0).terminals.tolist() == [False, True, True, False, False, False]
    assert store.episode(1).terminals.tolist() == [False, True, True, False, False, True]  # or'd with terminated
    store.close()
    monkeypatch.setattr(TermEnv, "report", False)  # the same env without terminals: a store without them
    plain = collect(CollectConfig(out=tmp_path / "p.zarr", **cfg), progress=False)
    assert not plain.has_terminals and plain.episode(0).terminals is None
    plain.close()
    monkeypatch.setattr(TermEnv, "report", True)
    with pytest.raises(ValueError, match=r"--append: store .* keeps no per-step terminals, but test/TermEnv-v0"):
        collect(CollectConfig(out=tmp_path / "p.zarr", append=True, **cfg), progress=False)


def test_collect_on_ogbench_records_the_task_success_as_terminals(tmp_path, monkeypatch):
    """cube-single task 2 with its goal moved to where the cube starts (so the task holds until the play oracle
    moves the cube): the stored terminals are the env's per-step task success, and end the chunk transitions."""
    pytest.importorskip("ogbench", reason='OGBench not installed (pip install -e ".[suites]")')
    import dmrl.envs.suites.ogbench as og

    monkeypatch.setattr(og, "PLAY_STEPS", 120)  # the protocol's 1001-step play episodes, cut short
    monkeypatch.setattr(
        og.OGBenchEnv, "_task_targets", lambda self: {"cubes": self.active._data.qpos[14:17][None].copy()}
    )
    seen: dict[int, list[bool]] = {}
    step = og.OGBenchEnv.step

    def spy(self, action):
        out = step(self, action)
        seen.setdefault(id(self), []).append(out[4]["success_now"])
        return out

    monkeypatch.setattr(og.OGBenchEnv, "step", spy)
    name = "ogbench/cube-single-play-singletask-task2-v0"
    cfg = CollectConfig(out=tmp_path / "o.zarr", env=name, episodes=1, workers=0, obs_modes=("state",))
    store = collect(cfg, progress=False)
    term = store.episode(0).terminals
    success_now = next(v for v in seen.values() if len(v) == 120)  # the collecting env (the probe made 1 step)
    assert store.has_terminals and term.tolist() == success_now
    assert term[0] and not term.all()  # the task held at the start, the oracle then moved the cube away
    assert term.tolist() == (store.episode(0).rewards == 0).tolist()  # OGBench: reward 0, mask 0 together
    ds = ChunkTransitionDataset(store, ["state"], n_obs_steps=1, horizon=5, n_action_steps=5)
    first_false = int(np.argmin(term))
    assert ds[0]["done"].tolist() == [True, False, False, False, False] and ds[0]["valid"].sum() == 1
    assert not ds[first_false]["done"][0] and ds[first_false - 1]["done"][0]
