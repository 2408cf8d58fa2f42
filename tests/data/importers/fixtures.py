"""Source datasets written the way their own tools write them, independently of dmrl's importers.

LeRobot: lerobot's writer needs torchvision, datasets and huggingface_hub, which this project does not install (and
torchvision would have to match the pinned torch), so ``write_lerobot_v3`` lays out LeRobotDataset v3 with pyarrow
and PyAV the way lerobot 0.4's ``LeRobotDataset.save_episode`` does (a small dataset from lerobot's real writer is in
artifacts/lerobot_writer_v3, see test_lerobot_writer.py): episodes split over chunk/file parquet files,
episodes concatenated per mp4 (libsvtav1, yuv420p, g=2, crf=30, lerobot's defaults) with ``from_timestamp`` per
episode, fixed-size list columns for vectors, ``tasks`` per episode in meta/episodes, stats columns beside them.
robomimic: ``write_robomimic`` writes data/demo_N/{obs, next_obs, actions, rewards, dones} with h5py.
"""

from __future__ import annotations

import functools
import json
from fractions import Fraction
from pathlib import Path

import av
import h5py
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from dmrl.data.importers.video import keep_scheduling

FPS = 10
CAMS = ("observation.images.front", "observation.images.wrist")


@functools.lru_cache(maxsize=64)
def frame(cam: int, ep: int, t: int, h: int, w: int) -> np.ndarray:
    """A smooth (H, W, 3) uint8 test image (video codecs keep smooth images within a few levels); 4 x 8 patterns."""
    ep, t = ep % 4, t % 8
    y, x = np.mgrid[0:h, 0:w].astype(np.float32)
    r = 128 + 100 * np.sin(x / w * 3 + t * 0.3 + cam)
    g = 128 + 100 * np.cos(y / h * 3 + ep)
    b = np.full_like(x, 60 + 40 * cam + 10 * (t % 5))
    return np.stack([r, g, b], -1).clip(0, 255).astype(np.uint8)


def episode_arrays(ep: int, t: int, state_dim: int = 4, action_dim: int = 3) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(ep)
    return {
        "state": rng.normal(size=(t, state_dim)).astype(np.float32),
        # joint targets in radians: well outside [-1, 1], as real robots' actions often are
        "action": (rng.uniform(0.0, 3.0, size=(t, action_dim)) * np.array([1, 2, 0.5])[:action_dim]).astype(np.float32),
        "reward": rng.uniform(size=t).astype(np.float32),
    }


def _keeps_scheduling(fn):  # noqa: ANN001, ANN202
    """SVT-AV1 leaves the encoding thread real-time (SCHED_FIFO, as root): every later test and its children would
    starve the machine; give the thread its policy back (see dmrl.data.importers.video.keep_scheduling)."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        with keep_scheduling():
            return fn(*args, **kwargs)

    return wrapper


@_keeps_scheduling
def write_lerobot_v3(
    root: Path,
    lengths: tuple[int, ...] = (7, 9, 6),
    hw: tuple[int, int] = (32, 32),
    episodes_per_file: int = 2,
    cams: tuple[str, ...] = CAMS,
    tasks: tuple[str, ...] = ("pick the red cube", "open the drawer"),
    vcodec: str = "libsvtav1",
    keep_frames: bool = True,
) -> dict[int, dict[str, np.ndarray]]:
    """Write the dataset; returns {episode: {"state", "action", "reward", cam: (T, H, W, 3) if keep_frames}} as
    written. vcodec libx264 encodes at preset ultrafast (big generated datasets)."""
    h, w = hw
    truth: dict[int, dict[str, np.ndarray]] = {}
    ep_rows: list[dict] = []
    index = 0
    n_files = (len(lengths) + episodes_per_file - 1) // episodes_per_file
    for f in range(n_files):
        eps = range(f * episodes_per_file, min(len(lengths), (f + 1) * episodes_per_file))
        tables = []
        writers = {}
        for c in cams:
            path = root / f"videos/{c}/chunk-000/file-{f:03d}.mp4"
            path.parent.mkdir(parents=True, exist_ok=True)
            cont = av.open(str(path), "w")
            fast = {"preset": "ultrafast"} if vcodec == "libx264" else {}
            s = cont.add_stream(vcodec, rate=FPS, options={"g": "2", "crf": "30", **fast})
            s.width, s.height, s.pix_fmt = w, h, "yuv420p"
            writers[c] = (cont, s, [0])
        for e in eps:
            t = lengths[e]
            arr = episode_arrays(e, t)
            done = np.zeros(t, bool)
            done[-1] = e % 2 == 0  # even episodes end in success, odd ones are cut off
            tables.append(
                pa.table(
                    {
                        "observation.state": pa.FixedSizeListArray.from_arrays(pa.array(arr["state"].ravel()), 4),
                        "action": pa.array(list(arr["action"])),  # a variable-length list column, as older writers
                        "next.reward": pa.array(arr["reward"]),
                        "next.done": pa.array(done),
                        "timestamp": pa.array((np.arange(t) / FPS).astype(np.float32)),
                        "frame_index": pa.array(np.arange(t, dtype=np.int64)),
                        "episode_index": pa.array(np.full(t, e, np.int64)),
                        "index": pa.array(np.arange(index, index + t, dtype=np.int64)),
                        "task_index": pa.array(np.full(t, e % len(tasks), np.int64)),
                    }
                )
            )
            row = {
                "episode_index": e,
                "tasks": [tasks[e % len(tasks)]],
                "length": t,
                "data/chunk_index": 0,
                "data/file_index": f,
                "dataset_from_index": index,
                "dataset_to_index": index + t,
                "stats/action/min": arr["action"].min(0).tolist(),
                "stats/action/max": arr["action"].max(0).tolist(),
                "meta/episodes/chunk_index": 0,
                "meta/episodes/file_index": f,
            }
            for ci, c in enumerate(cams):
                cont, s, count = writers[c]
                frames = np.stack([frame(ci, e, i, h, w) for i in range(t)])
                if keep_frames:
                    arr[c] = frames
                row[f"videos/{c}/chunk_index"] = 0
                row[f"videos/{c}/file_index"] = f
                row[f"videos/{c}/from_timestamp"] = count[0] / FPS
                for img in frames:
                    vf = av.VideoFrame.from_ndarray(img, format="rgb24")
                    vf.pts, vf.time_base = count[0], Fraction(1, FPS)
                    for p in s.encode(vf):
                        cont.mux(p)
                    count[0] += 1
                row[f"videos/{c}/to_timestamp"] = count[0] / FPS
            ep_rows.append(row)
            truth[e] = arr
            index += t
        for cont, s, _ in writers.values():
            for p in s.encode():
                cont.mux(p)
            cont.close()
        path = root / f"data/chunk-000/file-{f:03d}.parquet"
        path.parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(pa.concat_tables(tables), path)
        meta = root / f"meta/episodes/chunk-000/file-{f:03d}.parquet"
        meta.parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(pa.Table.from_pylist([r for r in ep_rows if r["data/file_index"] == f]), meta)
    pq.write_table(pa.table({"task_index": list(range(len(tasks))), "__index_level_0__": list(tasks)}),
                   root / "meta/tasks.parquet")  # fmt: skip
    features = {
        c: {"dtype": "video", "shape": [h, w, 3], "names": ["height", "width", "channels"], "info": {"video.fps": FPS}}
        for c in cams
    }
    features |= {
        "observation.state": {"dtype": "float32", "shape": [4], "names": [f"j{i}" for i in range(4)]},
        "action": {"dtype": "float32", "shape": [3], "names": ["shoulder", "elbow", "gripper"]},
        "next.reward": {"dtype": "float32", "shape": [1], "names": None},
        "next.done": {"dtype": "bool", "shape": [1], "names": None},
        "timestamp": {"dtype": "float32", "shape": [1], "names": None},
        "frame_index": {"dtype": "int64", "shape": [1], "names": None},
        "episode_index": {"dtype": "int64", "shape": [1], "names": None},
        "index": {"dtype": "int64", "shape": [1], "names": None},
        "task_index": {"dtype": "int64", "shape": [1], "names": None},
    }
    info = {
        "codebase_version": "v3.0",
        "robot_type": "so100",
        "total_episodes": len(lengths),
        "total_frames": index,
        "total_tasks": len(tasks),
        "chunks_size": 1000,
        "data_files_size_in_mb": 100,
        "video_files_size_in_mb": 200,
        "fps": FPS,
        "splits": {"train": f"0:{len(lengths)}"},
        "data_path": "data/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet",
        "video_path": "videos/{video_key}/chunk-{chunk_index:03d}/file-{file_index:03d}.mp4",
        "features": features,
    }
    (root / "meta/info.json").write_text(json.dumps(info, indent=4))
    return truth


def write_robomimic(path: Path, lengths: tuple[int, ...] = (8, 5), hw: tuple[int, int] = (16, 16)) -> dict:
    """A robomimic-style file: agentview_image (T, H, W, 3) uint8, robot0_joint_pos (T, 7), object (T, 10)."""
    truth = {}
    with h5py.File(path, "w") as f:
        data = f.create_group("data")
        data.attrs["env_args"] = json.dumps({"env_name": "Lift", "type": 1})
        for n, t in enumerate(lengths):
            rng = np.random.default_rng(100 + n)
            g = data.create_group(f"demo_{n}")
            obs = {
                "agentview_image": rng.integers(0, 255, size=(t + 1, *hw, 3), dtype=np.uint8),
                "robot0_joint_pos": rng.normal(size=(t + 1, 7)).astype(np.float64),
                "object": rng.normal(size=(t + 1, 10)).astype(np.float32),
            }
            for k, v in obs.items():
                g.create_dataset(f"obs/{k}", data=v[:-1])
                g.create_dataset(f"next_obs/{k}", data=v[1:])
            actions = rng.uniform(-1, 1, size=(t, 7)).astype(np.float64)
            dones = np.zeros(t, np.int64)
            dones[-1] = 1
            g.create_dataset("actions", data=actions)
            g.create_dataset("rewards", data=dones.astype(np.float64))
            g.create_dataset("dones", data=dones)
            g.attrs["num_samples"] = t
            truth[n] = {**obs, "actions": actions}
    return truth
