"""Fixtures for the data tests; episode generators live in synthetic_episodes.py (child processes use it)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

# Make synthetic_episodes importable whatever pytest's import mode (prepend does this already, importlib not).
if str(Path(__file__).parent) not in sys.path:
    sys.path.insert(0, str(Path(__file__).parent))

from synthetic_episodes import create_store, make_episode  # noqa: E402

from dmrl.data import EpisodeStore  # noqa: E402


@pytest.fixture
def store_path(tmp_path: Path) -> Path:
    return tmp_path / "eps.zarr"


@pytest.fixture
def filled_store(store_path: Path) -> EpisodeStore:
    store = create_store(store_path, extra_attrs={"expert": "scripted"})
    for seed in range(4):
        store.append(make_episode(seed))
    return store
