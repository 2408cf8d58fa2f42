"""LeRobotDataset v3 (meta/info.json, parquet frames, mp4 per camera) read into dmrl episodes, streamed.

The v3 layout, as lerobot's ``LeRobotDataset`` writes it::

    meta/info.json                      codebase_version "v3.0", fps, features {key: {dtype, shape, names}},
                                        data_path / video_path templates (chunk-XXX/file-XXX)
    meta/episodes/chunk-*/file-*.parquet one row per episode: episode_index, tasks (list of str), length,
                                        data/chunk_index, data/file_index, videos/<key>/chunk_index, file_index,
                                        from_timestamp (where the episode starts in the shared mp4)
    meta/tasks.parquet                  task string (the index) -> task_index
    data/chunk-*/file-*.parquet         one row per frame: episode_index, frame_index, timestamp, index,
                                        task_index, observation.state, action, next.reward, next.done, ...
    videos/<key>/chunk-*/file-*.mp4     many episodes concatenated per file, one file set per camera

Data files are read in row batches and grouped by episode; each episode's frames are decoded from its mp4 at
``from_timestamp + timestamp``. One episode is in memory at a time.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from dmrl.data.importers.mapping import VECTOR_FIELDS, KeyMap, flag_of, require_keys
from dmrl.data.importers.sink import StoreSpec, action_range, check_finite_actions
from dmrl.data.importers.video import FrameReader
from dmrl.types import Episode

INFO = "meta/info.json"
_BATCH_ROWS = 2048  # parquet rows per read: a few hundred KB of low-dim columns


def _arrow():  # noqa: ANN202 - pyarrow is the optional `data` extra
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError as e:
        raise RuntimeError("reading LeRobot datasets needs pyarrow: pip install 'dmrl[data]'") from e
    return pa, pq


def column(batch: Any, name: str) -> np.ndarray:
    """A parquet column as numpy: (n,) for scalars, (n, d) for (fixed-size) lists of numbers."""
    pa, _ = _arrow()
    col = batch.column(name)
    if isinstance(col, pa.ChunkedArray):
        col = col.combine_chunks()
    if pa.types.is_list(col.type) or pa.types.is_fixed_size_list(col.type) or pa.types.is_large_list(col.type):
        n = len(col)
        return np.asarray(col.flatten().to_numpy(zero_copy_only=False)).reshape(n, -1)
    return np.asarray(col.to_numpy(zero_copy_only=False))


class LeRobotSource:
    """A LeRobotDataset v3 directory: its features, episodes and a streaming episode iterator."""

    def __init__(self, root: Path, keymap: KeyMap, *, image_size: int | None = None, instruction: str | None = None):
        self.root = Path(root)
        info_path = self.root / INFO
        if not info_path.is_file():
            raise FileNotFoundError(f"{self.root}: no {INFO}; is this a LeRobotDataset directory?")
        try:
            self.info: dict[str, Any] = json.loads(info_path.read_text())
        except json.JSONDecodeError as e:
            raise ValueError(f"{info_path}: corrupt JSON ({e.msg} at line {e.lineno})") from None
        version = str(self.info.get("codebase_version", "?"))
        if not version.startswith("v3"):
            raise ValueError(
                f"{info_path}: codebase_version {version}; dmrl reads LeRobotDataset v3 (convert older datasets with "
                "lerobot's convert_dataset_v21_to_v30 script)"
            )
        self.features: dict[str, dict[str, Any]] = self.info.get("features", {})
        self.fps = float(self.info.get("fps") or 0)
        if self.fps <= 0:
            raise ValueError(f"{info_path}: fps is {self.info.get('fps')!r}; it must be a positive number")
        self.where = f"{info_path} features"
        self.keymap = keymap.with_defaults(self.default_keymap())
        self.image_size = image_size
        self.instruction = instruction
        self._check_keymap()
        self.episodes_meta = self._read_episode_meta()

    # ------------------------------------------------------------------ mapping
    def default_keymap(self) -> KeyMap:
        """Every camera as rgb, observation.state as joints, action, next.reward / next.done where present."""
        cams = tuple(k for k, f in self.features.items() if f.get("dtype") == "video")
        return KeyMap(
            rgb=cams or ("none",),
            joints=("observation.state",) if "observation.state" in self.features else ("none",),
            force=("none",),
            state=("none",),
            action="action",
            reward="next.reward" if "next.reward" in self.features else "none",
            done="next.done" if "next.done" in self.features else "none",
        )

    def _check_keymap(self) -> None:
        have = list(self.features)
        m = self.keymap
        for name in ("rgb", *VECTOR_FIELDS, "action", "reward", "done"):
            require_keys(self.where, flag_of(name), getattr(m, name), have)
        for cam in m.rgb:
            if self.features[cam].get("dtype") != "video":
                videos = [k for k, f in self.features.items() if f.get("dtype") == "video"]
                raise ValueError(
                    f"--rgb: key {cam!r} is a {self.features[cam].get('dtype')} feature, not an mp4 video; "
                    f"video keys: {', '.join(videos) or 'none'}"
                )
        for name in (*VECTOR_FIELDS, "action"):
            for key in (getattr(m, name),) if name == "action" else getattr(m, name):
                if len(self.features[key].get("shape", [])) != 1 or self.features[key].get("dtype") in (
                    "video",
                    "image",
                ):
                    raise ValueError(
                        f"{flag_of(name)}: key {key!r} is not a vector (shape {self.features[key].get('shape')})"
                    )
        sizes = {cam: self.frame_hw(cam) for cam in m.rgb}
        if self.image_size is None and len(set(sizes.values())) > 1:
            raise ValueError(f"--rgb: cameras differ in size {sizes}; pass --image-size to resize them alike")

    def frame_hw(self, key: str) -> tuple[int, int]:
        """(H, W) of a video feature, from its shape and names ((H, W, C) unless names say otherwise)."""
        f = self.features[key]
        shape, names = list(f["shape"]), list(f.get("names") or [])
        if "height" in names and "width" in names:
            return int(shape[names.index("height")]), int(shape[names.index("width")])
        return (
            (int(shape[1]), int(shape[2]))
            if shape[0] in (1, 3) and shape[-1] not in (1, 3)
            else (int(shape[0]), int(shape[1]))
        )

    def dim(self, key: str) -> int:
        return int(self.features[key]["shape"][0])

    # ------------------------------------------------------------------ spec
    def spec(self, env_id: str | None, limit: int | None) -> StoreSpec:
        m = self.keymap
        obs_spec: dict[str, tuple[tuple[int, ...], str]] = {}
        if m.rgb:
            h, w = (self.image_size, self.image_size) if self.image_size else self.frame_hw(m.rgb[0])
            obs_spec["rgb"] = ((3 * len(m.rgb), h, w), "uint8")
        for name in VECTOR_FIELDS:
            keys = getattr(m, name)
            if keys:
                obs_spec[name] = ((sum(self.dim(k) for k in keys),), "float32")
        has_text = self.instruction is not None or any(self.episodes_meta["tasks"])
        modes = (*obs_spec, *(("instruction",) if has_text else ()))
        names = self.features[m.action].get("names")
        da = self.dim(m.action)
        if isinstance(names, dict):  # older writers nest names, e.g. {"motors": [...]}
            names = next(iter(names.values()), None)
        meaning = (
            [str(n) for n in names] if isinstance(names, list) and len(names) == da else [f"a{i}" for i in range(da)]
        )
        n = len(self.episodes_meta["episode_index"])
        n = n if limit is None else min(n, limit)
        source = {
            "format": "lerobot",
            "source": str(self.root.resolve()),
            "mapping": m.to_json(),
            "fps": self.fps,
            "robot_type": self.info.get("robot_type"),
            "cameras": [k.removeprefix("observation.images.") for k in m.rgb],
            "dims": {k: self.dim(k) for name in VECTOR_FIELDS for k in getattr(m, name)},
        }
        return StoreSpec(
            env_id=env_id or f"lerobot:{self.root.name}",
            obs_modes=modes,
            obs_spec=obs_spec,
            action_meaning=meaning,
            episodes=n,
            source=source,
            action_range=action_range(self._action_blocks()),
        )

    # ------------------------------------------------------------------ reading
    def _read_episode_meta(self) -> dict[str, list[Any]]:
        _, pq = _arrow()
        files = sorted((self.root / "meta" / "episodes").glob("*/*.parquet"))
        if not files:
            raise FileNotFoundError(f"{self.root}: no meta/episodes/*/*.parquet; is this a LeRobotDataset v3?")
        wanted = ["episode_index", "tasks", "length"]
        for cam in self.keymap.rgb:
            wanted += [f"videos/{cam}/chunk_index", f"videos/{cam}/file_index", f"videos/{cam}/from_timestamp"]
        out: dict[str, list[Any]] = {k: [] for k in wanted}
        for f in files:
            names = pq.ParquetFile(f).schema_arrow.names
            missing = [c for c in wanted if c not in names and c != "tasks"]
            if missing:
                raise ValueError(f"{f}: no column {missing[0]!r}; it has: {', '.join(names)}")
            table = pq.read_table(f, columns=[c for c in wanted if c in names])
            for c in wanted:
                out[c] += table.column(c).to_pylist() if c in names else [[] for _ in range(table.num_rows)]
        return out

    def _data_files(self) -> list[Path]:
        files = sorted((self.root / "data").glob("*/*.parquet"))
        if not files:
            raise FileNotFoundError(f"{self.root}: no data/*/*.parquet frame files")
        return files

    def _action_blocks(self) -> Iterator[np.ndarray]:
        _, pq = _arrow()
        for f in self._data_files():
            for batch in pq.ParquetFile(f).iter_batches(batch_size=_BATCH_ROWS, columns=[self.keymap.action]):
                yield column(batch, self.keymap.action)

    def _frame_batches(self) -> Iterator[dict[str, np.ndarray]]:
        """Column batches of every data file, in file order: {column: (n,) or (n, d)}."""
        _, pq = _arrow()
        m = self.keymap
        cols = ["episode_index", "frame_index", "timestamp", m.action]
        cols += [k for name in VECTOR_FIELDS for k in getattr(m, name)] + [k for k in (m.reward, m.done) if k]
        cols = list(dict.fromkeys(cols))
        for f in self._data_files():
            pf = pq.ParquetFile(f)
            missing = [c for c in cols if c not in pf.schema_arrow.names]
            if missing:
                raise ValueError(f"{f}: no column {missing[0]!r}; it has: {', '.join(pf.schema_arrow.names)}")
            for batch in pf.iter_batches(batch_size=_BATCH_ROWS, columns=cols):
                yield {c: column(batch, c) for c in cols}

    def _rows_per_episode(self) -> Iterator[dict[str, np.ndarray]]:
        """All frame rows of one episode at a time, in the data files' order."""
        parts: list[dict[str, np.ndarray]] = []
        current = None
        for batch in self._frame_batches():
            ep = batch["episode_index"]
            cuts = np.flatnonzero(np.diff(ep)) + 1
            for lo, hi in zip([0, *cuts.tolist()], [*cuts.tolist(), len(ep)], strict=True):
                idx = int(ep[lo])
                if current is not None and idx != current:
                    yield _concat(parts)
                    parts = []
                current = idx
                parts.append({c: v[lo:hi] for c, v in batch.items()})
        if parts:
            yield _concat(parts)

    def episodes(self, skip: int = 0, limit: int | None = None) -> Iterator[Episode]:
        """Episodes after the first ``skip`` (up to ``limit`` in all), decoded one at a time."""
        meta = self.episodes_meta
        row_of = {int(e): i for i, e in enumerate(meta["episode_index"])}
        m = self.keymap
        size = (self.image_size, self.image_size) if self.image_size else None
        readers = {cam: FrameReader(size) for cam in m.rgb}
        video_path = str(
            self.info.get("video_path") or "videos/{video_key}/chunk-{chunk_index:03d}/file-{file_index:03d}.mp4"
        )
        try:
            for n, rows in enumerate(self._rows_per_episode()):
                if limit is not None and n >= limit:
                    return
                if n < skip:
                    continue
                idx = int(rows["episode_index"][0])
                if idx not in row_of:
                    raise ValueError(f"{self.root}: episode {idx} has frames in data/ but no row in meta/episodes")
                i = row_of[idx]
                if not np.array_equal(rows["frame_index"], np.arange(len(rows["frame_index"]))):
                    raise ValueError(f"{self.root}: episode {idx}'s frames are not 0..T-1 in order in data/")
                actions = rows[m.action].astype(np.float32)
                check_finite_actions(f"{self.root} episode {idx}", m.action, actions)
                obs: dict[str, np.ndarray] = {}
                for name in VECTOR_FIELDS:
                    if getattr(m, name):
                        obs[name] = np.concatenate([rows[k].reshape(len(actions), -1) for k in getattr(m, name)], 1)
                        obs[name] = obs[name].astype(np.float32)
                if m.rgb:
                    cams = []
                    for cam in m.rgb:
                        rel = video_path.format(
                            video_key=cam,
                            chunk_index=int(meta[f"videos/{cam}/chunk_index"][i]),
                            file_index=int(meta[f"videos/{cam}/file_index"][i]),
                        )
                        times = float(meta[f"videos/{cam}/from_timestamp"][i]) + rows["timestamp"].astype(np.float64)
                        cams.append(readers[cam].frames(self.root / rel, times, self.fps).transpose(0, 3, 1, 2))
                    obs["rgb"] = np.concatenate(cams, axis=1)
                rewards = (
                    rows[m.reward].reshape(-1).astype(np.float32) if m.reward else np.zeros(len(actions), np.float32)
                )
                terminated = bool(rows[m.done].reshape(-1)[-1]) if m.done else False
                tasks = meta["tasks"][i] or []
                yield Episode(
                    obs=obs,
                    final_obs={k: v[-1] for k, v in obs.items()},  # v3 keeps no observation after the last action
                    actions=actions,
                    rewards=rewards,
                    terminated=terminated,
                    truncated=not terminated,
                    instruction=self.instruction if self.instruction is not None else (tasks[0] if tasks else ""),
                    success=terminated,
                    seed=idx,
                    info={"source_episode": float(idx)},
                    task_info={},
                )
        finally:
            for r in readers.values():
                r.close()

    def close(self) -> None:
        """Nothing stays open between episodes (files are opened per read); kept for symmetry with Hdf5Source."""


def _concat(parts: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    return {c: np.concatenate([p[c] for p in parts]) for c in parts[0]}
