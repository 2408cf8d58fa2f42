"""Append-only zarr episode store whose `meta/episode_ends` column is the commit marker (crash-safe writes).

On-disk layout (zarr v3, local directory; N = committed steps, E = committed episodes)::

    <path>/zarr.json            group attrs: dmrl_format_version=1, env_id, obs_modes, action_meaning,
                                action_dim, obs_spec {mode: {"shape": [...], "dtype": "uint8"}}, + extra_attrs
    data/obs/<mode>             (N, ...)  per-step observation, one array per mode in ARRAY_MODES
    data/actions                (N, Da) float32
    data/rewards                (N,) float32
    data/terminals              (N,) bool, only where attr terminals=true (create(terminals=True)): a per-step
                                terminal for TD backups in a recording that goes on past it (Episode.terminals)
    final/<mode>                (E, ...)  observation after each episode's last action
    meta/success|terminated|truncated (E,) bool · meta/return (E,) float32 · meta/seed (E,) int64
    meta/<text>/utf8, /ends     ragged UTF-8 strings, text in (instruction, info as JSON)
    meta/<task key>             the task's own per-episode values (attr episode_info, see types.InfoField): a
                                categorical one as (E,) int8 codes, a text one as ragged UTF-8 like the above.
                                A store without the attr is MultiPath's: route (int8 code into ROUTES), target.
    meta/episode_ends           (E,) int64 cumulative end step, fill -1; written LAST = the commit

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
from collections import Counter
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
    episode_chunks,
    lock_writer,
    read_root_attrs,
    require_array,
    step_chunks,
    write_batch,
    write_rows,
)
from dmrl.paths import is_disk_full
from dmrl.types import ARRAY_MODES, ROUTES, Episode, InfoField, parse_obs_modes

FORMAT_VERSION = 1
#: Per-episode numeric columns and their stored dtypes (besides `episode_ends`).
META_COLUMNS: dict[str, str] = {
    "success": "bool",
    "return": "float32",
    "seed": "int64",
    "terminated": "bool",
    "truncated": "bool",
}
#: Per-episode strings. Stored as ragged UTF-8 (a uint8 byte array + int64 end offsets) rather than zarr's
#: string dtype: plain numeric arrays are core zarr v3, behave the same on numpy 1.26 and 2.x, and take
#: part in the same resize/truncate commit logic as every other column.
TEXT_COLUMNS: tuple[str, ...] = ("instruction", "info")
_RESERVED_ATTRS = ("dmrl_format_version", "env_id", "obs_modes", "action_meaning", "action_dim", "obs_spec")
#: Attributes of optional parts; a store without them (written before they existed) has none of those parts.
_OPTIONAL_ATTRS = ("episode_info", "terminals")
#: The task columns of a store written before task metadata existed (all of them MultiPath's); also the default
#: of `create`, so that callers written before then keep writing the same layout.
LEGACY_EPISODE_INFO: dict[str, InfoField] = {"route": InfoField(categories=ROUTES), "target": InfoField()}

ObsSpec = dict[str, tuple[tuple[int, ...], str]]


class EpisodeStore:
    """A directory of episodes: create/open it, `append(Episode)`, read episodes, meta columns and arrays."""

    def __init__(self, path: Path, root: zarr.Group, mode: str) -> None:
        # Use EpisodeStore.create / EpisodeStore.open; this only wires up already-validated state.
        self.path = path
        self.mode = mode
        self._root = root
        self._lock: weakref.finalize | None = None  # the writer lock's release (mode "a"), run once
        self._attrs = _parse_attrs(path, dict(root.attrs))
        self.array_modes: tuple[str, ...] = tuple(m for m in self.obs_modes if m in ARRAY_MODES)
        self.episode_info: dict[str, InfoField] = _episode_info(path, self._attrs)
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
        info_spec = dict(LEGACY_EPISODE_INFO if episode_info is None else episode_info)
        taken = sorted(set(info_spec) & {*META_COLUMNS, *TEXT_COLUMNS, "episode_ends"})
        if taken:
            raise ValueError(f"episode_info: keys {taken} clash with the store's own columns; rename them")
        modes = parse_obs_modes(obs_modes)
        array_modes = [m for m in modes if m in ARRAY_MODES]
        if sorted(obs_spec) != sorted(array_modes):
            raise ValueError(f"obs_spec keys {sorted(obs_spec)} must equal the array obs_modes {array_modes}")
        if len(action_meaning) != action_dim:
            raise ValueError(f"action_meaning has {len(action_meaning)} names but action_dim is {action_dim}")
        clash = sorted(set(extra_attrs or {}) & {*_RESERVED_ATTRS, *_OPTIONAL_ATTRS})
        if clash:
            raise ValueError(f"extra_attrs may not redefine reserved store attributes {clash}")
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
        attrs = {
            "dmrl_format_version": FORMAT_VERSION,
            "env_id": env_id,
            "obs_modes": list(modes),
            "action_meaning": list(action_meaning),
            "action_dim": int(action_dim),
            "obs_spec": {
                m: {"shape": list(obs_spec[m][0]), "dtype": np.dtype(obs_spec[m][1]).name} for m in array_modes
            },
            "episode_info": {k: f.to_json() for k, f in info_spec.items()},
            **({"terminals": True} if terminals else {}),
            **(extra_attrs or {}),
        }
        root = zarr.open_group(str(path), mode="w-", attributes=attrs)
        release = lock_writer(path)

        def new(name: str, shape: tuple[int, ...], chunks: tuple[int, ...], dtype: str, fill: Any = 0) -> None:
            root.create_array(name, shape=shape, chunks=chunks, dtype=dtype, fill_value=fill)

        try:
            for m in array_modes:
                shape, dtype = tuple(obs_spec[m][0]), np.dtype(obs_spec[m][1]).name
                new(f"data/obs/{m}", (0, *shape), step_chunks(shape, dtype), dtype)
                new(f"final/{m}", (0, *shape), episode_chunks(shape, dtype), dtype)
            new("data/actions", (0, action_dim), step_chunks((action_dim,), "float32"), "float32")
            new("data/rewards", (0,), step_chunks((), "float32"), "float32")
            if terminals:
                new("data/terminals", (0,), step_chunks((), "bool"), "bool", fill=False)
            categorical = [k for k, f in info_spec.items() if f.categories is not None]
            for name, dtype in {**META_COLUMNS, **dict.fromkeys(categorical, "int8")}.items():
                new(f"meta/{name}", (0,), episode_chunks((), dtype), dtype)
            for name in (*TEXT_COLUMNS, *(k for k in info_spec if k not in categorical)):
                new(f"meta/{name}/utf8", (0,), (1 << 16,), "uint8")
                new(f"meta/{name}/ends", (0,), episode_chunks((), "int64"), "int64", fill=-1)
            # The -1 fill is what makes an entry whose chunk never got written read as "not committed".
            new("meta/episode_ends", (0,), episode_chunks((), "int64"), "int64", fill=-1)
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
        self._validate(ep)
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

    def _validate(self, ep: Episode) -> None:
        spec = self.obs_spec
        for label, d, lead in (("obs", ep.obs, (ep.length,)), ("final_obs", ep.final_obs, ())):
            extra = sorted(set(d) - set(spec))
            if extra:
                raise ValueError(
                    f"Episode.{label}[{extra[0]!r}]: store {self.path} has no such modality "
                    f"(store has: {', '.join(spec) or 'none'})"
                )
            for m, (shape, dtype) in spec.items():
                if m not in d:
                    raise ValueError(f"Episode.{label}[{m!r}]: missing; store {self.path} expects it")
                x = d[m]
                if x.shape != (*lead, *shape) or x.dtype != np.dtype(dtype):
                    raise ValueError(
                        f"Episode.{label}[{m!r}]: got {x.dtype}{list(x.shape)}, "
                        f"store expects {dtype}{list((*lead, *shape))}"
                    )
        if ep.actions.shape[1] != self.action_dim:
            raise ValueError(f"Episode.actions: got Da={ep.actions.shape[1]}, store expects {self.action_dim}")
        have, want = set(ep.task_info), set(self.episode_info)
        if have != want:
            raise ValueError(
                f"Episode.task_info: got keys {sorted(have)}; store {self.path} keeps {sorted(want)} "
                "(the task's registered episode_info)"
            )
        for k, f in self.episode_info.items():
            f.check(k, ep.task_info[k])
        if self.has_terminals != (ep.terminals is not None):
            has = "keeps" if self.has_terminals else "keeps no"
            raise ValueError(
                f"Episode.terminals: got {'none' if ep.terminals is None else 'some'}; store {self.path} {has} "
                "per-step terminals (data/terminals); write to a store made with the same env (or re-collect)"
            )
        term = None if ep.terminals is None else np.asarray(ep.terminals)  # Episode checks it; a later edit may not
        if term is not None and (term.shape != (ep.length,) or term.dtype != np.bool_):
            raise ValueError(f"Episode.terminals: got {term.dtype}{list(term.shape)}, store expects bool[{ep.length}]")

    # ------------------------------------------------------------------ reading
    @property
    def attrs(self) -> dict[str, Any]:
        """Store attributes (obs_spec as {mode: (shape tuple, dtype str)}); a copy."""
        return {**self._attrs, "obs_spec": self.obs_spec}

    @property
    def obs_modes(self) -> tuple[str, ...]:
        return tuple(self._attrs["obs_modes"])

    @property
    def obs_spec(self) -> ObsSpec:
        return {m: (tuple(v["shape"]), v["dtype"]) for m, v in self._attrs["obs_spec"].items()}

    @property
    def action_dim(self) -> int:
        return int(self._attrs["action_dim"])

    @property
    def has_terminals(self) -> bool:
        """Whether the store keeps a per-step terminal (data/terminals; stores before it never do)."""
        return bool(self._attrs.get("terminals", False))

    def _optional_steps(self) -> list[zarr.Array]:
        return [] if self._terminals is None else [self._terminals]

    @property
    def n_episodes(self) -> int:
        return len(self._ends)

    @property
    def n_steps(self) -> int:
        return self._ends[-1] if self._ends else 0

    @property
    def episode_ends(self) -> np.ndarray:
        """(E,) int64 cumulative end step of each committed episode."""
        return np.asarray(self._ends, dtype=np.int64)

    @property
    def lengths(self) -> np.ndarray:
        """(E,) int64 steps per episode."""
        return np.diff(self.episode_ends, prepend=0)

    def meta(self, name: str) -> np.ndarray:
        """(E,) one per-episode column: success, return, seed, terminated, truncated, or a categorical task
        column's int8 codes (MultiPath: route)."""
        if name not in self._meta_dtypes:
            raise KeyError(f"meta column {name!r} unknown; have: {', '.join(self._meta_dtypes)}")
        return np.asarray(self._meta[name], dtype=self._meta_dtypes[name])

    @property
    def success(self) -> np.ndarray:
        """(E,) bool"""
        return self.meta("success")

    @property
    def returns(self) -> np.ndarray:
        """(E,) float32 undiscounted episode return"""
        return self.meta("return")

    @property
    def seeds(self) -> np.ndarray:
        """(E,) int64 reset seed of each episode"""
        return self.meta("seed")

    @property
    def terminated(self) -> np.ndarray:
        """(E,) bool"""
        return self.meta("terminated")

    @property
    def truncated(self) -> np.ndarray:
        """(E,) bool"""
        return self.meta("truncated")

    def task_values(self, name: str) -> list[Any]:
        """Each episode's value of the task's own key ``name`` (one of ``episode_info``)."""
        if name not in self.episode_info:
            raise StoreError(
                f"dmrl store {self.path}: no per-episode {name!r} (its task keeps: "
                f"{', '.join(self.episode_info) or 'none'})"
            )
        return [self._task_value(name, i) for i in range(self.n_episodes)]

    def _task_value(self, name: str, i: int) -> Any:
        cats = self.episode_info[name].categories
        return self._text[name][i] if cats is None else cats[int(self._meta[name][i])]

    def routes(self) -> list[str | None]:
        """MultiPath: each episode's route (left, right or None)."""
        return self.task_values("route")

    def instructions(self) -> list[str]:
        return list(self._text["instruction"])

    def targets(self) -> list[str]:
        """MultiPath: each episode's named cup."""
        return self.task_values("target")

    def infos(self) -> list[dict[str, float]]:
        """Each episode's ``info`` dict (e.g. collision, first_step of a recovery episode)."""
        return [json.loads(t) for t in self._text["info"]]

    def episode_slice(self, i: int) -> slice:
        """Step rows [start, end) of episode i (negative i counts from the end)."""
        n = self.n_episodes
        if not -n <= i < n:
            raise IndexError(f"episode {i} out of range; store {self.path} has {n} episodes")
        i %= n
        return slice(self._ends[i - 1] if i else 0, self._ends[i])

    def episode(self, i: int) -> Episode:
        """Read episode i back as an `Episode` (equal to what was appended)."""
        sl = self.episode_slice(i)
        i = i % self.n_episodes
        return Episode(
            obs={m: np.asarray(self._obs[m][sl]) for m in self.array_modes},
            final_obs={m: np.asarray(self._final[m][i]) for m in self.array_modes},
            actions=np.asarray(self._actions[sl]),
            rewards=np.asarray(self._rewards[sl]),
            terminated=bool(self._meta["terminated"][i]),
            truncated=bool(self._meta["truncated"][i]),
            instruction=self._text["instruction"][i],
            success=bool(self._meta["success"][i]),
            seed=int(self._meta["seed"][i]),
            info=json.loads(self._text["info"][i]),
            task_info={k: self._task_value(k, i) for k in self.episode_info},
            terminals=None if self._terminals is None else np.asarray(self._terminals[sl], dtype=bool),
        )

    def final_array(self, name: str) -> zarr.Array:
        """(E, ...) zarr array of a modality's observation after each episode's last action (rows beyond
        `n_episodes` are uncommitted)."""
        if name not in self._final:
            raise StoreError(
                f"dmrl store {self.path}: no final observation {name!r} "
                f"(store has: {', '.join(self.array_modes) or 'none'})"
            )
        return self._final[name]

    def array(self, name: str) -> zarr.Array:
        """The zarr array of a modality, "actions", "rewards" or "terminals" (rows beyond `n_steps` are
        uncommitted)."""
        if name == "actions":
            return self._actions
        if name == "rewards":
            return self._rewards
        if name == "terminals":
            if self._terminals is None:
                raise StoreError(
                    f"dmrl store {self.path}: no per-step terminals (written before they existed, or by an env that "
                    "reports none); re-collect it to have them"
                )
            return self._terminals
        if name not in self._obs:
            raise StoreError(
                f"dmrl store {self.path}: no modality {name!r} "
                f"(store has: {', '.join(self.array_modes) or 'none'}); "
                f"collect with --obs-modes including {name}"
            )
        return self._obs[name]

    def summary(self) -> dict[str, Any]:
        """Headline numbers: episodes, steps, success rate, route counts (a task with routes), mean return and
        length."""
        n = self.n_episodes
        out: dict[str, Any] = {
            "env_id": self._attrs["env_id"],
            "episodes": n,
            "steps": self.n_steps,
            "success_rate": float(self.success.mean()) if n else 0.0,
        }
        if "route" in self.episode_info:
            counts = Counter(r or "none" for r in self.routes())
            out["routes"] = {k: counts.get(k, 0) for k in ("left", "right", "none")}
        out["mean_return"] = float(self.returns.mean()) if n else 0.0
        out["mean_length"] = float(self.lengths.mean()) if n else 0.0
        return out

    def __repr__(self) -> str:
        n, steps = self.n_episodes, self.n_steps
        return f"EpisodeStore({str(self.path)!r}, mode={self.mode!r}, episodes={n}, steps={steps})"


def _resize_rows(arr: zarr.Array, n: int) -> None:
    if arr.shape[0] != n:
        arr.resize((n, *arr.shape[1:]))


def _parse_attrs(path: Path, attrs: dict[str, Any]) -> dict[str, Any]:
    for key in _RESERVED_ATTRS:
        if key not in attrs:
            raise StoreError(f"dmrl store {path}: missing attribute {key!r}; {CORRUPT_HINT}")
    spec = attrs["obs_spec"]
    array_modes = [m for m in attrs["obs_modes"] if m in ARRAY_MODES]
    if not isinstance(spec, dict) or any(not {"shape", "dtype"} <= set(spec.get(m, {})) for m in array_modes):
        raise StoreError(f"dmrl store {path}: corrupt attribute 'obs_spec' ({CORRUPT_HINT})")
    if attrs["dmrl_format_version"] != FORMAT_VERSION:
        raise StoreError(
            f"dmrl store {path}: format version {attrs['dmrl_format_version']!r}, "
            f"this dmrl reads {FORMAT_VERSION}; re-run dmrl collect"
        )
    return attrs


def _episode_info(path: Path, attrs: dict[str, Any]) -> dict[str, InfoField]:
    """The store's task columns from its ``episode_info`` attr; a store from before the attr is MultiPath's."""
    doc = attrs.get("episode_info")
    if doc is None:
        return dict(LEGACY_EPISODE_INFO)
    if not isinstance(doc, dict) or not all(isinstance(v, dict) for v in doc.values()):
        raise StoreError(f"dmrl store {path}: corrupt attribute 'episode_info' ({CORRUPT_HINT})")
    return {k: InfoField.from_json(v) for k, v in doc.items()}


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
