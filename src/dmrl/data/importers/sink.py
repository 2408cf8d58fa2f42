"""Imported episodes into a dmrl episode store, one committed episode at a time (crash-safe, resumable).

Every importer hands a :class:`StoreSpec` (what the store will hold, known before the first episode) and an
iterator of :class:`dmrl.types.Episode`. Only one episode is in memory at a time, so a source larger than memory
imports; an interrupted import keeps its committed episodes, and ``--resume`` continues after them.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from dmrl.data.episodes import EpisodeStore, ObsSpec, sigint_deferred
from dmrl.paths import check_output_path
from dmrl.types import Episode

log = logging.getLogger("dmrl.data.importers")


@dataclass
class StoreSpec:
    """What an import writes: the store's attributes, known before the first episode is read."""

    env_id: str
    """The store's env_id (a registered env name makes ``dmrl eval`` possible)."""
    obs_modes: tuple[str, ...]
    """dmrl modalities, e.g. ("rgb", "joints", "instruction")."""
    obs_spec: ObsSpec
    """{array modality: (per-step shape, dtype)}."""
    action_meaning: list[str]
    """One name per action dim (Da names)."""
    episodes: int
    """How many episodes the source holds (after --episodes), for progress and resume."""
    source: dict[str, Any] = field(default_factory=dict)
    """The ``import`` attr: format, source path, mapping, fps, cameras, ..."""
    action_range: dict[str, list[float]] | None = None
    """{"low": (Da,), "high": (Da,)}: the source's action min/max (one pass over the action column)."""

    @property
    def action_dim(self) -> int:
        return len(self.action_meaning)


def write_store(
    out: Path,
    spec: StoreSpec,
    episodes: Callable[[int], Iterator[Episode]],
    *,
    overwrite: bool = False,
    resume: bool = False,
    progress: bool = True,
) -> EpisodeStore:
    """Create ``out`` (or, with ``resume``, reopen it) and append ``episodes(skip)``: the source's episodes after the
    first ``skip``, where skip is what ``out`` already holds. Returns the open store."""
    check_output_path(out)
    if resume and out.exists():
        store = EpisodeStore.open(out, mode="a")
        theirs = store.attrs.get("import", {})
        for key in ("format", "source", "mapping"):
            if theirs.get(key) != spec.source.get(key):
                store.close()
                raise ValueError(
                    f"--resume: store {out} was imported with {key}={theirs.get(key)!r}, this run has "
                    f"{spec.source.get(key)!r}; use the same source and mapping, or another --out"
                )
        log.info("resuming %s after its %d committed episodes", out, store.n_episodes)
    else:
        attrs: dict[str, Any] = {"import": spec.source}
        if spec.action_range is not None:
            attrs["action_range"] = spec.action_range
        store = EpisodeStore.create(
            out,
            env_id=spec.env_id,
            obs_modes=spec.obs_modes,
            action_meaning=spec.action_meaning,
            obs_spec=spec.obs_spec,
            action_dim=spec.action_dim,
            extra_attrs=attrs,
            overwrite=overwrite,
            episode_info={},
        )
    from tqdm import tqdm

    skip = store.n_episodes
    bar = tqdm(total=spec.episodes, initial=skip, desc=f"import {spec.source.get('format')}", unit="ep",
               disable=not progress)  # fmt: skip
    try:
        for ep in episodes(skip):
            with sigint_deferred():
                store.append(ep)
            bar.update(1)
    finally:
        bar.close()
    return store


def action_range(blocks: Iterator[np.ndarray]) -> dict[str, list[float]]:
    """{"low", "high"} per action dim over (n, Da) blocks (streamed: one block in memory)."""
    lo = hi = None
    for b in blocks:
        if len(b) == 0:
            continue
        lo = b.min(0) if lo is None else np.minimum(lo, b.min(0))
        hi = b.max(0) if hi is None else np.maximum(hi, b.max(0))
    if lo is None or hi is None:
        raise ValueError("the source has no actions (zero frames)")
    return {"low": [float(x) for x in lo], "high": [float(x) for x in hi]}


def check_finite_actions(where: str, key: str, actions: np.ndarray) -> None:
    """One-line error at a NaN/inf action: training would fit non-finite statistics on it."""
    bad = ~np.isfinite(actions)
    if bad.any():
        row = int(np.argwhere(bad)[0][0])
        raise ValueError(f"{where}: key {key!r} has a non-finite value at frame {row}; clean the source first")
