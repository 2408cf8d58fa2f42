"""Source datasets shared by the importer tests (written once per module: video encoding is the slow part)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

os.environ.setdefault("SVT_LOG", "1")  # before the first SVT-AV1 encoder starts: errors only on stderr
pytest.importorskip("av")
pytest.importorskip("pyarrow")
pytest.importorskip("h5py")

if str(Path(__file__).parent) not in sys.path:
    sys.path.insert(0, str(Path(__file__).parent))

from fixtures import write_lerobot_v3  # noqa: E402


@pytest.fixture(scope="package")
def lerobot_ds(tmp_path_factory) -> tuple[Path, dict]:
    """A LeRobot v3 dataset: 3 episodes (7, 9, 6 frames) over 2 data/video files, 2 cameras of 32 x 32, state (4,),
    actions (3,) in [0, 6], and {episode: arrays as written}."""
    root = tmp_path_factory.mktemp("lerobot") / "so100_pick"
    return root, write_lerobot_v3(root)
