"""Diffusion Policy training windows: To observation frames and Tp actions per sample, edge-padded.

Convention (real-stanford/diffusion_policy `SequenceSampler` with sequence_length=Tp, pad_before=To-1,
pad_after=Ta-1): a sample is a window of Tp consecutive steps starting at step s of its episode (length L),
for every s in -(To-1) .. L-Tp+P, P = pad_after (default Ta-1), i.e. L - Tp + To + P windows per episode (none
if that is <= 0). With the default the last Tp-To-Ta+1 steps of an episode are never a window's current step;
that is harmless where an episode runs on past its last decision, but where it ends on one (MultiPath ends
the step after the cup is released) the policy never sees the states just before that decision. P = Tp-To
makes every step a current step once (the extra windows' missing actions are masked like any padding).

    obs     = frames s .. s+To-1          the current step is t = s+To-1
    action  = actions s .. s+Tp-1         i.e. t-To+1 .. t-To+Tp; the policy executes action[To-1 : To-1+Ta]

Steps outside [0, L) repeat the nearest edge (first frame/action before the start, last after the end),
and `action_mask` (Tp,) is False exactly on those padded action steps, so a loss may ignore them.
Example, L=5, To=2, Tp=4, Ta=2 -> 4 windows (s = -1 .. 2):
    first: obs steps [0, 0], actions [0, 0, 1, 2], mask [F, T, T, T]
    last:  obs steps [2, 3], actions [2, 3, 4, 4], mask [T, T, T, F]
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset

from dmrl.data._zarr_utils import StoreError
from dmrl.data.episodes import EpisodeStore


def split_episodes(n_episodes: int, val_fraction: float, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Deterministic disjoint (train_idx, val_idx), both sorted int64; val is non-empty (and train too)
    whenever n_episodes >= 2 and val_fraction > 0."""
    if not 0.0 <= val_fraction < 1.0:
        raise ValueError(f"val_fraction: got {val_fraction}; allowed values are in [0, 1)")
    perm = np.random.default_rng(seed).permutation(n_episodes)
    n_val = round(n_episodes * val_fraction)
    if val_fraction > 0 and n_episodes >= 2:
        n_val = min(max(n_val, 1), n_episodes - 1)
    return np.sort(perm[n_val:]).astype(np.int64), np.sort(perm[:n_val]).astype(np.int64)


class SequenceDataset(Dataset):
    """Windows over an `EpisodeStore` (see module docstring). Item (no batch dim; DataLoader adds B):

    obs[k]       (To, ...) float32 torch tensor per requested array modality, as stored (raw: the policy
                 normalises inside itself); rgb stays uint8 (To,3,H,W); obs["instruction"] is the episode's
                 string if requested
    action       (Tp, Da) float32, as stored
    action_mask  (Tp,) bool, False on padded action steps
    episode      int, the store's episode index
    """

    def __init__(
        self,
        store: EpisodeStore | str | Path,
        obs_keys: Sequence[str],
        n_obs_steps: int = 2,
        horizon: int = 16,
        n_action_steps: int = 8,
        episodes: Sequence[int] | np.ndarray | None = None,
        cache_images: bool = False,
        pad_after: int | None = None,
    ) -> None:
        To, Tp, Ta = n_obs_steps, horizon, n_action_steps
        if To < 1 or Tp < To or not 1 <= Ta <= Tp - To + 1:
            raise ValueError(
                f"horizons: got chunk.n_obs_steps (To) {To}, chunk.horizon (Tp) {Tp}, chunk.n_action_steps (Ta) {Ta}; "
                "need To >= 1, Tp >= To and 1 <= Ta <= Tp - To + 1"
            )
        self.pad_after = Ta - 1 if pad_after is None else int(pad_after)
        if not 0 <= self.pad_after <= Tp - To:
            raise ValueError(f"chunk.pad_after: got {pad_after}; allowed None (Ta - 1) or 0 .. Tp - To = {Tp - To}")
        self._store: EpisodeStore | None = store if isinstance(store, EpisodeStore) else None
        store = store if isinstance(store, EpisodeStore) else EpisodeStore.open(store, "r")
        self.path = store.path
        self.n_obs_steps, self.horizon, self.n_action_steps = To, Tp, Ta
        self.with_instruction = "instruction" in obs_keys
        if self.with_instruction and "instruction" not in store.obs_modes:
            raise StoreError(
                f"dmrl store {store.path}: no modality 'instruction' "
                f"(store has: {', '.join(store.obs_modes)}); "
                "collect with --obs-modes including instruction"
            )
        self.array_keys = tuple(k for k in obs_keys if k != "instruction")
        for k in self.array_keys:
            store.array(k)  # StoreError naming the modality if the store lacks it
        # Low-dim keys (and actions) are small: load them once. Images are read per item.
        self.image_keys = tuple(k for k in self.array_keys if store.array(k).ndim >= 3)
        n = store.n_steps
        self._lowdim: dict[str, np.ndarray] = {}
        for k in ("actions", *(k for k in self.array_keys if k not in self.image_keys)):
            self._lowdim[k] = np.asarray(store.array(k)[:n], dtype=np.float32)
        self._images: dict[str, Any] = {
            k: np.asarray(store.array(k)[:n]) if cache_images else store.array(k) for k in self.image_keys
        }
        self.cache_images = cache_images
        self._instructions = store.instructions() if self.with_instruction else []
        self.episodes = np.arange(store.n_episodes) if episodes is None else np.asarray(episodes, dtype=np.int64)
        if len(self.episodes) and not (self.episodes.min() >= 0 and self.episodes.max() < store.n_episodes):
            raise ValueError(f"episodes: indices must be in [0, {store.n_episodes}), got {self.episodes.tolist()}")
        self._index = self._build_index(store.episode_ends)
        if len(self._index) == 0:
            raise ValueError(
                f"SequenceDataset: no windows; episodes {self.episodes.tolist()[:8]} of {store.path} are all "
                f"shorter than Tp - To - pad_after + 1 = {Tp - To - self.pad_after + 1} steps"
            )

    def _build_index(self, ends: np.ndarray) -> np.ndarray:
        """(S, 4) int64 rows of (episode, episode start step, episode length, window start s)."""
        To, Tp = self.n_obs_steps, self.horizon
        rows = []
        for e in self.episodes.tolist():
            start = int(ends[e - 1]) if e else 0
            length = int(ends[e]) - start
            s = np.arange(-(To - 1), length - Tp + self.pad_after + 1)
            rows.append(np.stack([np.full_like(s, e), np.full_like(s, start), np.full_like(s, length), s], 1))
        return np.concatenate(rows).astype(np.int64) if rows else np.zeros((0, 4), np.int64)

    def __len__(self) -> int:
        return len(self._index)

    def window_steps(self, i: int) -> tuple[int, np.ndarray, np.ndarray, np.ndarray]:
        """(episode, obs steps (To,), action steps (Tp,), action_mask (Tp,)); steps are episode-relative."""
        e, _, length, s = (int(v) for v in self._index[i])
        steps = np.arange(s, s + self.horizon)
        clipped = np.clip(steps, 0, length - 1)  # repeat-edge padding is exactly index clamping
        return e, clipped[: self.n_obs_steps], clipped, (steps >= 0) & (steps < length)

    def __getitem__(self, i: int) -> dict[str, Any]:
        e, obs_steps, act_steps, mask = self.window_steps(i)
        start = int(self._index[i, 1])
        return {
            "obs": self._read_obs(e, start + obs_steps),
            "action": torch.from_numpy(self._lowdim["actions"][start + act_steps]),
            "action_mask": torch.from_numpy(mask),
            "episode": e,
        }

    def _read_obs(self, e: int, rows: np.ndarray) -> dict[str, Any]:
        """{key: (To, ...) tensor} at global step rows (To,) of episode e, plus its instruction if requested."""
        obs: dict[str, Any] = {}
        for k in self.array_keys:
            if k in self.image_keys:
                obs[k] = self._image_tensor(k, self._read_image(k, rows))
            else:
                obs[k] = torch.from_numpy(self._lowdim[k][rows])
        if self.with_instruction:
            obs["instruction"] = self._instructions[e]
        return obs

    def _image_tensor(self, key: str, x: np.ndarray) -> torch.Tensor:
        """Stored frames -> tensor: uint8 kept (a quarter of float32's bytes), anything else as float32."""
        if x.dtype != np.uint8:
            x = x.astype(np.float32, copy=False)
        return torch.from_numpy(np.ascontiguousarray(x))

    def _read_image(self, key: str, rows: np.ndarray) -> np.ndarray:
        """(To, C, H, W) frames at global rows (may repeat at padded edges): one contiguous zarr read."""
        if self._images[key] is None:  # unpickled in a worker: reopen the store lazily, once per process
            self._store = EpisodeStore.open(self.path, "r")
            self._images = {k: self._store.array(k) for k in self.image_keys}
        lo, hi = int(rows.min()), int(rows.max()) + 1
        return np.asarray(self._images[key][lo:hi])[rows - lo]

    def __getstate__(self) -> dict[str, Any]:
        # zarr handles are not shipped to workers; each worker reopens the store on first image read.
        state = dict(self.__dict__)
        state["_store"] = None
        if not self.cache_images:
            state["_images"] = dict.fromkeys(self.image_keys)
        return state
