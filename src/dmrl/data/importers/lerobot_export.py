"""A dmrl episode store written out as a LeRobotDataset v3 directory (parquet frames + one mp4 per camera).

The layout is the one lerobot.py reads (and lerobot's ``LeRobotDataset`` loads): one data file, one mp4 per
camera with the episodes back to back (episode e starts at ``from_timestamp`` = its first frame / fps), per-episode
rows in meta/episodes, tasks in meta/tasks.parquet, per-feature statistics in meta/stats.json. The dataset is
built in ``<out>.partial`` and renamed into place when complete, so a crash never leaves a half dataset at ``out``.
"""

from __future__ import annotations

import ast
import json
import logging
import os
import shutil
from pathlib import Path
from typing import Any

import numpy as np

from dmrl.data.episodes import EpisodeStore
from dmrl.data.importers.lerobot import INFO, _arrow
from dmrl.data.importers.video import FrameWriter, video_info
from dmrl.data.normalizer import RunningStats

log = logging.getLogger("dmrl.data.importers")
DATA_FILE = "data/chunk-000/file-000.parquet"
VIDEO_FILE = "videos/{video_key}/chunk-000/file-000.mp4"
EPISODES_FILE = "meta/episodes/chunk-000/file-000.parquet"
#: Where each dmrl vector modality goes when the store does not say where it came from.
DEFAULT_KEYS = {"joints": "observation.state", "state": "observation.environment_state", "force": "observation.force"}


def target_keys(store: EpisodeStore) -> tuple[list[str], dict[str, list[tuple[str, int]]]]:
    """(camera feature keys, {vector modality: [(feature key, dim), ...]}): an imported store goes back to the keys
    it came from (several concatenated keys split again); any other store gets lerobot's usual names."""
    src = store.attrs.get("import", {})
    spec = store.obs_spec
    mapping, dims = src.get("mapping", {}), src.get("dims", {})
    vectors: dict[str, list[tuple[str, int]]] = {}
    for name in DEFAULT_KEYS:
        if name not in spec:
            continue
        keys = mapping.get(name) if src.get("format") == "lerobot" else None
        if keys and sum(int(dims.get(k, -1)) for k in keys) == spec[name][0][0]:
            vectors[name] = [(k, int(dims[k])) for k in keys]
        else:
            vectors[name] = [(DEFAULT_KEYS[name], spec[name][0][0])]
    cams: list[str] = []
    if "rgb" in spec:
        v = spec["rgb"][0][0] // 3
        if src.get("format") == "lerobot" and len(mapping.get("rgb", [])) == v:
            cams = list(mapping["rgb"])
        else:
            names = src.get("cameras") or _collect_cameras(store) or []
            names = names if len(names) == v else [f"cam{i}" for i in range(v)]
            cams = [f"observation.images.{n}" for n in names]
    return cams, vectors


def _collect_cameras(store: EpisodeStore) -> list[str] | None:
    raw = store.attrs.get("collect", {}).get("cameras")
    try:
        return [str(c) for c in ast.literal_eval(raw)] if raw else None  # a str of a tuple: literals only, no eval
    except (ValueError, SyntaxError):
        return None


def export_lerobot(
    store: EpisodeStore,
    out: Path,
    *,
    fps: float | None,
    vcodec: str = "libsvtav1",
    crf: int = 30,
    g: int = 2,
    pix_fmt: str = "yuv420p",
    robot_type: str | None = None,
    overwrite: bool = False,
) -> dict[str, Any]:
    """Write ``store`` to ``out`` as LeRobotDataset v3; returns the info.json dict."""
    _arrow()  # a missing pyarrow fails before anything is created
    fps = fps or store.attrs.get("import", {}).get("fps")
    if not fps:
        raise ValueError(f"dmrl store {store.path} records no fps (it was not imported); pass --fps")
    fps = float(fps)
    if store.n_episodes == 0:
        raise ValueError(f"dmrl store {store.path} has no committed episodes; nothing to export")
    _check_out(out, overwrite)
    if "depth" in store.obs_spec:
        log.info("export: depth is not written (LeRobot keeps camera videos as rgb)")
    tmp = out.with_name(out.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)  # a crashed earlier export's leftovers
    tmp.mkdir(parents=True)
    try:
        info = _write(store, tmp, fps, vcodec, crf, g, pix_fmt, robot_type)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)  # nothing half-written is left behind (out itself is untouched)
        raise
    if out.exists():
        shutil.rmtree(out)
    os.replace(tmp, out)
    return info


def _write(
    store: EpisodeStore, tmp: Path, fps: float, vcodec: str, crf: int, g: int, pix_fmt: str, robot_type: str | None
) -> dict[str, Any]:
    """Everything of the dataset into ``tmp``; info.json last. Returns the info dict."""
    pa, pq = _arrow()
    cams, vectors = target_keys(store)
    h, w = store.obs_spec["rgb"][0][1:] if cams else (0, 0)
    writers = {c: FrameWriter(tmp / VIDEO_FILE.format(video_key=c), fps, h, w, vcodec, crf, g, pix_fmt) for c in cams}
    stats = {k: RunningStats((d,)) for parts in vectors.values() for k, d in parts}
    stats["action"] = RunningStats((store.action_dim,))
    stats.update({c: RunningStats((3, h, w)) for c in cams})
    tasks: dict[str, int] = {}
    ep_rows: dict[str, list[Any]] = {
        "episode_index": [],
        "tasks": [],
        "length": [],
        "dataset_from_index": [],
        "dataset_to_index": [],
    }
    writer = None
    start = 0
    try:
        for e in range(store.n_episodes):
            ep = store.episode(e)
            t = len(ep.actions)
            task = ep.instruction
            tasks.setdefault(task, len(tasks))
            cols: dict[str, Any] = {}
            for name, parts in vectors.items():
                lo = 0
                for key, d in parts:
                    x = ep.obs[name][:, lo : lo + d].astype(np.float32)
                    cols[key], lo = pa.FixedSizeListArray.from_arrays(pa.array(x.reshape(-1)), d), lo + d
                    stats[key].update(x)
            cols["action"] = pa.FixedSizeListArray.from_arrays(pa.array(ep.actions.reshape(-1)), store.action_dim)
            stats["action"].update(ep.actions)
            cols["next.reward"] = pa.array(ep.rewards.astype(np.float32))
            done = np.zeros(t, bool)
            done[-1] = ep.terminated
            cols["next.done"] = pa.array(done)
            cols["timestamp"] = pa.array((np.arange(t) / fps).astype(np.float32))
            cols["frame_index"] = pa.array(np.arange(t, dtype=np.int64))
            cols["episode_index"] = pa.array(np.full(t, e, np.int64))
            cols["index"] = pa.array(np.arange(start, start + t, dtype=np.int64))
            cols["task_index"] = pa.array(np.full(t, tasks[task], np.int64))
            table = pa.table(cols)
            if writer is None:
                (tmp / DATA_FILE).parent.mkdir(parents=True, exist_ok=True)
                writer = pq.ParquetWriter(tmp / DATA_FILE, table.schema, compression="snappy")
            writer.write_table(table)
            for i, c in enumerate(cams):
                frames = ep.obs["rgb"][:, 3 * i : 3 * i + 3]  # (T, 3, H, W)
                ep_rows.setdefault(f"videos/{c}/chunk_index", []).append(0)
                ep_rows.setdefault(f"videos/{c}/file_index", []).append(0)
                ep_rows.setdefault(f"videos/{c}/from_timestamp", []).append(writers[c].count / fps)
                writers[c].write(frames.transpose(0, 2, 3, 1))
                ep_rows.setdefault(f"videos/{c}/to_timestamp", []).append(writers[c].count / fps)
                stats[c].update(frames.astype(np.float32) / 255.0)
            for k, v in (
                ("episode_index", e),
                ("tasks", [task]),
                ("length", t),
                ("dataset_from_index", start),
                ("dataset_to_index", start + t),
            ):
                ep_rows[k].append(v)
            for k in ("data/chunk_index", "data/file_index", "meta/episodes/chunk_index", "meta/episodes/file_index"):
                ep_rows.setdefault(k, []).append(0)
            start += t
    finally:
        if writer is not None:
            writer.close()
        for fw in writers.values():
            fw.close()
    (tmp / EPISODES_FILE).parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table(ep_rows), tmp / EPISODES_FILE)
    _write_tasks(tmp / "meta" / "tasks.parquet", tasks)
    features: dict[str, Any] = {}
    for c in cams:
        info_c = video_info(tmp / VIDEO_FILE.format(video_key=c))
        features[c] = {"dtype": "video", "shape": [h, w, 3], "names": ["height", "width", "channels"], "info": info_c}
    for parts in vectors.values():
        for key, d in parts:
            features[key] = {"dtype": "float32", "shape": [d], "names": None}
    features["action"] = {"dtype": "float32", "shape": [store.action_dim], "names": list(store.attrs["action_meaning"])}
    features["next.reward"] = {"dtype": "float32", "shape": [1], "names": None}
    features["next.done"] = {"dtype": "bool", "shape": [1], "names": None}
    for k in ("timestamp",):
        features[k] = {"dtype": "float32", "shape": [1], "names": None}
    for k in ("frame_index", "episode_index", "index", "task_index"):
        features[k] = {"dtype": "int64", "shape": [1], "names": None}
    info = {
        "codebase_version": "v3.0",
        "robot_type": robot_type or store.attrs.get("import", {}).get("robot_type"),
        "total_episodes": store.n_episodes,
        "total_frames": start,
        "total_tasks": len(tasks),
        "chunks_size": 1000,
        "data_files_size_in_mb": 100,
        "video_files_size_in_mb": 200,
        "fps": int(fps) if float(fps).is_integer() else fps,
        "splits": {"train": f"0:{store.n_episodes}"},
        "data_path": "data/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet",
        "video_path": "videos/{video_key}/chunk-{chunk_index:03d}/file-{file_index:03d}.mp4" if cams else None,
        "features": features,
    }
    (tmp / "meta" / "stats.json").write_text(json.dumps({k: _stats_json(s) for k, s in stats.items()}, indent=2))
    (tmp / INFO).write_text(json.dumps(info, indent=4))  # written last inside tmp: a complete dataset has one
    return info


def _check_out(out: Path, overwrite: bool) -> None:
    from dmrl.paths import check_output_path

    check_output_path(out)
    if out.exists() and any(out.iterdir()):
        if not overwrite:
            raise FileExistsError(
                f"--out {out}: already exists; pass --overwrite to replace it, or choose another --out"
            )
        if not (out / INFO).is_file():
            raise FileExistsError(f"--out {out}: exists and is not a LeRobot dataset; refusing to delete it")


def _write_tasks(path: Path, tasks: dict[str, int]) -> None:
    """meta/tasks.parquet as pandas writes it (lerobot reads it with pandas: the task string is the index)."""
    pa, pq = _arrow()
    pandas_meta = {
        "index_columns": ["__index_level_0__"],
        "column_indexes": [],
        "columns": [
            {
                "name": "task_index",
                "field_name": "task_index",
                "pandas_type": "int64",
                "numpy_type": "int64",
                "metadata": None,
            },
            {
                "name": None,
                "field_name": "__index_level_0__",
                "pandas_type": "unicode",
                "numpy_type": "object",
                "metadata": None,
            },
        ],
        "creator": {"library": "pyarrow", "version": pa.__version__},
        "pandas_version": "2.2.0",
    }
    table = pa.table({"task_index": pa.array(list(tasks.values()), pa.int64()), "__index_level_0__": list(tasks)})
    pq.write_table(table.replace_schema_metadata({b"pandas": json.dumps(pandas_meta).encode()}), path)


def _stats_json(s: RunningStats) -> dict[str, list]:
    assert s.mean is not None and s.min is not None and s.max is not None and s.m2 is not None
    shape = s._stat_shape()
    std = np.sqrt(s.m2 / max(s.count, 1))
    return {
        "min": s.min.reshape(shape).tolist(),
        "max": s.max.reshape(shape).tolist(),
        "mean": s.mean.reshape(shape).tolist(),
        "std": std.reshape(shape).tolist(),
        "count": [int(s.count)],
    }
