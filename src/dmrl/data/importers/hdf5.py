"""robomimic-style HDF5 (``data/demo_N/{obs/*, actions, rewards, dones}``) read into dmrl episodes, one demo at a time.

robomimic's layout: a ``data`` group with one group per demonstration (``demo_0``, ``demo_1``, ... in numeric
order); each holds ``obs/<key>`` (T, ...) arrays (images (T, H, W, 3) uint8, low-dim (T, d)), ``actions`` (T, Da),
``rewards`` (T,), ``dones`` (T,) and optionally ``next_obs/<key>``. ``data`` may carry ``env_args`` (JSON) naming
the simulator env. h5py reads a demo's datasets on demand, so one demo is in memory at a time.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from dmrl.data.importers.mapping import VECTOR_FIELDS, KeyMap, flag_of, require_keys
from dmrl.data.importers.sink import StoreSpec, action_range, check_finite_actions
from dmrl.types import Episode


def _h5py():  # noqa: ANN202 - h5py is the optional `data` extra
    try:
        import h5py
    except ImportError as e:
        raise RuntimeError("reading HDF5 needs h5py: pip install 'dmrl[data]'") from e
    return h5py


class Hdf5Source:
    """A robomimic-style HDF5 file: its demos, obs keys and a streaming episode iterator."""

    def __init__(self, path: Path, keymap: KeyMap, *, image_size: int | None = None, instruction: str | None = None):
        h5py = _h5py()
        self.path = Path(path)
        if not self.path.is_file():
            raise FileNotFoundError(f"{self.path}: no such HDF5 file")
        try:
            self.file = h5py.File(self.path, "r")
        except OSError as e:
            raise ValueError(f"{self.path}: not a readable HDF5 file ({e})") from None
        if "data" not in self.file:
            raise ValueError(
                f"{self.path}: no 'data' group (robomimic: data/demo_N); it has: {', '.join(self.file) or 'nothing'}"
            )
        data = self.file["data"]
        demos = [k for k in data if re.fullmatch(r"demo_\d+", k)]
        if not demos:
            raise ValueError(f"{self.path}: 'data' holds no demo_N groups; it has: {', '.join(data) or 'nothing'}")
        self.demos = sorted(demos, key=lambda k: int(k.split("_")[1]))
        first = data[self.demos[0]]
        if "obs" not in first:
            raise ValueError(f"{self.path}: data/{self.demos[0]} has no 'obs' group; it has: {', '.join(first)}")
        self.obs_shapes = {k: first["obs"][k].shape[1:] for k in first["obs"]}
        self.obs_dtypes = {k: first["obs"][k].dtype for k in first["obs"]}
        self.demo_keys = [k for k in first if k not in ("obs", "next_obs")]
        if image_size is not None:
            raise ValueError("--image-size: resizing is for LeRobot videos; robomimic images are stored at their size")
        self.instruction = instruction
        self.where = f"{self.path} data/{self.demos[0]}/obs"
        self.keymap = keymap.with_defaults(self.default_keymap())
        self._check_keymap()

    def default_keymap(self) -> KeyMap:
        """Every (H, W, 3) uint8 obs as rgb, robot0_joint_pos as joints when present, actions, rewards, dones."""
        cams = tuple(
            k for k, s in self.obs_shapes.items() if len(s) == 3 and s[-1] == 3 and self.obs_dtypes[k] == np.uint8
        )
        return KeyMap(
            rgb=cams or ("none",),
            joints=("robot0_joint_pos",) if "robot0_joint_pos" in self.obs_shapes else ("none",),
            force=("none",),
            state=("none",),
            action="actions",
            reward="rewards" if "rewards" in self.demo_keys else "none",
            done="dones" if "dones" in self.demo_keys else "none",
        )

    def _check_keymap(self) -> None:
        m = self.keymap
        obs_keys = list(self.obs_shapes)
        for name in ("rgb", *VECTOR_FIELDS):
            require_keys(self.where, flag_of(name), getattr(m, name), obs_keys)
        where = f"{self.path} data/{self.demos[0]}"
        for name in ("action", "reward", "done"):
            require_keys(where, flag_of(name), getattr(m, name), self.demo_keys)
        for cam in m.rgb:
            s = self.obs_shapes[cam]
            if len(s) != 3 or s[-1] != 3:
                raise ValueError(f"--rgb: obs key {cam!r} is shaped {s}, not an (H, W, 3) image")
        if len({self.obs_shapes[c] for c in m.rgb}) > 1:
            raise ValueError(
                f"--rgb: cameras differ in size {[self.obs_shapes[c] for c in m.rgb]}; map cameras of one size"
            )
        for name in VECTOR_FIELDS:
            for k in getattr(m, name):
                if len(self.obs_shapes[k]) != 1:
                    raise ValueError(f"{flag_of(name)}: obs key {k!r} is shaped {self.obs_shapes[k]}, not a vector")
        if self.file["data"][self.demos[0]][m.action].ndim != 2:
            raise ValueError(f"--action: {m.action!r} is not a (T, Da) array")

    def spec(self, env_id: str | None, limit: int | None) -> StoreSpec:
        m = self.keymap
        obs_spec: dict[str, tuple[tuple[int, ...], str]] = {}
        if m.rgb:
            h, w, _ = self.obs_shapes[m.rgb[0]]
            obs_spec["rgb"] = ((3 * len(m.rgb), int(h), int(w)), "uint8")
        for name in VECTOR_FIELDS:
            if getattr(m, name):
                obs_spec[name] = ((sum(int(self.obs_shapes[k][0]) for k in getattr(m, name)),), "float32")
        modes = (*obs_spec, *(("instruction",) if self.instruction is not None else ()))
        da = int(self.file["data"][self.demos[0]][m.action].shape[1])
        env_args = _env_args(self.file["data"].attrs.get("env_args"))
        n = len(self.demos) if limit is None else min(len(self.demos), limit)
        source: dict[str, Any] = {
            "format": "hdf5",
            "source": str(self.path.resolve()),
            "mapping": m.to_json(),
            "env_name": env_args.get("env_name"),
            "cameras": [k.removesuffix("_image") for k in m.rgb],
            "dims": {k: int(self.obs_shapes[k][0]) for name in VECTOR_FIELDS for k in getattr(m, name)},
        }
        blocks = (np.asarray(self.file["data"][d][m.action]) for d in self.demos[:n])
        return StoreSpec(
            env_id=env_id or f"robomimic:{env_args.get('env_name') or self.path.stem}",
            obs_modes=modes,
            obs_spec=obs_spec,
            action_meaning=[f"a{i}" for i in range(da)],
            episodes=n,
            source=source,
            action_range=action_range(blocks),
        )

    def episodes(self, skip: int = 0, limit: int | None = None) -> Iterator[Episode]:
        """Demos after the first ``skip`` (up to ``limit`` in all), read one at a time."""
        m = self.keymap
        demos = self.demos if limit is None else self.demos[:limit]
        for name in demos[skip:]:
            g = self.file["data"][name]
            where = f"{self.path} data/{name}"
            missing = [k for k in (m.action, *(k for k in (m.reward, m.done) if k)) if k not in g]
            missing += [f"obs/{k}" for f in ("rgb", *VECTOR_FIELDS) for k in getattr(m, f) if k not in g["obs"]]
            if missing:
                raise ValueError(f"{where}: no {missing[0]!r} (the first demo has it); it has: {', '.join(g)}")
            actions = np.asarray(g[m.action], dtype=np.float32)
            check_finite_actions(where, m.action, actions)
            t = len(actions)
            obs: dict[str, np.ndarray] = {}
            final: dict[str, np.ndarray] = {}
            nxt = g.get("next_obs")
            if m.rgb:
                obs["rgb"] = np.concatenate([np.asarray(g["obs"][c]).transpose(0, 3, 1, 2) for c in m.rgb], 1)
                if nxt is not None and all(c in nxt for c in m.rgb):
                    final["rgb"] = np.concatenate([np.asarray(nxt[c][-1]).transpose(2, 0, 1) for c in m.rgb], 0)
            for field in VECTOR_FIELDS:
                keys = getattr(m, field)
                if keys:
                    obs[field] = np.concatenate([np.asarray(g["obs"][k]).reshape(t, -1) for k in keys], 1).astype(
                        np.float32
                    )
                    if nxt is not None and all(k in nxt for k in keys):
                        final[field] = np.concatenate([np.asarray(nxt[k][-1]).reshape(-1) for k in keys]).astype(
                            np.float32
                        )
            for k, v in obs.items():
                if len(v) != t:
                    raise ValueError(f"{where}: {k} has {len(v)} steps but {m.action!r} has {t}")
                final.setdefault(k, v[-1])  # no next_obs: the last observation stands in for the one after it
            rewards = np.asarray(g[m.reward], dtype=np.float32).reshape(-1) if m.reward else np.zeros(t, np.float32)
            terminated = bool(np.asarray(g[m.done]).reshape(-1)[-1]) if m.done else False
            yield Episode(
                obs=obs,
                final_obs=final,
                actions=actions,
                rewards=rewards,
                terminated=terminated,
                truncated=not terminated,
                instruction=self.instruction or "",
                success=terminated,
                seed=int(name.split("_")[1]),
                info={"source_episode": float(name.split("_")[1])},
                task_info={},
            )

    def close(self) -> None:
        self.file.close()


def _env_args(raw: Any) -> dict[str, Any]:
    if raw is None:
        return {}
    try:
        doc = json.loads(raw if isinstance(raw, str) else bytes(raw).decode())
    except (ValueError, TypeError):
        return {}
    return doc if isinstance(doc, dict) else {}
