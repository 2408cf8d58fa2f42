"""The rollout source (dmrl.train.onpolicy) and DPPO through `dmrl train`: every decision reads the env's last To
frames, chunk rewards are discounted sums of the executed steps, a time limit bootstraps from V, and a tiny run
trains, counts env steps against its budget and evaluates."""

from __future__ import annotations

import json
import types

import numpy as np
import pytest
import torch
from online_tiny import DIFFUSION, TINY, collect_tiny

from dmrl.cli import main
from dmrl.config_utils import merge
from dmrl.data import EpisodeStore
from dmrl.train.config import TrainConfig
from dmrl.train.onpolicy import RolloutSource
from dmrl.train.run import train

ROLLOUT = {"type": "rollout", "n_envs": 2, "decisions": 3, "max_episode_steps": 12}
DPPO_TINY = {**TINY, "algo": {"type": "dppo", "minibatch": 16, "epochs": 2, "critic": {"hidden": 32, "depth": 2}},
             "source": ROLLOUT, "policy": DIFFUSION}  # fmt: skip


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    return collect_tiny(tmp_path_factory.mktemp("data") / "d.zarr")


def _cfg(dataset, out, **over) -> TrainConfig:
    return merge(TrainConfig(), {**DPPO_TINY, "dataset": str(dataset), "out": str(out), **over})


class FakeAlgo:
    """Records the histories it is asked to plan from; plans zero chunks; V = 1."""

    def __init__(self, horizon: int, da: int):
        self.env_steps = torch.zeros((), dtype=torch.long)
        self.config = types.SimpleNamespace(critic=types.SimpleNamespace(gamma=0.5))
        self.actor = types.SimpleNamespace(raw_actions=lambda x: x)
        self.seen: list[dict] = []
        self.shape = (horizon, da)

    def explore(self, obs):
        self.seen.append({k: v.clone() for k, v in obs.items()})
        b = obs["state"].shape[0]
        return {"chain": torch.zeros(b, 2, *self.shape), "log_prob": torch.zeros(b, 1), "value": torch.zeros(b)}

    def state_value(self, obs):
        return torch.ones(obs["state"].shape[0])


def test_histories_are_the_last_frames_and_a_time_limit_bootstraps(dataset, monkeypatch):
    cfg = _cfg(dataset, "unused", source={**ROLLOUT, "n_envs": 1, "decisions": 4, "max_episode_steps": 12})
    store = EpisodeStore.open(dataset)
    src = RolloutSource(cfg, store, engine=types.SimpleNamespace(device=torch.device("cpu")))
    algo = FakeAlgo(cfg.chunk.horizon, 2)
    frames: list[np.ndarray] = []
    rewards: list[float] = []
    src.start(algo, 0)
    env = src.envs[0]
    algo.shape = (cfg.chunk.horizon, env.action_space.shape[0])
    reset, step = env.reset, env.step

    def record_reset(**kw):
        obs, info = reset(**kw)
        frames.append(obs["state"].copy())
        return obs, info

    def record_step(a):
        obs, r, term, trunc, info = step(a)
        frames.append(obs["state"].copy())
        rewards.append(float(r))
        return obs, r, term, trunc, info

    monkeypatch.setattr(env, "reset", record_reset)
    monkeypatch.setattr(env, "step", record_step)
    batch = src.next_batch(0)
    ta = cfg.chunk.n_action_steps  # 4: the 12-step limit ends the episode after decision 2
    h0, h1, h3 = algo.seen[0]["state"][0], algo.seen[1]["state"][0], algo.seen[3]["state"][0]
    np.testing.assert_allclose(h0.numpy(), np.stack([frames[0], frames[0]]))  # a new episode: padded
    np.testing.assert_allclose(h1.numpy(), np.stack([frames[ta - 1], frames[ta]]))  # the two newest frames
    assert batch["done"][:, 0].tolist() == [False, False, True, False]
    gammas = 0.5 ** np.arange(ta)
    assert batch["reward"][0, 0].item() == pytest.approx(float(np.dot(gammas, rewards[:ta])), rel=1e-5)
    last = float(np.dot(gammas, rewards[2 * ta : 3 * ta])) + 0.5**ta * 1.0  # + gamma^Ta V(the cut state) = 1
    assert batch["reward"][2, 0].item() == pytest.approx(last, rel=1e-5)
    np.testing.assert_allclose(h3.numpy(), np.stack([frames[3 * ta + 1]] * 2))  # reset after the limit: padded
    assert int(algo.env_steps) == 4 * ta and batch["next_value"].shape == (1,)
    src.close()


def test_dppo_trains_on_rollouts_within_its_env_step_budget(tmp_path, dataset):
    cfg = _cfg(dataset, tmp_path / "run", steps=50, eval_episodes=1, eval_envs=1,
               source={**ROLLOUT, "env_steps": 40, "curve_every": 1, "curve_episodes": 1})  # fmt: skip
    summary = train(cfg, progress=False)
    # 2 envs x 3 decisions x Ta 4 = 24 env steps per rollout: the 40-step budget ends the run after 2.
    assert summary["train_steps"] == 2 and summary["env_steps"] == 48
    lines = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [x["step"] for x in lines if "curve_success" in x] == [1, 2]
    assert any("policy_loss" not in x and "critic_loss" in x for x in lines)  # the first rollout trains V only
    assert "eval" in summary


@pytest.mark.parametrize(("algo", "source"), [("dppo", "offline"), ("qc", "rollout")])
def test_dppo_and_rollouts_go_together(dataset, algo, source):
    with pytest.raises(ValueError, match="on-policy rollouts are for --algo.type dppo"):
        _cfg(dataset, "x", algo={"type": algo}, source={"type": source})


def test_dppo_has_no_batch_size_flag(tmp_path, monkeypatch, capsys):
    # dppo ignores --batch-size (its batches are its rollouts, cut in --algo.minibatch): train --help lists it only
    # for the other algorithms, passing it is a one-line error, and a preset's value stays harmlessly.
    dppo = ["train", "--algo.type", "dppo", "--source.type", "rollout"]
    for argv, listed in ((dppo, False), (["train"], True)):
        with pytest.raises(SystemExit) as e:
            main([*argv, "--help"])
        assert e.value.code == 0 and ("--batch-size" in capsys.readouterr().out) == listed
    for flag in (["--batch-size", "64"], ["--batch_size=64"]):
        assert main([*dppo, *flag]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "--batch-size does not apply" in err[0] and "--algo.minibatch" in err[0], err
    got: list[TrainConfig] = []
    monkeypatch.setattr("dmrl.train.run.train", lambda cfg: got.append(cfg) or {})
    preset = tmp_path / "p.yaml"
    preset.write_text("batch_size: 128\n")
    assert main([*dppo, "--config", str(preset), "--steps", "3"]) == 0
    assert (got[0].algo_type, got[0].batch_size, got[0].steps) == ("dppo", 128, 3)
    assert main(["train", "--batch-size", "64", "--steps", "3"]) == 0 and got[1].batch_size == 64


def test_a_resumed_dppo_run_keeps_its_env_step_count(tmp_path, dataset, monkeypatch):
    def stop(self, step, logs, algo):  # Ctrl-C right after the first update: the trainer saves that state
        raise KeyboardInterrupt

    with monkeypatch.context() as m:
        m.setattr(RolloutSource, "after_update", stop)
        with pytest.raises(KeyboardInterrupt):
            train(_cfg(dataset, tmp_path / "run", steps=2), progress=False)
    summary = train(_cfg(dataset, tmp_path / "run", steps=2, resume=True), progress=False)
    assert summary["train_steps"] == 2 and summary["env_steps"] == 48  # the budget counts across the restart
