"""The read side of an episode store: its attributes, committed counts, per-episode columns, episodes and arrays.

`StoreReader` is the base of `dmrl.data.episodes.EpisodeStore`, which sets the state below (reading the committed
prefix of the store) when it opens one; it is not used on its own.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import zarr

from dmrl.data._zarr_utils import StoreError
from dmrl.data.store_format import ObsSpec
from dmrl.types import Episode, InfoField


class StoreReader:
    """Reads of a store's committed episodes; the state is set by `EpisodeStore` (its ``_load``)."""

    path: Path
    mode: str
    array_modes: tuple[str, ...]
    episode_info: dict[str, InfoField]
    _attrs: dict[str, Any]
    _meta_dtypes: dict[str, str]
    # Committed state: the episodes' cumulative ends, per-episode columns and texts (Python lists, one per episode)
    _ends: list[int]
    _meta: dict[str, list[Any]]
    _text: dict[str, list[str]]
    # The zarr arrays (rows beyond the committed prefix are uncommitted)
    _obs: dict[str, zarr.Array]
    _final: dict[str, zarr.Array]
    _actions: zarr.Array
    _rewards: zarr.Array
    _terminals: zarr.Array | None

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
