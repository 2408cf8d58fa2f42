"""A disk that fills mid-append (OSError ENOSPC injected at zarr's file writes): the store keeps exactly its
committed episodes, the error is one line, and writing goes on once there is room again."""

from __future__ import annotations

import errno
from pathlib import Path

import pytest
import zarr.storage._local as local
from synthetic_episodes import assert_episode_equal, create_store, make_episode

import dmrl.data.episodes as episodes_mod
from dmrl.cli import main
from dmrl.data import EpisodeStore, StoreError


def _full_after(monkeypatch, n_ok: int | None = None, when: str | None = None) -> list[str]:
    """Let zarr write ``n_ok`` more files (or every file whose path lacks ``when``), then fail with ENOSPC."""
    real, written = local._put, []

    def put(path: Path, value, exclusive: bool = False) -> int:
        if (n_ok is not None and len(written) >= n_ok) or (when is not None and when in str(path)):
            raise OSError(errno.ENOSPC, "No space left on device", str(path))
        written.append(str(path))
        return real(path, value, exclusive=exclusive)

    monkeypatch.setattr(local, "_put", put)
    return written


def _check(path: Path, seeds: list[int]) -> None:
    store = EpisodeStore.open(path)
    assert store.n_episodes == len(seeds)
    assert store.n_steps == sum(make_episode(s).length for s in seeds)
    for i, s in enumerate(seeds):
        assert_episode_equal(store.episode(i), make_episode(s))


@pytest.mark.parametrize("n_ok", [0, 5, 20], ids=["first-write", "mid-data", "late-data"])
def test_disk_full_mid_append_keeps_committed_episodes(store_path, monkeypatch, n_ok):
    store = create_store(store_path)
    store.append(make_episode(0))
    store.append(make_episode(1))
    with monkeypatch.context() as m:
        _full_after(m, n_ok=n_ok)
        with pytest.raises(StoreError) as e:
            store.append(make_episode(2, length=9))
    assert str(e.value) == (
        f"disk full while writing episode 2 to dmrl store {store_path}: the store keeps its 2 committed episodes; "
        "free space, then add more with dmrl collect --append"
    )
    _check(store_path, [0, 1])
    store.append(make_episode(3))  # room again: the same writer goes on where the commit left off
    _check(store_path, [0, 1, 3])


def test_disk_full_at_the_commit_keeps_committed_episodes(store_path, monkeypatch):
    store = create_store(store_path)
    store.append(make_episode(0))
    with monkeypatch.context() as m:
        written = _full_after(m, when="meta/episode_ends/c")  # every data chunk lands, the commit does not
        with pytest.raises(StoreError, match="the store keeps its 1 committed episodes"):
            store.append(make_episode(1))
    assert any("data/actions/c" in p for p in written)
    _check(store_path, [0])
    store.close()
    with EpisodeStore.open(store_path, mode="a") as writer:  # reopening drops the uncommitted data
        assert writer.array("actions").shape[0] == writer.n_steps
        writer.append(make_episode(4))
    _check(store_path, [0, 4])


def test_collect_on_a_full_disk_is_one_line_and_keeps_its_episodes(tmp_path, monkeypatch, capsys):
    out = tmp_path / "d.zarr"
    real, calls = episodes_mod.write_batch, []

    def write_batch(writes):
        calls.append(len(writes))
        if len(calls) == 2:  # the second episode's data
            raise OSError(errno.ENOSPC, "No space left on device")
        real(writes)

    monkeypatch.setattr(episodes_mod, "write_batch", write_batch)
    capsys.readouterr()
    argv = ["collect", "--out", str(out), "--episodes", "3", "--workers", "0", "--obs-modes", "state"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    errors = [line for line in err.splitlines() if line.startswith("dmrl:")]
    assert errors == [
        f"dmrl: error: disk full while writing episode 1 to dmrl store {out}: the store keeps its 1 committed "
        "episodes; free space, then add more with dmrl collect --append"
    ]
    store = EpisodeStore.open(out)
    assert store.n_episodes == 1 and list(store.seeds) == [0]
