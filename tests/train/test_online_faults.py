"""Fault injection in online training (issue 31 §3): a child SIGKILLed while it holds a shared lock does not block
the learner; the run's children.json names its live children (a restarted collector too); a SIGKILLed evaluator is
restarted; a SIGKILLed learner leaves no child behind and resumes with the replay its last training state held."""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import yaml
from online_tiny import ONLINE, TINY, alive, children, collect_tiny

from dmrl.config_utils import merge
from dmrl.data import EpisodeStore
from dmrl.data.replay import ReplayBuffer, ReplayConfig
from dmrl.train.config import TrainConfig
from dmrl.train.engine.state import state_dirs
from dmrl.train.offline import build_from_store
from dmrl.train.online_workers import StepCounter, WeightBoard
from dmrl.train.run import train


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    return collect_tiny(tmp_path_factory.mktemp("data") / "d.zarr")


def _lines(run: Path) -> list[dict]:
    return [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]


def test_replay_state_dict_round_trip_keeps_items_counter_and_priorities():
    spec = {"x": ((3,), np.float32), "episode": ((), np.int64)}
    cfg = ReplayConfig(capacity=10)
    with ReplayBuffer(spec, cfg) as a, ReplayBuffer(spec, cfg) as b:
        a.add({"x": np.arange(42, dtype=np.float32).reshape(14, 3), "episode": np.arange(14)})  # wrapped once
        a.update_priorities(np.array([1, 2]), np.array([5.0, 0.1]))
        b.load_state_dict(a.state_dict())
        assert (b.n_written, len(b), b.pos) == (14, 10, 4)
        np.testing.assert_array_equal(b.gather(np.arange(10))["x"], a.gather(np.arange(10))["x"])
        np.testing.assert_allclose(b.priorities(np.arange(10)), a.priorities(np.arange(10)))
        with pytest.raises(ValueError, match=r"replay state\['x'\]"):
            b.load_state_dict({**a.state_dict(), "x": np.zeros((10, 4), np.float32)})


def _hold(lock, ready) -> None:
    """Child: take ``lock``, say so, and sleep holding it until killed."""
    lock.acquire()
    ready.send(True)
    time.sleep(120)


@pytest.mark.parametrize("shared", ["weight_board", "env_steps"])
def test_a_child_killed_holding_a_shared_lock_does_not_block_the_learner(dataset, shared):
    ctx = mp.get_context("spawn")
    if shared == "weight_board":
        cfg = merge(TrainConfig(), {**TINY, "dataset": str(dataset), "out": "unused"})
        policy, _ = build_from_store(cfg, EpisodeStore.open(dataset))
        board = WeightBoard(policy, ctx)
        lock, work, close = board.handle()[3], lambda: board.publish(policy), board.close
    else:
        counter = StepCounter(ctx, 0)
        lock, work, close = counter.lock, lambda: counter.add(5), counter.close
    mine, theirs = ctx.Pipe()
    child = ctx.Process(target=_hold, args=(lock, theirs), daemon=True)
    child.start()
    try:
        assert mine.poll(60) and mine.recv(), "the child never took the lock"
        assert not lock.acquire(timeout=0.1)  # held by the child
        os.kill(child.pid, signal.SIGKILL)
        t0 = time.monotonic()
        assert lock.acquire(timeout=1.0), "the lock of a SIGKILLed child was not released"
        assert time.monotonic() - t0 < 1.0
        lock.release()
        work()  # publishing the weights / counting env steps takes the lock again
    finally:
        child.kill()
        child.join(10)
        close()
    if shared == "env_steps":
        assert counter.value == 5


def test_children_file_names_the_live_children_and_a_restarted_collector(tmp_path, dataset):
    run = tmp_path / "run"
    seen: list[tuple[dict, dict]] = []  # (children.json, the pids the learner has) at each loop iteration
    killed: dict = {}

    def hook(info):
        pids = list(info["collector_pids"])
        now = {"learner": os.getpid(), "collectors": pids, "evaluator": info["evaluator_pid"]}
        seen.append((json.loads((run / "children.json").read_text()), now))
        if not killed and info["update"] >= 2:
            killed.update(pid=pids[0], live=all(alive(p) for p in [*pids, now["evaluator"]]))
            os.kill(pids[0], signal.SIGKILL)
            time.sleep(0.5)
        elif killed and pids[0] == killed["pid"]:
            time.sleep(0.1)  # slow the learner until it restarted the collector
        elif killed and "new" not in killed:
            killed["new"] = pids[0]

    online = {**ONLINE, "eval_every": 5, "eval_episodes": 1}
    cfg = merge(TrainConfig(), {**TINY, "dataset": str(dataset), "out": str(run), "steps": 60, "source": online})
    summary = train(cfg, progress=False, hook=hook)
    assert killed["live"] and summary["collector_restarts"] >= 1 and summary["train_steps"] == 60
    assert all(file == now for file, now in seen), next((f, n) for f, n in seen if f != n)
    assert len(seen[-1][1]["collectors"]) == 2 and seen[-1][1]["evaluator"] is not None
    assert killed["new"] != killed["pid"] and seen[-1][0]["collectors"][0] == killed["new"]
    assert not (run / "children.json").exists()  # removed once the children stopped


def test_killed_evaluator_is_restarted_and_keeps_evaluating(tmp_path, dataset):
    run = tmp_path / "run"
    killed: dict = {}

    def hook(info):
        evals = [x for x in _lines(run) if "eval_success" in x] if (run / "metrics.jsonl").exists() else []
        if not killed and evals:  # after its first evaluation
            os.kill(info["evaluator_pid"], signal.SIGKILL)
            killed.update(pid=info["evaluator_pid"], update=info["update"])
            time.sleep(0.5)
        elif killed and not any(x["update"] > killed["update"] for x in evals):
            # Slow the learner until the restarted evaluator scored a new snapshot: on 2 busy cores a fresh process
            # takes tens of seconds to import torch and build its env, and 400 steps must outlast that.
            time.sleep(0.5)

    online = {**ONLINE, "eval_every": 2, "eval_episodes": 1}
    cfg = merge(TrainConfig(), {**TINY, "dataset": str(dataset), "out": str(run), "steps": 400, "source": online})
    summary = train(cfg, progress=False, hook=hook)
    assert killed and summary["train_steps"] == 400 and summary["evaluator_restarts"] >= 1
    lines = _lines(run)
    assert any(x.get("evaluator_restart") == 1 for x in lines)
    assert any(x.get("eval_success") is not None and x["update"] > killed["update"] for x in lines)
    assert not alive(killed["pid"]) and not mp.active_children()


def test_sigkilled_learner_leaves_no_child_and_resumes_with_its_replay(tmp_path, dataset):
    run, preset = tmp_path / "run", tmp_path / "tiny.yaml"
    preset.write_text(yaml.safe_dump({k: v for k, v in TINY.items() if k != "source"}))
    args = [sys.executable, "-m", "dmrl", "train", "--config", str(preset), "--source.type", "online",
            "--source.learning-starts", "4", "--source.max-episode-steps", "24", "--source.publish-every", "2",
            "--source.eval-every", "5", "--source.eval-episodes", "1", "--engine.save-every", "10",
            "--dataset", str(dataset), "--out", str(run), "--steps", "300"]  # fmt: skip
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and proc.poll() is None and not state_dirs(run):
            time.sleep(0.1)
        assert proc.poll() is None, proc.communicate()
        kids = [k for k in children(proc.pid) if alive(k)]
        assert len(kids) >= 3  # two collectors and the evaluator (plus spawn's resource tracker)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline and any(alive(k) for k in kids):
        time.sleep(0.2)
    assert not [k for k in kids if alive(k)], "orphaned child processes after the learner's SIGKILL"
    last = state_dirs(run)[-1]  # the state the resumed run starts from
    saved = json.loads((last / "online.json").read_text())
    assert saved["replay_size"] > 0 and (last / "replay.npz").is_file()

    resumed = subprocess.run([*args, "--resume"], capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    summary = json.loads((run / "summary.json").read_text())
    assert summary["train_steps"] == 300
    restored = [x for x in _lines(run) if "replay_restored" in x]
    assert len(restored) == 1 and restored[0]["step"] == int(last.name.split("_")[1])
    assert restored[0]["replay_restored"] == saved["replay_size"]
    assert restored[0]["replay_written"] == saved["replay_written"]
    assert restored[0]["env_steps_restored"] == saved["env_steps"] and summary["env_steps"] >= saved["env_steps"]


def test_a_child_reaped_elsewhere_counts_as_dead():
    """multiprocessing reports a child alive forever once something else in the process reaped it (waitpid:
    ECHILD); the learner's liveness check reads /proc as well, so the child is restarted all the same."""
    from dmrl.train.online import _dead

    p = mp.get_context("spawn").Process(target=time.sleep, args=(30,), daemon=True)
    p.start()
    assert not _dead(p)
    os.kill(p.pid, signal.SIGKILL)
    os.waitpid(p.pid, 0)  # another waiter takes the exit status
    assert p.is_alive(), "multiprocessing cannot tell any more"
    assert _dead(p)
    p._popen.returncode = -9  # let multiprocessing forget it (no exit status left to collect)
