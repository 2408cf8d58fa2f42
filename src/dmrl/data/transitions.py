"""Chunk-level transitions for TD learning: each Diffusion Policy window with the rewards, termination and next
observation of the Ta actions it executes (a semi-MDP whose actions are chunks, i.e. Ta-step returns).

Alignment with receding-horizon execution (``ChunkPolicy.act``): the window starting at step s has the current
step t = s + To - 1; the policy executes ``action[To-1 : To-1+Ta]``, i.e. env steps t .. t+Ta-1, and replans
at t' = t + Ta from the observation frames t'-To+1 .. t'. With L the episode's length, k < Ta, and E the end of
the chunk: E = u + 1 for the chunk's first terminal step u (see done), else E = L:

    reward[k]   rewards[t + k]                    0 where t + k >= E (padding past the end or the terminal)
    valid[k]    t + k < E                         the step exists and comes no later than the chunk's first
                                                  terminal (without terminals: = action_mask[To-1+k])
    done[k]     valid and step t + k is terminal: terminated and t + k == L - 1, or, in a store with per-step
                terminals (EpisodeStore.has_terminals), terminals[t + k]; a truncated episode without them has none
    next_obs    frames t'-To+1 .. t' clamped to [0, E]; frame L is the store's final observation (the one after
                the last action), frame E < L the stored observation after the terminal step's action, frames
                before 0 repeat frame 0 as the policy's fresh history does
    next_valid  t' <= E                           the state after the chunk was observed; False when the chunk
                                                  runs past the end or a terminal (nothing is bootstrapped)

A per-step terminal ends the chunk as if the episode ended there, as the online env ends it: the steps after it
add no reward and the chunk bootstraps from nothing; the recording goes on, so later windows start after it.
obs, action and action_mask stay SequenceDataset's (the recorded actions after a terminal remain in the window).

Example L=5, To=2, Tp=3, Ta=2 (windows s = -1 .. 3, so t = 0 .. 4), episode terminated:
    t=0: reward [r0, r1]  valid [T, T]  done [F, F]  next frames [1, 2]          next_valid T
    t=3: reward [r3, r4]  valid [T, T]  done [F, T]  next frames [4, final]      next_valid T
    t=4: reward [r4, 0]   valid [T, F]  done [T, F]  next frames [final, final]  next_valid F

Example with per-step terminals: L=6, To=2, Ta=3, terminals at steps 2 and 3 (the task holds there), truncated:
    t=0: reward [r0, r1, r2]  valid [T, T, T]  done [F, F, T]  next frames [2, 3]          next_valid T (E=3)
    t=1: reward [r1, r2, 0]   valid [T, T, F]  done [F, T, F]  next frames [3, 3]          next_valid F (E=3)
    t=3: reward [r3, 0, 0]    valid [T, F, F]  done [T, F, F]  next frames [4, 4]          next_valid F (E=4)
    t=4: reward [r4, r5, 0]   valid [T, T, F]  done [F, F, F]  next frames [final, final]  next_valid F (E=6)
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from dmrl.data.episodes import EpisodeStore
from dmrl.data.nonfinite import check_final, check_rows, is_float
from dmrl.data.sequence import SequenceDataset


class ChunkTransitionDataset(SequenceDataset):
    """`SequenceDataset` windows (same index, same obs/action/action_mask) with, per item (no batch dim):

    reward      (Ta,) float32     rewards of the executed steps, zero-padded past the episode end
    done        (Ta,) bool        True at the terminal step (of a terminated episode, or a per-step terminal)
    valid       (Ta,) bool        the executed step exists, no later than the chunk's first terminal
    next_obs[k] (To, ...)         the observation window Ta steps later (same dtypes as obs)
    next_valid  () bool           next_obs was observed (see the module docstring)
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
    ) -> None:
        store = store if isinstance(store, EpisodeStore) else EpisodeStore.open(store, "r")
        super().__init__(store, obs_keys, n_obs_steps, horizon, n_action_steps, episodes, cache_images)
        n, n_eps = store.n_steps, store.n_episodes
        self._rewards = np.asarray(store.array("rewards")[:n], dtype=np.float32)
        # TD targets add rewards and bootstrap from final observations: one NaN there spreads through the critic.
        check_rows(store, "rewards", self._rewards)
        self._terminated = np.asarray(store.terminated, dtype=bool)
        self._terminals = np.asarray(store.array("terminals")[:n], dtype=bool) if store.has_terminals else None
        # Final observations (one per episode): low-dim ones loaded once, like the per-step ones.
        self._final_lowdim: dict[str, np.ndarray] = {}
        for k in self.array_keys:
            if k not in self.image_keys:
                self._final_lowdim[k] = np.asarray(store.final_array(k)[:n_eps], dtype=np.float32)
                check_final(store, k, self._final_lowdim[k])
        self._final_images: dict[str, Any] = {
            k: np.asarray(store.final_array(k)[:n_eps]) if cache_images else store.final_array(k)
            for k in self.image_keys
        }
        for k in self.image_keys:  # E frames (one per episode), float ones only (depth; never rgb)
            if is_float(store.final_array(k)):
                check_final(store, k, np.asarray(store.final_array(k)[:n_eps]))

    def __getitem__(self, i: int) -> dict[str, Any]:
        item = super().__getitem__(i)
        e, start, length, s = (int(v) for v in self._index[i])
        to, ta = self.n_obs_steps, self.n_action_steps
        t = s + to - 1  # the current step: the window's last observed frame
        steps = t + np.arange(ta)  # (Ta,) the executed steps
        valid = steps < length
        done = valid & (steps == length - 1) & bool(self._terminated[e])
        if self._terminals is not None:  # the first terminal step ends the chunk (E in the module docstring)
            done |= valid & self._terminals[start + np.minimum(steps, length - 1)]
        end = int(steps[done.argmax()]) + 1 if done.any() else length
        valid &= steps < end
        done &= valid
        reward = np.where(valid, self._rewards[start + np.minimum(steps, length - 1)], 0.0).astype(np.float32)
        next_steps = np.clip(np.arange(t + ta - to + 1, t + ta + 1), 0, end)  # (To,), L = the final frame
        item.update(
            reward=torch.from_numpy(reward),
            done=torch.from_numpy(done),
            valid=torch.from_numpy(valid),
            next_obs=self._read_next_obs(e, start, length, next_steps),
            next_valid=torch.tensor(t + ta <= end),
        )
        return item

    def _read_next_obs(self, e: int, start: int, length: int, steps: np.ndarray) -> dict[str, Any]:
        """{key: (To, ...)} at episode-relative ``steps`` (To,) in [0, L], step L being the final observation."""
        obs = self._read_obs(e, start + np.minimum(steps, length - 1))
        at_final = torch.from_numpy(steps == length)
        if not bool(at_final.any()):
            return obs
        for k in self.array_keys:
            if k in self.image_keys:
                final = self._image_tensor(k, self._final_frame(k, e)[None])[0]
            else:
                final = torch.from_numpy(self._final_lowdim[k][e])
            obs[k][at_final] = final  # obs[k] is a fresh copy (fancy-indexed rows), safe to write
        return obs

    def _final_frame(self, key: str, e: int) -> np.ndarray:
        if self._final_images[key] is None:  # unpickled in a worker: reopen the store lazily, once per process
            store = EpisodeStore.open(self.path, "r")
            self._final_images = {k: store.final_array(k) for k in self.image_keys}
        return np.asarray(self._final_images[key][e])

    def __getstate__(self) -> dict[str, Any]:
        state = super().__getstate__()
        if not self.cache_images:
            state["_final_images"] = dict.fromkeys(self.image_keys)
        return state
