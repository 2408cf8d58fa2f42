"""Online training with --source.backend ray: collector actors fill the learner's replay, a killed actor is
restarted, and one collector collects what the process backend's collector does. One local Ray cluster (node
address 127.0.0.1) serves the whole module."""

from __future__ import annotations

import json
import time

import numpy as np
import pytest
from online_tiny import ONLINE, TINY, collect_tiny

from dmrl.config_utils import merge
from dmrl.train.config import TrainConfig
from dmrl.train.run import train

ray = pytest.importorskip("ray")

RAY = {**ONLINE, "backend": "ray"}


@pytest.fixture(scope="module")
def cluster():
    ray.init(
        num_cpus=4, include_dashboard=False, log_to_driver=False, object_store_memory=128 * 2**20,
        _node_ip_address="127.0.0.1",
    )  # fmt: skip
    yield
    ray.shutdown()


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    return collect_tiny(tmp_path_factory.mktemp("data") / "d.zarr")


def _cfg(dataset, out, **over) -> TrainConfig:
    return merge(TrainConfig(), {**TINY, "dataset": str(dataset), "out": str(out), **over})


def _episodes(buf) -> np.ndarray:
    return buf.gather(np.arange(len(buf)))["episode"]


def _both(ep: np.ndarray) -> bool:
    """Episode ids are seed * 1000 + n and collector i's seed is i (--seed 0): ids of both collectors are in."""
    return bool((ep < 1000).any() and ((ep >= 1000) & (ep < 2000)).any())


def _metrics(run) -> list[dict]:
    return [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]


def test_two_collector_actors_fill_the_replay(tmp_path, cluster, dataset):
    seen = {}
    deadline = time.monotonic() + 30

    def hook(info):
        while info["update"] >= 4 and not _both(_episodes(info["replay"])) and time.monotonic() < deadline:
            time.sleep(0.2)  # hold the learner until both actors' first batches are in (a slow start on 2 cores)
            assert not info["collectors"].restart_dead()  # takes batches in; no restart events to lose here
        seen["episodes"], seen["actors"] = _episodes(info["replay"]), info["collectors"].actors

    source = {**RAY, "n_collectors": 2}
    summary = train(_cfg(dataset, tmp_path / "run", steps=8, source=source), progress=False, hook=hook)
    assert summary["train_steps"] == 8 and summary["env_steps"] > 0 and summary["collector_restarts"] == 0
    assert _both(seen["episodes"]), np.unique(seen["episodes"])
    assert any(x.get("critic_loss") is not None for x in _metrics(tmp_path / "run"))
    for actor in seen["actors"]:  # the run killed its actors
        with pytest.raises(ray.exceptions.RayActorError):
            ray.get(actor.collect.remote(0, 0, [None]), timeout=30)


def test_killed_collector_actor_is_restarted_the_run_completes_and_the_evaluator_scores(tmp_path, cluster, dataset):
    killed = []

    def hook(info):
        collectors = info["collectors"]
        if info["update"] == 2 and not killed:
            ray.kill(collectors.actors[0], no_restart=False)
            killed.append(time.monotonic())
        # The wait counts from the kill: on a loaded machine ray's restart alone has taken over 30 s.
        elif killed and not (_episodes(info["replay"]) >= 1_000_000).any() and time.monotonic() < killed[0] + 120:
            time.sleep(0.5)  # slow the learner until the restarted actor (its new seed: 1000) sent a batch
        seen["episodes"] = _episodes(info["replay"])

    seen = {}
    source = {**RAY, "n_collectors": 1, "eval_every": 5, "eval_episodes": 1}
    summary = train(_cfg(dataset, tmp_path / "run", steps=20, source=source), progress=False, hook=hook)
    assert killed and summary["train_steps"] == 20 and summary["collector_restarts"] == 1
    assert (seen["episodes"] >= 1_000_000).any()  # the restarted actor collected with its new seed
    metrics = _metrics(tmp_path / "run")
    assert any(x.get("collector_restart") == 0 for x in metrics)
    assert any(0 <= x.get("eval_success", -1) <= 1 and x["eval_env_steps"] > 0 for x in metrics), metrics[-1]


def _replay(run) -> dict[str, np.ndarray]:
    (path,) = run.glob("state/**/replay.npz")
    with np.load(path) as z:
        return {k: z[k] for k in z.files}


def test_one_collector_collects_what_the_process_backend_collects(tmp_path, cluster, dataset):
    """The weights never change (publish_every > steps), so both collectors roll out the same actor with the same
    seeds: the episodes each got to (a matter of timing) agree item for item, every key bit for bit."""
    source = {**ONLINE, "n_collectors": 1, "publish_every": 1000}
    rings = {}
    for backend in ("process", "ray"):
        run = tmp_path / backend
        train(_cfg(dataset, run, steps=3, source={**source, "backend": backend}), progress=False)
        rings[backend] = _replay(run)
    a, b = rings["process"], rings["ray"]
    n = min(int(a["__count__"]), int(b["__count__"]))
    assert n >= ONLINE["learning_starts"]
    keys = [k for k in a if not k.startswith("__")]
    assert "obs.state" in keys and "action" in keys
    for k in keys:
        np.testing.assert_array_equal(a[k][:n], b[k][:n], err_msg=k)


def test_backend_flags_are_checked_and_the_process_backend_needs_no_ray(monkeypatch):
    import subprocess
    import sys

    from dmrl.train.ray_workers import import_ray

    monkeypatch.setitem(sys.modules, "ray", None)  # as if Ray were not installed
    with pytest.raises(ValueError, match=r"--source.backend ray needs Ray: pip install 'dmrl\[ray\]'"):
        import_ray()
    monkeypatch.undo()

    with pytest.raises(ValueError, match="--source.backend: got 'threads'; allowed: process, ray"):
        merge(TrainConfig(), {"source": {"type": "online", "backend": "threads"}})
    with pytest.raises(ValueError, match="--source.ray-address 10.0.0.1:6379 needs --source.backend ray"):
        merge(TrainConfig(), {"source": {"type": "online", "ray_address": "10.0.0.1:6379"}})
    code = "import sys, dmrl.train.online, dmrl.train.run; assert 'ray' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
