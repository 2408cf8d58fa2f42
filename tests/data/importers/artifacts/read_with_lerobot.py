"""Read a dmrl export with lerobot's LeRobotDataset reader; frames decoded with PyAV through lerobot's own
timestamp logic (its torchvision/torchcodec decoders are not installed in this throwaway venv). Not run by the tests.

    dmrl data import tests/data/importers/artifacts/lerobot_writer_v3 --out /tmp/w.zarr
    dmrl data export /tmp/w.zarr --out /tmp/w_export
    HF_HUB_OFFLINE=1 python tests/data/importers/artifacts/read_with_lerobot.py /tmp/w_export \
        tests/data/importers/artifacts/lerobot_writer_v3/expected.npz
"""

import sys

import av
import lerobot.datasets.lerobot_dataset as lrd
import numpy as np
import torch


def decode_pyav(video_path, timestamps, tolerance_s, backend=None):
    # lerobot's decode_video_frames contract: (N, C, H, W) float32 in [0, 1], frames within tolerance_s
    with av.open(str(video_path)) as c:
        frames = [(f.time, f.to_ndarray(format="rgb24")) for f in c.decode(c.streams.video[0])]
    out = []
    for ts in timestamps:
        t, img = min(frames, key=lambda x: abs(x[0] - ts))
        assert abs(t - ts) < tolerance_s, (t, ts, tolerance_s)
        out.append(torch.from_numpy(img).permute(2, 0, 1).float() / 255)
    return torch.stack(out)


lrd.decode_video_frames = decode_pyav
root, expected = sys.argv[1], np.load(sys.argv[2])
ds = lrd.LeRobotDataset("dmrl/export_check", root=root)
print("episodes", ds.num_episodes, "frames", ds.num_frames, "fps", ds.fps, "features", list(ds.features))
ep_starts = {}
worst = 0.0
for i in range(len(ds)):
    item = ds[i]
    e, t = int(item["episode_index"]), int(item["frame_index"])
    assert np.array_equal(item["action"].numpy(), expected[f"action_{e}"][t]), (e, t)
    assert np.array_equal(item["observation.state"].numpy(), expected[f"state_{e}"][t]), (e, t)
    for cam in ("front", "wrist"):
        img = (item[f"observation.images.{cam}"].numpy() * 255).round()
        worst = max(worst, float(np.abs(img - expected[f"{cam}_{e}"][t].transpose(2, 0, 1)).mean()))
    assert item["task"] == ("pick the red cube" if e % 2 == 0 else "open the drawer"), item["task"]
print("OK: actions and states exact, tasks equal; worst per-frame mean abs frame error", round(worst, 2))
