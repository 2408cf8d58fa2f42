"""A dataset written by lerobot's own ``LeRobotDataset`` writer (lerobot 0.4.4; artifacts/lerobot_writer_v3, made by
artifacts/make_lerobot_writer_dataset.py) imports: actions and states exact, frames within codec tolerance, tasks as
instructions; exported and imported again, the actions are the same bits. (artifacts/read_with_lerobot.py reads a dmrl
export with lerobot's reader; it needs lerobot installed, so it is not part of the suite.)"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from dmrl.cli import main
from dmrl.data import EpisodeStore

WRITTEN = Path(__file__).parent / "artifacts" / "lerobot_writer_v3"
MEAN_TOL = 4.0  # libsvtav1 crf 30 (lerobot's default) on smooth 32 x 48 frames


def test_lerobot_writers_dataset_imports_and_round_trips(tmp_path):
    expected = np.load(WRITTEN / "expected.npz")
    store_path = tmp_path / "w.zarr"
    assert main(["data", "import", str(WRITTEN), "--out", str(store_path)]) == 0
    store = EpisodeStore.open(store_path)
    assert store.lengths.tolist() == [6, 4, 5]
    assert store.obs_spec == {"rgb": ((6, 32, 48), "uint8"), "joints": ((4,), "float32")}
    assert store.attrs["action_meaning"] == ["shoulder", "elbow", "gripper"]
    assert store.instructions() == ["pick the red cube", "open the drawer", "pick the red cube"]
    for e in range(3):
        ep = store.episode(e)
        assert np.array_equal(ep.actions, expected[f"action_{e}"])
        assert np.array_equal(ep.obs["joints"], expected[f"state_{e}"])
        for i, cam in enumerate(("front", "wrist")):
            err = np.abs(
                ep.obs["rgb"][:, 3 * i : 3 * i + 3].astype(np.int16) - expected[f"{cam}_{e}"].transpose(0, 3, 1, 2)
            )
            assert err.mean() < MEAN_TOL, (e, cam, err.mean())
    exported, again = tmp_path / "exported", tmp_path / "again.zarr"
    assert main(["data", "export", str(store_path), "--out", str(exported)]) == 0
    assert main(["data", "import", str(exported), "--out", str(again)]) == 0
    back = EpisodeStore.open(again)
    for e in range(3):
        assert np.array_equal(back.episode(e).actions, expected[f"action_{e}"])
        err = np.abs(back.episode(e).obs["rgb"][:, :3].astype(np.int16) - expected[f"front_{e}"].transpose(0, 3, 1, 2))
        assert err.mean() < 2 * MEAN_TOL  # two encodes
