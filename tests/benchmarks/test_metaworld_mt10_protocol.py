"""benchmarks/metaworld_mt10.py's bookkeeping: its training flags parse with the MT10 preset, a finished run is told
from an interrupted one, and the per-task table and averages from hand-made eval results (no env, no training)."""

import json
from pathlib import Path

import pytest

from script_module import script_module

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def mt():
    yield from script_module("benchmarks/metaworld_mt10.py", "mt10_protocol")


def test_train_argv_parses_with_the_preset_and_reads_rgb_proprio_and_the_instruction(mt, tmp_path):
    from dmrl.cli import _parse, _split_preset
    from dmrl.config_utils import load_yaml, merge
    from dmrl.train.config import TrainConfig

    a = mt.Args(seeds=(2,), steps=300)
    argv = mt.train_argv(a, tmp_path / "demos.zarr", tmp_path / "run", 2)
    preset, rest = _split_preset(argv[1:])
    assert argv[0] == "train" and Path(preset) == ROOT / "configs" / "metaworld_mt10.yaml"
    cfg = _parse(TrainConfig, rest, "dmrl train", merge(TrainConfig(), load_yaml(preset)))
    assert cfg is not None, "dmrl train rejected the benchmark's flags"
    assert (cfg.steps, cfg.seed, cfg.source.curve_every) == (300, 2, a.curve_every)
    assert list(cfg.chunk.obs_keys) == ["rgb", "joints", "instruction"]
    enc = cfg.chunk.encoder
    assert enc.language.trainable_layers == 0 and enc.instruction_film and enc.instruction_queries
    assert enc.instruction_token_dropout > 0 and enc.rgb_encoder == "resnet"
    # The single-task protocol's encoder and auxiliary head (benchmarks/metaworld.py), unchanged.
    assert tuple(enc.resnet.widths) == (16, 16, 32, 32) and tuple(enc.resnet.stage_strides) == (1, 1, 2, 2)
    assert tuple(cfg.chunk.aux_state) == (4, 5, 6, 36, 37, 38)
    default_steps = _parse(TrainConfig, [], "dmrl train", merge(TrainConfig(), load_yaml(preset))).steps
    assert "--steps" not in mt.train_argv(mt.Args(), tmp_path / "d", tmp_path / "r", 0) and default_steps > 1000


def _write_run(mt, a, run: Path, data: Path, seed: int = 0) -> None:
    """config.json as dmrl train writes it for the benchmark's command."""
    from dmrl.cli import parse_config
    from dmrl.config_utils import to_dict

    run.mkdir(parents=True, exist_ok=True)
    (run / "config.json").write_text(json.dumps(to_dict(parse_config(mt.train_argv(a, data, run, seed))), indent=2))


def test_a_finished_run_is_reused_an_interrupted_one_resumed_and_one_of_other_settings_never_touched(mt, tmp_path):
    data, run = tmp_path / "demos.zarr", tmp_path / "run_seed0"
    a = mt.Args(steps=300)
    assert mt.plan_training(mt.train_argv(a, data, run, 0), run) == "fresh"  # nothing there
    _write_run(mt, a, run, data)
    assert not mt._finished(run)
    assert mt.plan_training(mt.train_argv(a, data, run, 0), run) == "fresh"  # started, saved nothing
    (run / "state" / "step_2000").mkdir(parents=True)
    assert mt.plan_training(mt.train_argv(a, data, run, 0), run) == "resume"
    (run / "summary.json").write_text(json.dumps({"train_steps": 300}))  # dmrl writes it when a run completes
    assert mt._finished(run) and mt.plan_training(mt.train_argv(a, data, run, 0), run) == "reuse"
    # Where, how often and how many episodes it evaluates do not make another run ...
    faster = mt.Args(steps=300, eval_envs=4, curve_every=500, curve_episodes=10)
    assert mt.plan_training(mt.train_argv(faster, data, run, 0), run) == "reuse"
    # ... what it trains does, and the run is left as it is, with a one-line reason.
    for other, seed in ((mt.Args(steps=400), 0), (mt.Args(steps=300), 1)):
        with pytest.raises(SystemExit, match=r"was trained with (steps|seed) = .*move it away") as e:
            mt.plan_training(mt.train_argv(other, data, run, seed), run)
        assert "\n" not in str(e.value)
    assert (run / "summary.json").is_file() and (run / "state" / "step_2000").is_dir()
    stray = tmp_path / "stray"
    (stray / "x").mkdir(parents=True)
    with pytest.raises(SystemExit, match="other than a dmrl run"):
        mt.plan_training(mt.train_argv(a, data, stray, 0), stray)


def test_an_evaluation_is_reused_only_if_readable_newer_than_the_weights_and_on_the_same_seeds(mt, tmp_path):
    import os

    weights, path = tmp_path / "policy.safetensors", tmp_path / "eval.json"
    weights.write_bytes(b"w")
    os.utime(weights, (1000, 1000))
    assert not mt._done(path, weights, [100000, 100019])  # absent
    path.write_text('{"seeds": [100000, 1')  # cut short by a crash
    assert not mt._done(path, weights, [100000, 100019])
    path.write_text(json.dumps({"seeds": [100000, 100019]}))
    assert mt._done(path, weights, [100000, 100019]) and not mt._done(path, weights, [100000, 100009])
    os.utime(weights, (path.stat().st_mtime + 10,) * 2)  # retrained after the evaluation
    assert not mt._done(path, weights, [100000, 100019])


def test_rows_pool_seeds_and_averages_are_over_the_ten_tasks(mt):
    def result(k: int, n: int = 20) -> dict:
        return {"success_rate": k / n, "ci_low": 0.1, "ci_high": 0.9, "episodes": n}

    per_seed = {
        0: {t: {"train": result(i), "heldout": result(i // 2)} for i, t in enumerate(mt.MT10)},
        1: {t: {"train": result(i + 2), "heldout": result(0)} for i, t in enumerate(mt.MT10)},
    }
    probe = {
        t: {"heldout_sentence": f"s{i}", "nearest_text": t, "nearest_film": mt.MT10[0]}
        | {"margin_text": 0.2, "margin_film": -0.3}
        for i, t in enumerate(mt.MT10)
    }
    located = {"object_error_cm": 6.4, "object_spread_cm": 6.5, "goal_error_cm": 1.0, "goal_spread_cm": 5.3}
    positions = {s: {t: located for t in mt.MT10} for s in (0, 1)}
    rows, avg = mt.rows_and_summary(per_seed, {t: 1.0 for t in mt.MT10}, {0: probe, 1: probe}, positions)
    # The schema: a row per task and paraphrase set.
    assert [(r["task"], r["paraphrases"]) for r in rows] == [(t, s) for t in mt.MT10 for s in ("train", "heldout")]
    train3 = rows[6]
    assert (train3["task"], train3["paraphrases"]) == (mt.MT10[3], "train")
    assert train3["episodes"] == 40 and train3["success_rate"] == 100 * (3 + 5) / 40
    assert train3["per_seed"] == {"0": 15.0, "1": 25.0} and train3["ci"][0] < 20.0 < train3["ci"][1]
    assert rows[7]["lands_near"] == {"text": mt.MT10[3], "film_seed0": mt.MT10[0], "film_seed1": mt.MT10[0]}
    assert rows[7]["margin"] == {"text": 0.2, "film_seed0": -0.3, "film_seed1": -0.3}
    assert avg["average_train"] == pytest.approx(100 * (sum(range(10)) + sum(range(2, 12))) / 40 / 10, abs=0.05)
    assert avg["average_train_per_seed"] == {"0": 22.5, "1": 32.5}
    assert avg["average_heldout_per_seed"] == {"0": 10.0, "1": 0.0} and avg["average_heldout"] == 5.0
    md = mt.markdown("x", rows, avg, {"command": "c"})
    assert "| **average over tasks** | **27.5** | | **5.0** |" in md
    assert f"| {mt.MT10[3]} | 20.0 |" in md and "15.0 / 5.0 ; 25.0 / 0.0" in md
    assert train3["located"] == {"0": located, "1": located} and "located" not in rows[7]
    assert "| 6.4 / 6.5, 1.0 / 5.3 ; 6.4 / 6.5, 1.0 / 5.3 |" in md


def test_language_probe_names_the_nearest_train_task_and_the_margin(mt, monkeypatch):
    import torch

    import dmrl.policies.checkpoint as checkpoint

    class Encoder:
        """Train sentences of task i lie on axis i; held-out sentence i on axis i, except task 2's on axis 5."""

        def instruction_views(self, sentences):
            heldout = len(sentences) == len(mt.MT10)
            axis = [(5 if i == 2 else i) for i in range(10)] if heldout else [i // 2 for i in range(20)]
            film = torch.eye(10)[axis] + 0.1
            return {"film": film, "tokens": film}

    monkeypatch.setattr(checkpoint, "load_policy", lambda path: (type("P", (), {"encoder": Encoder()})(), {}))
    probe = mt.language_probe(Path("unused"), {t: [f"{t} one way", f"{t} another"] for t in mt.MT10})
    assert list(probe) == list(mt.MT10) and probe[mt.MT10[0]]["heldout_sentence"]
    assert probe[mt.MT10[0]]["nearest_film"] == mt.MT10[0] and probe[mt.MT10[0]]["margin_film"] > 0.5
    assert probe[mt.MT10[2]]["nearest_film"] == mt.MT10[5] and probe[mt.MT10[2]]["margin_film"] < -0.5
    assert "nearest_text" not in probe[mt.MT10[0]]  # a view the encoder does not give is left out


def test_position_probe_scores_a_mean_predictor_at_the_spread_and_a_perfect_one_at_zero(mt, monkeypatch):
    import numpy as np
    import torch

    import dmrl.envs.suites.metaworld as adapter
    import dmrl.policies.checkpoint as checkpoint

    class Env:
        def __init__(self, task, obs_modes):
            self.obs_modes = obs_modes

        def reset(self, seed):
            state = np.random.default_rng(seed).uniform(-0.1, 0.1, 39)
            return {"joints": state[:4].astype(np.float32), "state": state}, {}

        def close(self):
            pass

    class Policy:
        chunk = type("C", (), {"obs_keys": ("joints",), "n_obs_steps": 2, "aux_state": (4, 5, 6, 36, 37, 38)})
        aux_offset, aux_scale = torch.zeros(6), torch.ones(6)

        def __init__(self, perfect: bool):
            self.perfect = perfect

        def encode(self, history):
            assert history["joints"].shape == (1, 2, 4)  # the reset frame, repeated To times
            seed = int(round(float(history["joints"][0, -1, 0]) * 1e6))
            return torch.tensor([[seed]]) if self.perfect else torch.zeros(1, 1)

        def aux_head(self, key):
            if not self.perfect:
                return self.mean[None]
            state = self.by_key[int(key)]
            return torch.as_tensor(state[[4, 5, 6, 36, 37, 38]], dtype=torch.float32)[None]

    seeds = range(7, 27)
    states = [Env("t", ()).reset(s)[0]["state"] for s in seeds]
    monkeypatch.setattr(adapter, "MetaWorldEnv", Env)
    for perfect in (True, False):
        policy = Policy(perfect)
        policy.mean = torch.as_tensor(np.mean([s[[4, 5, 6, 36, 37, 38]] for s in states], 0), dtype=torch.float32)
        policy.by_key = {int(round(float(np.float32(s[0])) * 1e6)): s for s in states}
        monkeypatch.setattr(checkpoint, "load_policy", lambda path, p=policy: (p, {}))
        probe = mt.position_probe(Path("unused"), seeds)
        assert list(probe) == list(mt.MT10)
        row = probe[mt.MT10[0]]
        if perfect:
            assert row["object_error_cm"] == 0.0 and row["goal_error_cm"] == 0.0 and row["goal_spread_cm"] > 5
        else:
            assert row["object_error_cm"] == row["object_spread_cm"] and row["goal_error_cm"] == row["goal_spread_cm"]
