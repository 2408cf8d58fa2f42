"""Non-finite values (NaN, ±inf) in an episode store: located by (episode, step), refused before training, listed
by ``dmrl info``.

A NaN in one action or observation spreads through the normalizer statistics into every batch, so training
would run on and report ``loss=nan``. The checks read float arrays chunk by chunk (the normalizer's own pass
reuses its blocks) and never read uint8 images (rgb cannot hold a NaN).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import numpy as np

from dmrl.data._zarr_utils import StoreError

if TYPE_CHECKING:
    from dmrl.data.episodes import EpisodeStore

#: How many (episode, step) locations ``dmrl info`` lists per key.
FIRST = 5


class NonFiniteError(StoreError):
    """A store holds NaN or ±inf where training reads; the message names the key and the first bad location."""


def is_float(arr: Any) -> bool:
    return np.issubdtype(np.dtype(arr.dtype), np.floating)


def _locate(store: EpisodeStore, rows: np.ndarray) -> list[list[int]]:
    """Global step rows -> [[episode, step within it], ...]."""
    ends = np.asarray(store.episode_ends, dtype=np.int64)
    eps = np.searchsorted(ends, rows, side="right")
    starts = np.concatenate([[0], ends])[eps]
    return [[int(e), int(s)] for e, s in zip(eps, rows - starts, strict=True)]


def _kind(values: np.ndarray) -> str:
    v = float(values.flat[0])
    return "NaN" if np.isnan(v) else ("+inf" if v > 0 else "-inf")


def _bad_rows(block: np.ndarray) -> np.ndarray:
    """Row indices (into ``block`` (n, ...)) holding any non-finite value."""
    bad = ~np.isfinite(block)
    return np.flatnonzero(bad.reshape(len(block), -1).any(axis=1)) if bad.ndim > 1 else np.flatnonzero(bad)


def check_rows(store: EpisodeStore, key: str, block: np.ndarray, start: int = 0) -> None:
    """Raise `NonFiniteError` if rows ``block`` (n, ...) of ``key``, starting at global step ``start``, hold a NaN
    or ±inf. Costs one ``np.isfinite`` pass over arrays already in memory."""
    if not is_float(block) or np.isfinite(block).all():
        return
    row = int(_bad_rows(block)[0])
    values = block[row][~np.isfinite(block[row])]
    e, s = _locate(store, np.asarray([start + row]))[0]
    raise NonFiniteError(
        f"dmrl store {store.path}: {key} has {_kind(values)} at episode {e}, step {s}; "
        "fix or drop that episode (dmrl info lists every bad one)"
    )


def check_final(store: EpisodeStore, key: str, final: np.ndarray) -> None:
    """Raise `NonFiniteError` if the final observations ``final`` (E, ...) of ``key`` hold a NaN or ±inf (reported
    at step L of episode e: the observation after its last action)."""
    if not is_float(final) or np.isfinite(final).all():
        return
    e = int(_bad_rows(final)[0])
    values = final[e][~np.isfinite(final[e])]
    raise NonFiniteError(
        f"dmrl store {store.path}: final/{key} has {_kind(values)} at episode {e}, step {int(store.lengths[e])} "
        "(its final observation); fix or drop that episode (dmrl info lists every bad one)"
    )


def _blocks(store: EpisodeStore, key: str) -> Iterator[tuple[int, np.ndarray]]:
    """(start row, rows) over the committed steps of ``key``, one store chunk at a time."""
    arr = store.array(key)
    block = int(arr.chunks[0])
    for start in range(0, store.n_steps, block):
        yield start, np.asarray(arr[start : min(start + block, store.n_steps)])


def require_finite(store: EpisodeStore, key: str) -> None:
    """Raise `NonFiniteError` at the first NaN or ±inf of the step array ``key`` (a modality, "actions" or
    "rewards"); reads it chunk by chunk, nothing for a non-float (uint8 rgb) array."""
    if not is_float(store.array(key)):
        return
    for start, rows in _blocks(store, key):
        check_rows(store, key, rows, start)


def nonfinite_report(store: EpisodeStore, first: int = FIRST) -> dict[str, dict[str, Any]]:
    """{key: {"count": bad values, "first": [[episode, step], ...] up to ``first``}} over every float array of the
    store (observations, actions, rewards, and final/<mode> at step L); {} when all are finite."""
    out: dict[str, dict[str, Any]] = {}

    def add(key: str, count: int, locations: list[list[int]]) -> None:
        entry = out.setdefault(key, {"count": 0, "first": []})
        entry["count"] += count
        entry["first"] = (entry["first"] + locations)[:first]

    for key in (*store.array_modes, "actions", "rewards"):
        if not is_float(store.array(key)):
            continue
        for start, rows in _blocks(store, key):
            finite = np.isfinite(rows)
            if not finite.all():
                bad = _bad_rows(rows)[:first]
                add(key, int((~finite).sum()), _locate(store, start + bad))
    lengths = np.asarray(store.lengths, dtype=np.int64)
    for key in store.array_modes:
        arr = store.final_array(key)
        if not is_float(arr):
            continue
        final = np.asarray(arr[: store.n_episodes])
        finite = np.isfinite(final)
        if not finite.all():
            eps = _bad_rows(final)[:first]
            add(f"final/{key}", int((~finite).sum()), [[int(e), int(lengths[e])] for e in eps])
    return out
