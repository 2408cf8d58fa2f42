"""Crash safety: an interrupted append (exception, Ctrl-C, SIGKILL) never costs a committed episode."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import zarr
from synthetic_episodes import assert_episode_equal, create_store, make_episode

import dmrl.data.episodes as episodes_mod
from dmrl.data import EpisodeStore


def _fail_after(monkeypatch, n_ok: int, exc: type[BaseException]) -> None:
    """Let the data batch of an append land only its first n_ok writes, then raise (no commit)."""
    real = episodes_mod.write_batch

    def flaky(writes):
        assert len(writes) == 18  # this spec: 2 obs + 2 final + actions + rewards + 6 meta + 3 x 2 text
        real(writes[:n_ok])
        raise exc("simulated crash")

    monkeypatch.setattr(episodes_mod, "write_batch", flaky)


def _check(path: Path, seeds: list[int]) -> EpisodeStore:
    store = EpisodeStore.open(path)
    assert store.n_episodes == len(seeds)
    assert store.n_steps == sum(make_episode(s).length for s in seeds)
    for i, s in enumerate(seeds):
        assert_episode_equal(store.episode(i), make_episode(s))
    return store


@pytest.mark.parametrize("n_ok", [0, 3, 9, 18])
def test_partial_append_is_invisible_and_truncated(store_path, monkeypatch, n_ok):
    store = create_store(store_path)
    store.append(make_episode(0))
    store.append(make_episode(1))
    with monkeypatch.context() as m:
        _fail_after(m, n_ok, KeyboardInterrupt if n_ok == 9 else RuntimeError)
        with pytest.raises((RuntimeError, KeyboardInterrupt), match="simulated crash"):
            store.append(make_episode(2, length=7))
    assert store.n_episodes == 2
    reader = _check(store_path, [0, 1])
    if n_ok == 18:  # everything but the commit was written: readers see longer arrays but ignore the tail
        assert reader.array("actions").shape[0] > reader.n_steps
    writer = EpisodeStore.open(store_path, mode="a")  # truncates the uncommitted tail
    for name in ("rgb", "state", "actions", "rewards"):
        assert writer.array(name).shape[0] == writer.n_steps
    writer.append(make_episode(3))
    _check(store_path, [0, 1, 3])


def test_interrupted_writer_object_carries_on(store_path, monkeypatch):
    store = create_store(store_path)
    store.append(make_episode(0))
    with monkeypatch.context() as m:
        _fail_after(m, 12, KeyboardInterrupt)
        with pytest.raises(KeyboardInterrupt):
            store.append(make_episode(1, length=9))
    store.append(make_episode(2))  # offsets come from the committed counters: the debris is overwritten
    _check(store_path, [0, 2])


def test_grown_but_unwritten_commit_entry_is_ignored(store_path):
    store = create_store(store_path)
    store.append(make_episode(0))
    ends = zarr.open_group(str(store_path), mode="r+")["meta/episode_ends"]
    ends.resize((2,))  # killed between the resize and the chunk write of the commit: entry reads as -1
    (store_path / "data" / "actions" / "c").mkdir(exist_ok=True)
    stray = store_path / "data" / "actions" / "c" / "0.deadbeef.partial"
    stray.write_bytes(b"torn")
    _check(store_path, [0])
    writer = EpisodeStore.open(store_path, mode="a")
    assert not stray.exists() and writer.n_episodes == 1
    writer.append(make_episode(5))
    _check(store_path, [0, 5])


CHILD = """
import sys
sys.path.insert(0, {tests!r})
from synthetic_episodes import create_store, make_episode
store = create_store({path!r})
seed = 0
while True:
    store.append(make_episode(seed))
    print(store.n_episodes, flush=True)
    seed += 1
"""


def test_sigkill_mid_collection_keeps_committed_episodes(store_path):
    code = textwrap.dedent(CHILD.format(tests=str(Path(__file__).parent), path=str(store_path)))
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        seen = 0
        while seen < 4:
            line = proc.stdout.readline()
            assert line, f"child died early: {proc.stderr.read()}"
            seen = int(line)
        os.kill(proc.pid, signal.SIGKILL)  # lands while the child is inside its next append
    finally:
        proc.kill()
        proc.wait(timeout=30)
        proc.stdout.close()
        proc.stderr.close()
    assert proc.returncode == -signal.SIGKILL
    n = EpisodeStore.open(store_path).n_episodes
    assert n >= seen
    _check(store_path, list(range(n)))
    writer = EpisodeStore.open(store_path, mode="a")
    writer.append(make_episode(100))
    store = _check(store_path, [*range(n), 100])
    assert np.all(np.diff(store.episode_ends) > 0)
