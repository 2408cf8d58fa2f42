"""One writer per store: a second process opening it for writing (``dmrl collect --append``) is refused in one line
naming the store and the pid holding the lock; readers need no lock; the OS drops the lock when the writer closes
or dies."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from synthetic_episodes import assert_episode_equal, create_store, make_episode

from dmrl.cli import main
from dmrl.data import EpisodeStore, StoreError
from dmrl.data._zarr_utils import LOCK_FILE

HOLDER = """
import sys
sys.path.insert(0, {tests!r})
from dmrl.data import EpisodeStore, StoreError
from synthetic_episodes import make_episode
try:
    store = EpisodeStore.open({path!r}, mode="a")
except StoreError as e:
    print("refused:", e, flush=True)
    sys.exit(3)
print("locked", flush=True)
if sys.stdin.readline().strip() == "append":
    store.append(make_episode(50))
    print("appended", flush=True)
"""


def _holder(path: Path) -> subprocess.Popen:
    """A child process holding the writer lock of ``path`` until a line arrives on its stdin."""
    code = textwrap.dedent(HOLDER.format(tests=str(Path(__file__).parent), path=str(path)))
    proc = subprocess.Popen(
        [sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    line = proc.stdout.readline()
    if line.strip() != "locked":
        proc.kill()
        pytest.fail(f"holder did not take the lock: {line!r} {proc.stderr.read()}")
    return proc


def _finish(proc: subprocess.Popen, say: str = "") -> str:
    out, err = proc.communicate(say + "\n", timeout=60)
    assert proc.returncode == 0, err
    return out


def _refusal(path: Path, pid: int) -> str:
    return (
        f"dmrl store {path}: locked by pid {pid}, which is writing to it; "
        "wait for that writer to finish, or write to another --out"
    )


def test_second_writer_is_refused_until_the_first_closes(store_path):
    store = create_store(store_path)
    store.append(make_episode(0))
    store.close()
    proc = _holder(store_path)
    try:
        with pytest.raises(StoreError) as e:
            EpisodeStore.open(store_path, mode="a")
        assert str(e.value) == _refusal(store_path, proc.pid)
        with pytest.raises(StoreError, match=f"locked by pid {proc.pid}"):
            create_store(store_path, overwrite=True)  # nor may it be deleted under the writer
        reader = EpisodeStore.open(store_path)  # readers take no lock
        assert reader.n_episodes == 1
        assert _finish(proc, "append").strip() == "appended"
    finally:
        proc.kill()
        proc.wait()
    reader.refresh()
    assert reader.n_episodes == 2
    with EpisodeStore.open(store_path, mode="a") as writer:  # the holder exited: the lock is free
        writer.append(make_episode(1))
    store = EpisodeStore.open(store_path)
    for i, seed in enumerate([0, 50, 1]):
        assert_episode_equal(store.episode(i), make_episode(seed))


def test_close_releases_the_lock_for_another_process(store_path):
    writer = create_store(store_path)
    writer.append(make_episode(0))
    code = textwrap.dedent(HOLDER.format(tests=str(Path(__file__).parent), path=str(store_path)))
    refused = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert refused.returncode == 3 and "locked by pid" in refused.stdout, refused.stdout + refused.stderr
    writer.close()
    with pytest.raises(StoreError, match="opened read-only"):
        writer.append(make_episode(1))  # a closed writer no longer writes
    proc = _holder(store_path)
    _finish(proc)
    assert EpisodeStore.open(store_path).n_episodes == 1


def test_writers_in_one_process_share_the_lock(store_path):
    first = create_store(store_path)
    second = EpisodeStore.open(store_path, mode="a")  # as before the lock: one process, its own business
    second.append(make_episode(0))
    second.close()
    code = textwrap.dedent(HOLDER.format(tests=str(Path(__file__).parent), path=str(store_path)))
    refused = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert refused.returncode == 3, "the first writer still holds the lock"
    del first  # garbage collection releases it too
    _finish(_holder(store_path))


def test_a_killed_writer_leaves_no_lock(store_path):
    create_store(store_path).close()
    proc = _holder(store_path)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    proc.stdin.close()
    proc.stdout.close()
    proc.stderr.close()
    assert (store_path / LOCK_FILE).is_file()  # the file stays; the OS dropped the lock with the process
    with EpisodeStore.open(store_path, mode="a") as writer:
        writer.append(make_episode(0))


def test_collect_append_on_a_locked_store_is_one_line(store_path, capsys):
    create_store(store_path).close()
    proc = _holder(store_path)
    try:
        before = sorted((p, p.stat().st_mtime_ns) for p in store_path.rglob("*"))
        capsys.readouterr()
        argv = ["collect", "--out", str(store_path), "--append", "--episodes", "1", "--workers", "0"]
        assert main([*argv, "--obs-modes", "state"]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert err == [f"dmrl: error: {_refusal(store_path, proc.pid)}"]
        assert sorted((p, p.stat().st_mtime_ns) for p in store_path.rglob("*")) == before
        _finish(proc)
    finally:
        proc.kill()
        proc.wait()
