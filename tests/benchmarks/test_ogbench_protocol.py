"""benchmarks/ogbench.py: its bookkeeping on hand-made run JSONs, the segment stopper, and one tiny run end to end
(OGBench play data -> QC in two segments, stopped and resumed -> run JSON -> table)."""

import json
import signal
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from script_module import script_module

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def og():
    # Not imported as `ogbench`: that is OGBench's package name.
    yield from script_module("benchmarks/ogbench.py", "og_protocol")


def test_the_script_does_not_shadow_the_ogbench_package(og):
    assert all(Path(p or ".").resolve() != ROOT / "benchmarks" for p in sys.path)


def test_run_specs_and_flags_are_checked(og, capsys):
    assert og.parse_run("scene:2:qc:0") == ("scene", 2, "qc", 0)
    for bad in ("scene:2:qc", "puzzle:2:qc:0", "scene:6:qc:0", "scene:2:sac:0", "scene:x:qc:0"):
        with pytest.raises(ValueError, match="env:task:method:seed"):
            og.parse_run(bad)
    with pytest.raises(SystemExit) as e:
        og.main(["--curve-every", "3000"])  # 100000 is no multiple: points would miss the published ones
    assert e.value.code == 2 and "divisor of 100000" in capsys.readouterr().err


def test_published_points_are_matched_at_equal_updates_only(og):
    assert og.published("scene", 2, "qc", 100_000) == 0.97
    assert og.published("scene", 2, "qc", 95_000) is None and og.published("scene", 2, "fql", 100_000) is None
    assert og.published("cube-double", 2, "qc", 300_000) == 0.31


def test_aggregate_rows_and_curve_merge(og, tmp_path):
    old = [{"updates": 5000, "success_rate": 0.2, "ci_low": 0.1, "ci_high": 0.3, "episodes": 50}]
    new = [{"updates": u, "success_rate": s, "ci_low": 0.0, "ci_high": 1.0} for u, s in ((5000, 0.9), (100_000, 0.8))]
    curve = og.merge_curve(old, new, episodes=20)
    assert [(p["updates"], p["success_rate"], p["episodes"]) for p in curve] == [(5000, 0.2, 50), (100_000, 0.8, 20)]
    seg = {"minutes": 10.0, "updates_per_s": 2.0, "load_mean": 3.0}
    record = {"env": "scene", "task": 2, "method": "qc", "seed": 0, "data_episodes": 100, "curve": curve}
    record |= {"updates_done": 100_000, "updates_target": 1_000_000, "segments": [seg]}
    (tmp_path / "runs").mkdir()
    (tmp_path / "runs" / "r.json").write_text(json.dumps(record))  # a run from before per-step terminals
    (tmp_path / "runs" / "t.json").write_text(json.dumps(record | {"seed": 1, "terminals": True}))
    rows = og.aggregate(tmp_path / "runs", tmp_path / "results")
    assert [(r["seed"], r["updates"], r["published_qc"], r["published_fql"], r["td_terminals"]) for r in rows] == [
        (0, 5000, None, None, False),
        (0, 100_000, 0.97, None, False),
        (1, 5000, None, None, True),
        (1, 100_000, 0.97, None, True),
    ]
    assert rows[1]["dataset"] == "scene-play-singletask-task2" and rows[1]["run_complete"] == "100000/1000000"
    md = (tmp_path / "results" / "ogbench.md").read_text()
    assert "not the published files" in md and "| scene-play-singletask-task2 | qc | 0 | 100000 | 0.800 |" in md
    assert "| scene-task2__qc__seed0__data100ep | " in md and "| scene-task2__qc__seed1__data100ep__term | " in md


def test_stopper_interrupts_after_the_next_curve_point(og, tmp_path, monkeypatch):
    monkeypatch.setattr(og.Stopper, "POLL", 0.1)
    monkeypatch.setattr(og.Stopper, "SETTLE", 0.2)
    metrics = tmp_path / "metrics.jsonl"
    metrics.write_text('{"step": 2, "curve_success": 0.5}\n')
    signal.signal(signal.SIGINT, signal.default_int_handler)
    t0 = time.time()
    with pytest.raises(KeyboardInterrupt), og.Stopper(metrics, minutes=0.0, grace=5.0) as stop:
        time.sleep(1.0)  # the deadline has passed, but no new point yet: no interrupt
        assert not stop.stopped
        with metrics.open("a") as f:
            f.write('{"step": 4, "curve_success": 0.5}\n')
        time.sleep(30)
    assert stop.stopped and time.time() - t0 < 5


def test_a_tiny_run_in_two_segments(og, tmp_path, monkeypatch):
    """1 play episode collected with the oracles -> QC, a segment stopped after its first curve point, then resumed
    to the end -> run and data JSON -> table."""
    pytest.importorskip("ogbench", reason='OGBench not installed (pip install -e ".[suites]")')
    import dmrl.envs.suites.ogbench as adapter

    monkeypatch.setattr(adapter, "PLAY_STEPS", 100)  # the protocol's 1001-step play episodes, cut short
    monkeypatch.setattr(og, "BATCH", 16)  # of the 100 windows
    monkeypatch.setattr(og.Stopper, "POLL", 0.05)
    monkeypatch.setattr(og.Stopper, "SETTLE", 1.0)  # a SIGINT while dmrl writes the point's state would break it
    from dmrl.train.offline import OfflineSource

    curve = OfflineSource.curve

    def slow_curve(self, step, algo):  # a slow step 4, so that the Stopper's SIGINT lands before the run's end
        if step == 4:
            time.sleep(5)
        return curve(self, step, algo)

    monkeypatch.setattr(OfflineSource, "curve", slow_curve)
    runs, out = tmp_path / "runs", tmp_path / "out"
    a = og.Args(data_episodes=1, updates=6, minutes=1e-6, curve_every=2, curve_episodes=1)
    first = json.loads(og.run_segment("cube-single", 2, "qc", 0, a, runs_dir=runs, out=out).read_text())
    assert not first["complete"] and 2 <= first["updates_done"] < 6 and first["curve"][0]["updates"] == 2
    a.minutes = 30.0
    r = json.loads(og.run_segment("cube-single", 2, "qc", 0, a, runs_dir=runs, out=out).read_text())
    assert r["complete"] and r["updates_done"] == 6 and len(r["segments"]) == 2
    assert r["segments"][1]["updates"][0] == first["updates_done"] and "--resume" in r["dmrl_argv"]
    steps = [p["updates"] for p in r["curve"]]
    assert steps[0] == 2 and steps[-1] == 6 and steps == sorted(set(steps)) and set(steps) <= {2, 4, 6}
    assert all(p["episodes"] == 1 for p in r["curve"]) and r["segments"][-1]["updates_per_s"] > 0
    assert r["terminals"] and (runs / "cube-single-task2__qc__seed0__data1ep__term.json").is_file()
    data = json.loads((runs / "data__cube-single-task2_1ep_term.json").read_text())
    assert data["steps"] == 100 and data["steps_per_s"] > 0 and data["terminals"]
    from dmrl.data import EpisodeStore

    store = EpisodeStore.open(out / "data" / "cube-single-task2_1ep_term.zarr")  # what the run trained on
    share = float(np.asarray(store.array("terminals")[:100]).mean())
    assert store.has_terminals and data["terminal_step_share"] == round(share, 5)
    rows = og.aggregate(runs, tmp_path / "results")
    assert [row["updates"] for row in rows] == steps
