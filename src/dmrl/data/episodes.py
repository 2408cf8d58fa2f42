"""Append-only zarr episode store whose `meta/episode_ends` column is the commit marker (crash-safe writes).

The on-disk layout is in dmrl.data.store_format; the read accessors are dmrl.data.store_reader's `StoreReader`.
This module holds the store's life cycle (create, open, lock, close) and its commit protocol (append, load, repair).

Why this is crash-safe: zarr's LocalStore writes every chunk and metadata file to a temp file and renames
it into place, so a SIGKILL leaves each file either old or new, never torn. `append` writes all data first
and the episode's `episode_ends` entry last; readers trust only the prefix of `episode_ends` that is valid
(strictly increasing, not the -1 fill) and the data it covers. Opening with mode="a" truncates anything
written beyond that prefix. A full disk mid-append is the same as a crash (one-line StoreError). One writer at a
time: a writer holds an OS lock on ``<path>/.dmrl-writer.lock`` until it closes or dies, and a second process
opening the store for writing is refused; readers take no lock. Not covered: power loss (no fsync).
"""

from __future__ import annotations

import contextlib
import json
import shutil
import signal
import weakref
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import zarr

from dmrl.data._zarr_utils import (
    CORRUPT_HINT,
    StoreError,
    StoreExistsError,
    clear_partial_files,
    lock_writer,
    read_root_attrs,
    require_array,
    write_batch,
    write_rows,
)
from dmrl.data.store_format import (
    FORMAT_VERSION,
    LEGACY_EPISODE_INFO,
    META_COLUMNS,
    TEXT_COLUMNS,
    ObsSpec,
    check_episode,
    create_arrays,
    new_store_attrs,
    parse_attrs,
    parse_episode_info,
)
from dmrl.data.store_reader import StoreReader
from dmrl.paths import is_disk_full
from dmrl.types import ARRAY_MODES, Episode, InfoField

# Re-exported: the store's public names have always been importable from here.
__all__ = [
    "FORMAT_VERSION",
    "LEGACY_EPISODE_INFO",
    "META_COLUMNS",
    "TEXT_COLUMNS",
    "EpisodeStore",
    "ObsSpec",
    "sigint_deferred",
]


class EpisodeStore(StoreReader):
    """A directory of episodes: create/open it, `append(Episode)`, read episodes, meta columns and arrays
    (the reads: `StoreReader`)."""

    def __init__(self, path: Path, root: zarr.Group, mode: str) -> None:
        # Use EpisodeStore.create / EpisodeStore.open; this only wires up already-validated state.
        self.path = path
        self.mode = mode
        self._root = root
        self._lock: weakref.finalize | None = None  # the writer lock's release (mode "a"), run once
        self._attrs = parse_attrs(path, dict(root.attrs))
        self.array_modes: tuple[str, ...] = tuple(m for m in self.obs_modes if m in ARRAY_MODES)
        self.episode_info: dict[str, InfoField] = parse_episode_info(path, self._attrs)
        cats = {k: "int8" for k, f in self.episode_info.items() if f.categories is not None}
        self._meta_dtypes: dict[str, str] = {**META_COLUMNS, **cats}
        self._text_names = (*TEXT_COLUMNS, *(k for k, f in self.episode_info.items() if f.categories is None))
        self._load()

    # ------------------------------------------------------------------ create / open
    @classmethod
    def create(
        cls,
        path: str | Path,
        *,
        env_id: str,
        obs_modes: tuple[str, ...] | list[str],
        action_meaning: list[str],
        obs_spec: ObsSpec,
        action_dim: int,
        extra_attrs: dict[str, Any] | None = None,
        overwrite: bool = False,
        episode_info: dict[str, InfoField] | None = None,
        terminals: bool = False,
    ) -> EpisodeStore:
        """Create an empty store at `path`, open for append; refuses an existing path unless `overwrite`.

        ``episode_info``: the task's own per-episode values (its registry metadata); None: MultiPath's route and
        target (LEGACY_EPISODE_INFO), {} for a task without any. ``terminals``: keep a per-step terminal
        (data/terminals); every appended episode must then carry ``Episode.terminals``.
        """
        path = Path(path)
        # Checked and built before an --overwrite deletes anything: whatever fails here leaves the old store.
        attrs, info_spec = new_store_attrs(
            env_id=env_id,
            obs_modes=obs_modes,
            action_meaning=action_meaning,
            obs_spec=obs_spec,
            action_dim=action_dim,
            extra_attrs=extra_attrs,
            episode_info=episode_info,
            terminals=terminals,
        )
        if path.exists():
            if not overwrite:
                raise StoreExistsError(
                    f"dmrl store {path}: already exists; pass --overwrite to replace it, or choose another --out"
                )
            # Only delete what is plausibly ours: a zarr store or an empty directory, never e.g. a home dir.
            if not path.is_dir() or (not (path / "zarr.json").exists() and any(path.iterdir())):
                raise StoreExistsError(
                    f"dmrl store {path}: exists and is not a zarr store; refusing to delete it; choose another --out"
                )
            release_old = lock_writer(path)  # refuses to delete a store another process is writing
            try:
                shutil.rmtree(path)
            finally:
                release_old()
        root = zarr.open_group(str(path), mode="w-", attributes=attrs)
        release = lock_writer(path)
        try:
            create_arrays(root, obs_spec, info_spec, action_dim=action_dim, terminals=terminals)
            store = cls(path, root, "a")
        except BaseException as e:
            release()
            if not is_disk_full(e):
                raise
            shutil.rmtree(path, ignore_errors=True)  # an empty store, half made: nothing of value is lost
            raise StoreError(f"disk full while creating dmrl store {path}: nothing was written; free space") from e
        return store._hold(release)

    @classmethod
    def open(cls, path: str | Path, mode: str = "r") -> EpisodeStore:
        """Open an existing store; mode "a" also drops any partially written (uncommitted) episode."""
        if mode not in ("r", "a"):
            raise ValueError(f"EpisodeStore.open: mode must be 'r' or 'a', got {mode!r}")
        path = Path(path)
        read_root_attrs(path)  # one-line StoreError for a missing path or an unreadable root zarr.json
        release = lock_writer(path) if mode == "a" else None  # before touching anything another writer owns
        try:
            if mode == "a":
                clear_partial_files(path)
            try:
                root = zarr.open_group(str(path), mode="r" if mode == "r" else "r+")
            except Exception as e:  # zarr raises several types for bad metadata; name the path either way
                raise StoreError(
                    f"dmrl store {path}: cannot open root group ({type(e).__name__}); {CORRUPT_HINT}"
                ) from e
            store = cls(path, root, mode)
        except BaseException as e:
            if release is not None:
                release()
            if mode == "a" and is_disk_full(e):  # dropping the uncommitted tail rewrites metadata
                raise StoreError(f"disk full while opening dmrl store {path} for writing; free space") from e
            raise
        return store._hold(release) if release is not None else store

    def _hold(self, release: Callable[[], None]) -> EpisodeStore:
        # weakref.finalize runs `release` once: on close(), when the store is garbage collected, or at exit.
        self._lock = weakref.finalize(self, release)
        return self

    def close(self) -> None:
        """Release the writer lock (another process may then write); the store stays readable. Idempotent."""
        if self._lock is not None:
            self._lock()
        self.mode = "r"

    def __enter__(self) -> EpisodeStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def refresh(self) -> None:
        """Re-read committed episodes (a reader following a live writer)."""
        self._load()

    # ------------------------------------------------------------------ loading / truncation
    def _load(self) -> None:
        req = lambda key: require_array(self.path, self._root, key)  # noqa: E731
        self._obs = {m: req(f"data/obs/{m}") for m in self.array_modes}
        self._final = {m: req(f"final/{m}") for m in self.array_modes}
        self._actions, self._rewards = req("data/actions"), req("data/rewards")
        self._terminals = req("data/terminals") if self.has_terminals else None
        if self._terminals is not None and (self._terminals.ndim != 1 or self._terminals.dtype != np.bool_):
            got = f"{self._terminals.dtype}{list(self._terminals.shape)}"
            raise StoreError(f"dmrl store {self.path}: 'data/terminals' must be bool (N,), got {got}; {CORRUPT_HINT}")
        self._meta_arrays = {name: req(f"meta/{name}") for name in self._meta_dtypes}
        self._text_arrays = {n: (req(f"meta/{n}/utf8"), req(f"meta/{n}/ends")) for n in self._text_names}
        self._ends_array = req("meta/episode_ends")

        step_arrays = [*self._obs.values(), self._actions, self._rewards, *self._optional_steps()]
        episode_arrays = [*self._final.values(), *self._meta_arrays.values()]
        episode_arrays += [ends for _, ends in self._text_arrays.values()]
        ends = np.asarray(self._ends_array[:], dtype=np.int64)[: min(a.shape[0] for a in episode_arrays)]
        # Committed prefix: strictly increasing ends (the -1 fill breaks it) covered by every step array.
        ok = (np.diff(ends, prepend=0) > 0) & (ends <= min(a.shape[0] for a in step_arrays))
        n = len(ends) if ok.all() else int(np.argmin(ok))
        text_ends = {name: np.asarray(e[:n], dtype=np.int64) for name, (_, e) in self._text_arrays.items()}
        for name, (utf8, _) in self._text_arrays.items():
            while n > 0 and (text_ends[name][n - 1] > utf8.shape[0] or text_ends[name][n - 1] < 0):
                n -= 1  # only reachable if a file was damaged outside a crash; stay readable
        ends = ends[:n]
        self._ends: list[int] = ends.tolist()
        self._meta: dict[str, list[Any]] = {k: a[:n].tolist() for k, a in self._meta_arrays.items()}
        self._text: dict[str, list[str]] = {}
        self._text_bytes: dict[str, int] = {}
        for name, (utf8, _) in self._text_arrays.items():
            e = text_ends[name][:n]
            raw = bytes(np.asarray(utf8[: int(e[-1])] if n else [], dtype=np.uint8))
            starts = np.concatenate([[0], e])[:-1]
            self._text[name] = [raw[a:b].decode("utf-8") for a, b in zip(starts.tolist(), e.tolist(), strict=True)]
            self._text_bytes[name] = int(e[-1]) if n else 0
        if self.mode == "a":
            self._truncate_uncommitted()

    def _truncate_uncommitted(self) -> None:
        """Resize every array back to the committed prefix so the next append starts clean."""
        n, steps = self.n_episodes, self.n_steps
        tail = self._ends_array.shape[0] - n
        if tail > 0:
            # Resizing down keeps stale values inside a partly-kept chunk; rewrite the tail with the -1 fill
            # first so a later grow-then-crash can never resurrect an old end as a committed episode.
            self._ends_array[n:] = -1
        for arr in [*self._obs.values(), self._actions, self._rewards, *self._optional_steps()]:
            _resize_rows(arr, steps)
        for arr in [*self._final.values(), *self._meta_arrays.values(), self._ends_array]:
            _resize_rows(arr, n)
        for name, (utf8, ends) in self._text_arrays.items():
            _resize_rows(utf8, self._text_bytes[name])
            _resize_rows(ends, n)

    # ------------------------------------------------------------------ writing
    def append(self, ep: Episode) -> int:
        """Write one episode and commit it; returns its index. Validates it against the store's spec first."""
        if self.mode != "a":
            raise StoreError(f"dmrl store {self.path}: opened read-only; open with mode='a' to append")
        check_episode(
            ep,
            path=self.path,
            obs_spec=self.obs_spec,
            action_dim=self.action_dim,
            episode_info=self.episode_info,
            has_terminals=self.has_terminals,
        )
        s0, e = self.n_steps, self.n_episodes
        # Offsets come from the committed counters, so a failed earlier append (e.g. Ctrl-C) is overwritten.
        writes: list[tuple[zarr.Array, int, np.ndarray]] = []
        for m in self.array_modes:
            writes.append((self._obs[m], s0, ep.obs[m]))
            writes.append((self._final[m], e, ep.final_obs[m][None]))
        writes.append((self._actions, s0, np.asarray(ep.actions, dtype=np.float32)))
        writes.append((self._rewards, s0, np.asarray(ep.rewards, dtype=np.float32)))
        if self._terminals is not None:
            writes.append((self._terminals, s0, np.asarray(ep.terminals, dtype=bool)))
        values = {
            **{k: f.categories.index(ep.task_info[k]) for k, f in self.episode_info.items() if f.categories},
            "success": bool(ep.success),
            "return": ep.episode_return,
            "seed": int(ep.seed),
            "terminated": bool(ep.terminated),
            "truncated": bool(ep.truncated),
        }
        for name, value in values.items():
            writes.append((self._meta_arrays[name], e, np.asarray([value], dtype=self._meta_dtypes[name])))
        texts = {
            **{k: ep.task_info[k] for k, f in self.episode_info.items() if f.categories is None},
            "instruction": ep.instruction,
            # default=float: collectors often hand numpy scalars, which json cannot encode itself
            "info": json.dumps(ep.info, sort_keys=True, default=float),
        }
        for name, text in texts.items():
            utf8, ends = self._text_arrays[name]
            raw = np.frombuffer(text.encode("utf-8"), dtype=np.uint8)
            writes.append((utf8, self._text_bytes[name], raw))
            writes.append((ends, e, np.asarray([self._text_bytes[name] + len(raw)], dtype=np.int64)))
        try:
            write_batch(writes)  # everything but the commit, concurrently; returns only when all landed
            write_rows(self._ends_array, e, np.asarray([s0 + ep.length], dtype=np.int64))  # the commit
        except Exception as err:
            if not is_disk_full(err):
                raise
            # Nothing of this episode is committed (the commit is one atomically renamed chunk, written last).
            raise StoreError(
                f"disk full while writing episode {e} to dmrl store {self.path}: the store keeps its {e} committed "
                "episodes; free space, then add more with dmrl collect --append"
            ) from err
        self._ends.append(s0 + ep.length)
        for name, value in values.items():
            self._meta[name].append(np.asarray(value, dtype=self._meta_dtypes[name]).item())
        for name, text in texts.items():
            self._text[name].append(text)
            self._text_bytes[name] += len(text.encode("utf-8"))
        return e


def _resize_rows(arr: zarr.Array, n: int) -> None:
    if arr.shape[0] != n:
        arr.resize((n, *arr.shape[1:]))


@contextlib.contextmanager
def sigint_deferred() -> Iterator[None]:
    """Hold Ctrl-C while an episode is written; raise it once the episode is committed (dmrl collect and dmrl data
    import: an interrupted run keeps every committed episode)."""
    pending: list[int] = []
    previous = signal.signal(signal.SIGINT, lambda signum, frame: pending.append(signum))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
        if pending:
            raise KeyboardInterrupt
