"""Every YAML preset under configs/ loads into its config class (a typo in a preset is caught here, not mid-run)."""

from __future__ import annotations

from pathlib import Path

import pytest

from dmrl.config import TrainConfig, load_yaml, merge
from dmrl.train.compare import CompareConfig

PRESETS = sorted((Path(__file__).resolve().parents[2] / "configs").glob("*.yaml"))


@pytest.mark.parametrize("path", PRESETS, ids=[p.name for p in PRESETS])
def test_preset_loads(path: Path) -> None:
    cls = CompareConfig if path.name.startswith("compare") else TrainConfig
    cfg = merge(cls(), load_yaml(path))
    assert isinstance(cfg, cls)


def test_there_are_presets() -> None:
    assert len(PRESETS) >= 4
