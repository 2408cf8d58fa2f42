"""Write ``lerobot_writer_v3/`` with lerobot's own ``LeRobotDataset`` writer (lerobot 0.4.4): test_lerobot_writer.py.

Not run by the tests: it needs lerobot, datasets and pandas, which dmrl does not install. It was run once in a
throwaway venv (lerobot, datasets, huggingface-hub, pandas, accelerate installed there with --no-deps where their
pins clash with the project's torch; torchvision replaced by a stub: the writer imports it but never calls it):

    cd tests/data/importers/artifacts && python make_lerobot_writer_dataset.py lerobot_writer_v3

It also writes ``expected.npz``: the actions, states and frames as handed to the writer.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
from lerobot.datasets.lerobot_dataset import LeRobotDataset

FPS, H, W = 10, 32, 48
LENGTHS = (6, 4, 5)
TASKS = ("pick the red cube", "open the drawer")


def frame(ep: int, t: int, cam: int) -> np.ndarray:
    y, x = np.mgrid[0:H, 0:W].astype(np.float32)
    r = 128 + 100 * np.sin(x / W * 3 + t * 0.4 + cam)
    g = 128 + 100 * np.cos(y / H * 3 + ep)
    b = np.full_like(x, 50 + 60 * cam + 12 * t)
    return np.stack([r, g, b], -1).clip(0, 255).astype(np.uint8)


def main(root: Path) -> None:
    features = {
        "observation.images.front": {"dtype": "video", "shape": (H, W, 3), "names": ["height", "width", "channels"]},
        "observation.images.wrist": {"dtype": "video", "shape": (H, W, 3), "names": ["height", "width", "channels"]},
        "observation.state": {"dtype": "float32", "shape": (4,), "names": ["j0", "j1", "j2", "j3"]},
        "action": {"dtype": "float32", "shape": (3,), "names": ["shoulder", "elbow", "gripper"]},
    }
    ds = LeRobotDataset.create("dmrl/writer_test", FPS, features, root=root, robot_type="so100", use_videos=True)
    expected: dict[str, np.ndarray] = {}
    for ep, t_len in enumerate(LENGTHS):
        rng = np.random.default_rng(ep)
        states = rng.normal(size=(t_len, 4)).astype(np.float32)
        actions = (rng.uniform(0, 3, size=(t_len, 3)) * np.array([1, 2, 0.5])).astype(np.float32)
        fronts = np.stack([frame(ep, t, 0) for t in range(t_len)])
        wrists = np.stack([frame(ep, t, 1) for t in range(t_len)])
        for t in range(t_len):
            ds.add_frame(
                {
                    "observation.images.front": fronts[t],
                    "observation.images.wrist": wrists[t],
                    "observation.state": states[t],
                    "action": actions[t],
                    "task": TASKS[ep % 2],
                }
            )
        ds.save_episode()
        expected |= {f"state_{ep}": states, f"action_{ep}": actions, f"front_{ep}": fronts, f"wrist_{ep}": wrists}
    ds.finalize()
    np.savez_compressed(root / "expected.npz", **expected)


if __name__ == "__main__":
    main(Path(sys.argv[1]))
