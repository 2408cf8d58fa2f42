"""Fixtures for the data tests; episode generators live in synthetic_episodes.py (child processes use it)."""

from __future__ import annotations

from pathlib import Path

import pytest
from synthetic_episodes import create_store, make_episode

from dmrl.data import EpisodeStore


@pytest.fixture
def store_path(tmp_path: Path) -> Path:
    return tmp_path / "eps.zarr"


@pytest.fixture
def filled_store(store_path: Path) -> EpisodeStore:
    store = create_store(store_path, extra_attrs={"expert": "scripted"})
    for seed in range(4):
        store.append(make_episode(seed))
    return store
