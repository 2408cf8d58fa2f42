"""Online training: collectors + trainer smoke run, a killed collector restarted, transition layout, SIGTERM."""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import signal
import time

import numpy as np
import pytest
import torch
from online_tiny import DIFFUSION, ONLINE, TINY, alive, children, collect_tiny

from dmrl.config_utils import merge
from dmrl.data import ChunkTransitionDataset, EpisodeStore
from dmrl.envs import make_env
from dmrl.policies.checkpoint import load_policy, save_policy
from dmrl.train.config import TrainConfig
from dmrl.train.offline import build_from_store
from dmrl.train.online_workers import nest, rollout_chunks
from dmrl.train.run import train

GAUSSIAN_TD3 = {"policy": "gaussian", "algo": {"type": "td3-bc", "critic": {"hidden": 32, "depth": 2}}}


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    return collect_tiny(tmp_path_factory.mktemp("data") / "d.zarr")


def _cfg(dataset, out, **over) -> TrainConfig:
    return merge(TrainConfig(), {**TINY, "dataset": str(dataset), "out": str(out), **over})


def test_online_smoke_checkpoint_and_nochildren(tmp_path, dataset):
    cfg = _cfg(dataset, tmp_path / "run", steps=6, source={**ONLINE, "eval_every": 3, "eval_episodes": 1})
    summary = train(cfg, progress=False)
    assert summary["train_steps"] == 6 and summary["env_steps"] > 0
    policy, meta = load_policy(tmp_path / "run" / "checkpoint")
    assert policy.name == "diffusion" and meta["online"] is True
    lines = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert any("critic_loss" in x for x in lines)
    assert not mp.active_children()


def test_killed_collector_is_restarted_and_logged(tmp_path, dataset):
    killed = []

    def hook(info):
        if info["update"] == 2 and not killed:
            os.kill(info["collector_pids"][0], signal.SIGKILL)
            killed.append(info["collector_pids"][0])
            time.sleep(0.5)  # let it die before the next liveness check

    summary = train(_cfg(dataset, tmp_path / "run", steps=8), progress=False, hook=hook)
    assert killed and summary["collector_restarts"] >= 1 and summary["train_steps"] == 8
    lines = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert any(x.get("collector_restart") == 0 for x in lines)
    assert not mp.active_children()


def test_collector_transition_matches_dataset_item(dataset):
    cfg = _cfg(dataset, "unused")
    c = cfg.chunk
    store = EpisodeStore.open(dataset)
    ds = ChunkTransitionDataset(store, c.obs_keys, c.n_obs_steps, c.horizon, c.n_action_steps)
    policy, _ = build_from_store(cfg, store)
    env = make_env(store.attrs["env_id"], obs_modes=("state",), max_steps=12)
    items, _ = rollout_chunks(policy, env, 0, 0, 0.1, np.random.default_rng(0))
    mine = nest({k: torch.from_numpy(np.asarray(v)) for k, v in items[-1].items()})
    ref = ds[0]
    assert set(mine) == set(ref)
    for k, v in ref.items():
        if isinstance(v, dict):
            for kk in v:
                assert mine[k][kk].shape == v[kk].shape and mine[k][kk].dtype == v[kk].dtype, (k, kk)
        elif torch.is_tensor(v):
            assert mine[k].shape == v.shape and mine[k].dtype == v.dtype, k
    assert not bool(items[-1]["next_valid"]) or items[-1]["valid"].all()


def test_td3_bc_online_td_errors_move_priorities_off_the_max(tmp_path, dataset):
    """Sampled slots get p = (|TD| + eps)^alpha from the critic step; fresh ones keep the max priority."""
    seen = {}

    def hook(info):
        buf = info["replay"]
        if info["update"] == 5 and len(buf):
            seen["p"] = buf.priorities(np.arange(len(buf)))

    cfg = _cfg(dataset, tmp_path / "run", steps=6, **GAUSSIAN_TD3)
    summary = train(cfg, progress=False, hook=hook)
    assert summary["train_steps"] == 6
    p = seen["p"]
    assert len(np.unique(np.round(p, 9))) > 2, p  # not all at the initial max: TD errors were written back
    lines = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert all(isinstance(x.get("td_error", 0.0), float) for x in lines)
    assert not mp.active_children()


def test_sigterm_stops_children_and_saves_state(tmp_path, dataset):
    import subprocess
    import sys

    import yaml

    run = tmp_path / "run"
    preset = tmp_path / "tiny.yaml"
    preset.write_text(yaml.safe_dump({k: v for k, v in TINY.items() if k != "source"}))
    args = [sys.executable, "-m", "dmrl", "train", "--config", str(preset), "--source.type", "online",
            "--source.learning-starts", "4", "--source.max-episode-steps", "24", "--source.publish-every", "2",
            "--dataset", str(dataset), "--out", str(run), "--steps", "100000",
            "--source.n-collectors", "2"]  # fmt: skip
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        metrics = run / "metrics.jsonl"
        while time.monotonic() < deadline and proc.poll() is None:
            if metrics.exists() and '"critic_loss"' in metrics.read_text():
                break
            time.sleep(0.5)
        assert proc.poll() is None, proc.communicate()
        kids = children(proc.pid)
        assert len([k for k in kids if alive(k)]) >= 2  # the two collectors (plus spawn's resource tracker)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, err
    assert "interrupted" in err
    time.sleep(1.0)
    assert not [k for k in kids if alive(k)], "orphaned child processes"
    assert list((run / "state").iterdir()), "no state saved on SIGTERM"


def test_process_exits_when_weights_were_queued_for_a_busy_evaluator(tmp_path, dataset):
    """Regression: a weight snapshot larger than the pipe buffer, put while the evaluator was mid-episode, kept the
    trainer's queue feeder thread alive and the process hung at exit after training had finished."""
    import subprocess
    import sys

    import yaml

    preset = tmp_path / "big.yaml"
    big = dict(TINY)
    big["policy"] = {**DIFFUSION, "denoiser_kwargs": {"hidden_dim": 256}}  # ~1 MB of weights
    big["source"] = {**ONLINE, "eval_every": 1, "eval_episodes": 5}
    preset.write_text(yaml.safe_dump(big))
    args = [sys.executable, "-m", "dmrl", "train", "--config", str(preset), "--dataset", str(dataset),
            "--out", str(tmp_path / "run"), "--steps", "6"]  # fmt: skip
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        _, err = proc.communicate(timeout=150)
    except subprocess.TimeoutExpired:
        proc.kill()
        pytest.fail("dmrl train --source.type online did not exit after its last update (queue feeder blocked at exit)")
    assert proc.returncode == 0, err[-2000:]
    assert (tmp_path / "run" / "checkpoint").exists()


def test_prefill_puts_every_dataset_transition_in_the_replay(tmp_path, dataset):
    seen = {}

    def hook(info):
        if info["update"] == 0 and not seen:
            buf = info["replay"]
            seen["episode"] = buf.gather(np.arange(len(buf)))["episode"]
            seen["item0"] = buf.gather(np.array([0]))

    online = {**ONLINE, "prefill_from_dataset": True, "learning_starts": 1}
    train(_cfg(dataset, tmp_path / "run", steps=2, source=online), progress=False, hook=hook)
    c = _cfg(dataset, "unused").chunk
    ds = ChunkTransitionDataset(EpisodeStore.open(dataset), c.obs_keys, c.n_obs_steps, c.horizon, c.n_action_steps)
    offline = seen["episode"][seen["episode"] < 0]
    assert len(offline) == len(ds), "every dataset transition is in the replay before the first update"
    assert sorted(set(offline)) == [-2, -1]  # the two collected episodes, as -1 - index
    first = ds[0]
    np.testing.assert_array_equal(seen["item0"]["obs.state"][0], first["obs"]["state"].numpy())
    np.testing.assert_array_equal(seen["item0"]["reward"][0], first["reward"].numpy())
    np.testing.assert_array_equal(seen["item0"]["next_valid"][0], first["next_valid"].numpy())


def test_self_imitation_ring_holds_the_successful_episodes_and_trains(tmp_path, dataset):
    seen = {}

    def hook(info):
        if info["update"] == 0 and not seen:
            seen["n"] = len(info["successes"])

    online = {**ONLINE, "prefill_from_dataset": True, "learning_starts": 1, "bc_data": "successes"}
    summary = train(_cfg(dataset, tmp_path / "run", steps=3, source=online), progress=False, hook=hook)
    c = _cfg(dataset, "unused").chunk
    store = EpisodeStore.open(dataset)
    won = np.flatnonzero(store.success)
    assert len(won) > 0, "the expert dataset should hold a successful episode"
    ds = ChunkTransitionDataset(store, c.obs_keys, c.n_obs_steps, c.horizon, c.n_action_steps, episodes=won)
    assert seen["n"] == len(ds), "the dataset's successful episodes, and only they, start the imitation ring"
    assert summary["train_steps"] == 3 and summary["successes_size"] >= len(ds)
    with pytest.raises(ValueError, match="bc-data successes is an option of diffusion-ql, qc, idql"):
        _cfg(dataset, tmp_path / "x", **GAUSSIAN_TD3, source=online)


def test_qc_online_collects_with_best_of_n_and_imitates_successes(tmp_path, dataset):
    from dmrl.train.online import OnlineSource

    acting = []
    start = OnlineSource.start

    def spy(self, algo, start_step):  # what the collectors and the evaluator are handed to act with
        acting.append(type(algo.evaluation_policy()).__name__)
        return start(self, algo, start_step)

    qc = {"type": "qc", "n_action_samples": 4, "backup_samples": 2, "critic": {"hidden": 32, "depth": 2}}
    # No prefill: the collectors' best-of-N rollouts fill the replay; until an episode succeeds the BC term is off.
    online = {**ONLINE, "bc_data": "successes"}
    OnlineSource.start = spy
    try:
        summary = train(_cfg(dataset, tmp_path / "run", algo=qc, steps=4, source=online), progress=False)
    finally:
        OnlineSource.start = start
    assert acting == ["CriticRankedPolicy"] and summary["train_steps"] == 4 and summary["env_steps"] > 0
    lines = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert any("critic_loss" in x and "actor_loss" in x for x in lines)


def test_offline_share_draws_that_share_of_every_batch_from_the_dataset(tmp_path, dataset):
    from dmrl.train.online import OnlineSource

    seen = []
    next_batch = OnlineSource.next_batch

    def spy(self, step):
        batch = next_batch(self, step)
        if batch is not None:
            seen.append((batch["weights"].clone(), len(self.idx)))
        return batch

    online = {**ONLINE, "offline_share": 0.5}
    OnlineSource.next_batch = spy
    try:
        summary = train(_cfg(dataset, tmp_path / "run", steps=3, source=online), progress=False)
    finally:
        OnlineSource.next_batch = next_batch
    assert summary["train_steps"] == 3 and len(seen) == 3
    for weights, n_replay in seen:  # batch 8: 4 dataset items (weight 1) in front, 4 prioritized replay items
        assert len(weights) == 8 and n_replay == 4 and torch.all(weights[:4] == 1.0)
    with pytest.raises(ValueError, match="offline-share keeps the dataset in its own ring"):
        _cfg(dataset, tmp_path / "x", source={**online, "prefill_from_dataset": True})
    with pytest.raises(ValueError, match="offline-share 0.95 leaves no replay item in a batch of 8"):
        _cfg(dataset, tmp_path / "x", source={**online, "offline_share": 0.95})


def test_replay_ratio_holds_env_steps_per_update_both_ways(tmp_path, dataset):
    """--source.env-steps-per-update R: after update k, env steps lie within [e0 + R·(k-s0) - slack, e0 +
    R·(k-s0) + one episode per collector]: collectors pause when ahead, the learner waits when they are behind."""
    from dmrl.train.online import PACE_SLACK, OnlineSource

    seen = []
    after_update = OnlineSource.after_update

    def spy(self, step, logs, algo):
        seen.append((step, self.env_steps.value, self.pace_origin))
        after_update(self, step, logs, algo)

    ratio, steps = 50, 24
    online = {**ONLINE, "env_steps_per_update": ratio}
    OnlineSource.after_update = spy
    try:
        summary = train(_cfg(dataset, tmp_path / "run", steps=steps, source=online), progress=False)
    finally:
        OnlineSource.after_update = after_update
    assert summary["train_steps"] == steps and len(seen) == steps
    one_episode_each = 2 * ONLINE["max_episode_steps"]  # 2 collectors (the default)
    for step, env, (s0, e0) in seen:
        assert env - e0 >= ratio * (step - 1 - s0) - PACE_SLACK, (step, env, e0)
        assert env - e0 <= ratio * (step - 1 - s0) + one_episode_each, (step, env, e0)
    step, env, (s0, e0) = seen[-1]
    assert env - e0 >= ratio * (steps - 1) - PACE_SLACK > 0  # the learner waited for the collectors
    assert not mp.active_children()
    with pytest.raises(ValueError, match="env-steps-per-update needs --source.backend process"):
        _cfg(dataset, tmp_path / "x", source={**online, "backend": "ray"})
    with pytest.raises(ValueError, match="env-steps-per-update: got -1"):
        _cfg(dataset, tmp_path / "x", source={**online, "env_steps_per_update": -1})


def test_dsrl_online_collects_with_the_steered_policy_and_keeps_the_policy_frozen(tmp_path, dataset):
    from dmrl.train.online import OnlineSource

    acting = []
    start = OnlineSource.start

    def spy(self, algo, start_step):
        start(self, algo, start_step)
        collector = self.collectors.args(0, 0)[1]  # the policy the collector processes were handed
        acting.append((type(algo.evaluation_policy()).__name__, type(collector).__name__, collector.explore_std))

    dsrl = {"type": "dsrl", "actor_hidden": 16, "critic": {"hidden": 32, "depth": 2}}
    with pytest.raises(ValueError, match="dsrl steers a trained diffusion policy, frozen: pass --init"):
        train(_cfg(dataset, tmp_path / "no_init", algo=dsrl, steps=4, source=ONLINE), progress=False)
    assert not (tmp_path / "no_init").exists()
    cfg = _cfg(dataset, tmp_path / "run", algo=dsrl, steps=4, source=ONLINE)
    save_policy(tmp_path / "init", build_from_store(cfg, EpisodeStore.open(dataset))[0])  # the policy it steers
    OnlineSource.start = spy
    try:
        summary = train(merge(cfg, {"init": str(tmp_path / "init")}), progress=False)
    finally:
        OnlineSource.start = start
    assert acting == [("SteeredPolicy", "SteeredPolicy", 1.0)]  # evaluation deterministic, collectors explore
    assert summary["train_steps"] == 4 and summary["env_steps"] > 0
    lines = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert any("critic_noise_loss" in x and "actor_loss" in x for x in lines)
    policy, _ = load_policy(tmp_path / "run" / "checkpoint")
    assert policy.name == "diffusion"
    with pytest.raises(ValueError, match="bc-data successes is an option of"):
        _cfg(dataset, tmp_path / "x", algo=dsrl, source={**ONLINE, "bc_data": "successes"})
