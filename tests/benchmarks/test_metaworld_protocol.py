"""benchmarks/metaworld.py's bookkeeping: the run order, the per-run score and the aggregate over seeds, on hand-made
run JSONs (no env, no training)."""

import json
import sys
from pathlib import Path

import pytest

from script_module import script_module

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def mw():
    # Not imported as `metaworld`: that is the Meta-World package's name.
    yield from script_module("benchmarks/metaworld.py", "mw_protocol")


def write_run(mw, runs: Path, task: str, policy: str, seed: int, curve: list[float], proto: dict) -> None:
    top5, final = mw.top5_final(curve)
    record = {"task": task, "policy": policy, "seed": seed, "success_top5": top5, "success_final": final}
    record |= {"curve": [[100 * (i + 1), s] for i, s in enumerate(curve)], "protocol": proto}
    record |= {"train_minutes": 50.0 + seed, "load_mean": 2.0}
    (runs / f"{mw.run_name(task, policy, seed)}.json").write_text(json.dumps(record))


def test_the_script_does_not_shadow_the_metaworld_package(mw):
    assert all(Path(p or ".").resolve() != ROOT / "benchmarks" for p in sys.path)


def test_top5_is_the_mean_of_the_five_best_points_and_final_the_last(mw):
    top5, final = mw.top5_final([0.1, 0.9, 0.5, 0.7, 0.3, 0.8, 0.2, 0.6])
    assert top5 == pytest.approx((0.9 + 0.8 + 0.7 + 0.6 + 0.5) / 5)
    assert final == 0.6
    assert mw.top5_final([0.4, 0.2]) == (pytest.approx(0.3), 0.2)  # fewer than 5 points: all of them
    with pytest.raises(ValueError):
        mw.top5_final([])


def test_plan_starts_with_diffusion_seed0_on_every_task(mw):
    plan = mw.planned()
    assert len(plan) == len(mw.TASKS) * 3 * 3 == len(set(plan))
    assert plan[0] == ("button-press-v3", "diffusion", 0)
    assert [p for _, p, s in plan[: len(mw.TASKS)]] == ["diffusion"] * len(mw.TASKS)
    for required in ("button-press-v3", "door-open-v3", "drawer-open-v3", "assembly-v3", "pick-place-v3"):
        assert required in mw.TASKS
    assert set(mw.GROUP) == set(mw.TASKS)


def test_aggregate_means_and_stds_over_the_seeds_done_and_counts_the_missing(mw, tmp_path):
    proto = mw.protocol()
    write_run(mw, tmp_path, "button-press-v3", "diffusion", 0, [0.5, 0.6, 0.7, 0.8, 0.9, 1.0], proto)
    write_run(mw, tmp_path, "button-press-v3", "diffusion", 2, [0.2, 0.3, 0.4, 0.5, 0.6, 0.7], proto)
    write_run(mw, tmp_path, "door-open-v3", "vae", 1, [0.0, 0.1], proto)
    write_run(mw, tmp_path, "door-open-v3", "vae", 0, [1.0], {**proto, "steps": 1})  # another budget: not counted

    runs, skipped = mw.read_runs(tmp_path, proto)
    rows, done = mw.aggregate_rows(runs, mw.planned())

    assert done == 3 and skipped == ["door-open-v3__vae__seed0.json"]
    assert len(rows) == len(mw.TASKS) * 3
    bp = next(r for r in rows if (r["task"], r["policy"]) == ("button-press-v3", "diffusion"))
    # top-5: 80 and 50 -> 65 ± 15; final: 100 and 70 -> 85 ± 15 (population std)
    assert (bp["success_top5"], bp["success_top5_std"]) == (80.0 - 15.0, 15.0)
    assert (bp["success_final"], bp["success_final_std"]) == (85.0, 15.0)
    assert bp["seeds"] == "2/3" and bp["seeds_done"] == [0, 2]
    assert (bp["published_dp"], bp["published_dp3"]) == (99, 100)
    vae = next(r for r in rows if (r["task"], r["policy"]) == ("door-open-v3", "vae"))
    assert (vae["success_top5"], vae["success_top5_std"], vae["seeds"]) == (5.0, 0.0, "1/3")
    empty = next(r for r in rows if (r["task"], r["policy"]) == ("hammer-v3", "gaussian"))
    assert empty["success_top5"] is None and empty["seeds"] == "0/3" and empty["published_dp"] is None
    md = mw.markdown(rows, {"runs": f"runs done / planned: {done} / 90"})
    assert "runs done / planned: 3 / 90" in md and "| 65.0 ± 15.0 | 85.0 ± 15.0 | 2/3 | 99 | 100 |" in md


def test_a_run_outside_the_protocol_is_a_one_line_error(mw):
    assert mw.parse_run("pick-place-v3:vae:2") == ("pick-place-v3", "vae", 2)
    for bad in ("pick-place-v3:vae", "reach-v3:diffusion:0", "pick-place-v3:mlp:0", "pick-place-v3:vae:7"):
        with pytest.raises(ValueError, match="--runs"):
            mw.parse_run(bad)


def test_read_curve_takes_the_whole_protocol_curve_only(mw, tmp_path):
    steps = list(range(mw.CURVE_EVERY, mw.STEPS + 1, mw.CURVE_EVERY))
    lines = [{"step": s, "loss": 0.1} for s in range(50, mw.STEPS + 1, 50)]
    lines += [{"step": s, "curve_success": i / 10} for i, s in enumerate(steps)]
    metrics = tmp_path / "metrics.jsonl"
    metrics.write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    assert mw.read_curve(metrics) == [[s, i / 10] for i, s in enumerate(steps)]
    metrics.write_text("\n".join(json.dumps(x) for x in lines[:-1]) + "\n")  # the last point missing
    with pytest.raises(ValueError, match="expected"):
        mw.read_curve(metrics)


def test_a_published_zero_is_shown_as_zero(mw):
    rows, _ = mw.aggregate_rows({}, [("pick-place-v3", "diffusion", 0)])
    assert "| 0/1 | 0 | 12 |" in mw.markdown(rows, {"runs": "runs done / planned: 0 / 1"})


def test_train_argv_parses_and_carries_the_protocols_encoder_and_aux_head(mw, tmp_path):
    from dmrl.cli import _parse
    from dmrl.train.config import TrainConfig

    argv = mw.train_argv(tmp_path / "demos.zarr", tmp_path / "run", "vae", 2)
    assert argv[0] == "train"
    cfg = _parse(TrainConfig, argv[1:], "dmrl train")
    assert cfg is not None, "dmrl train rejected the protocol's flags"
    assert (cfg.steps, cfg.batch_size, cfg.seed) == (mw.STEPS, mw.BATCH, 2)
    assert type(cfg.policy).__name__ == "VAEPolicyConfig"
    assert list(cfg.chunk.obs_keys) == ["rgb", "joints"]
    enc = cfg.chunk.encoder
    assert (enc.rgb_encoder, enc.image_obs_steps, enc.resnet.stem_pool) == ("resnet", 1, False)
    assert tuple(enc.resnet.widths) == (16, 16, 32, 32) and tuple(enc.resnet.stage_strides) == (1, 1, 2, 2)
    assert tuple(cfg.chunk.aux_state) == mw.AUX_STATE == tuple(mw.protocol()["aux_state"])
    assert cfg.source.curve_every == mw.CURVE_EVERY and mw.STEPS % mw.CURVE_EVERY == 0
    assert cfg.eval_seed == 100000  # report seeds; the pilots selected on 200000..


def test_only_an_interrupted_run_of_this_protocol_is_resumed(mw, tmp_path):
    out = tmp_path / "button-press-v3__diffusion__seed0"
    (out / "state" / "step_450").mkdir(parents=True)
    (out / "config.json").write_text("{}")
    assert not mw.can_resume(out)  # no record of its protocol: the first protocol's run, started over
    mw.protocol_file(out).write_text(json.dumps({**mw.protocol(), "steps": 1500}))
    assert not mw.can_resume(out)
    mw.protocol_file(out).write_text(json.dumps(mw.protocol()))
    assert mw.can_resume(out)
    (out / "state" / "step_450").rmdir()
    assert not mw.can_resume(out)  # nothing to resume from
