"""ChunkTransitionDataset: rewards / done / valid / next_obs of the executed chunk, aligned with act()'s queue."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
import torch
from synthetic_episodes import create_store, make_episode
from torch.utils.data import DataLoader

from dmrl.data import ChunkTransitionDataset, SequenceDataset


def _episode(ep_id: int, length: int, terminated: bool):
    """state, rgb and reward at step t all hold 100*ep_id + t (rgb: 10*ep_id + t); the final obs holds 100*ep_id+99."""
    ep = make_episode(ep_id, length=length)
    t = np.arange(length, dtype=np.float32) + 100 * ep_id
    ep.obs["state"] = np.repeat(t[:, None], 5, 1)
    ep.obs["rgb"] = np.broadcast_to(
        (np.arange(length) + 10 * ep_id).astype(np.uint8)[:, None, None, None], (length, 3, 8, 8)
    ).copy()
    ep.final_obs["state"] = np.full(5, 100 * ep_id + 99, np.float32)
    ep.final_obs["rgb"] = np.full((3, 8, 8), 10 * ep_id + 9, np.uint8)
    ep.rewards = t.copy()
    ep.terminated, ep.truncated = terminated, not terminated
    return ep


@pytest.fixture
def store(store_path):
    s = create_store(store_path)
    s.append(_episode(0, 5, terminated=True))
    s.append(_episode(1, 5, terminated=False))
    return s


def test_docstring_example_terminated_L5_To2_Tp3_Ta2(store):
    ds = ChunkTransitionDataset(store, ["state", "rgb"], n_obs_steps=2, horizon=3, n_action_steps=2, episodes=[0])
    assert len(ds) == 5  # t = 0 .. 4
    rows = [ds[i] for i in range(5)]
    assert rows[0]["reward"].tolist() == [0, 1] and rows[0]["valid"].tolist() == [True, True]
    assert rows[0]["done"].tolist() == [False, False] and rows[0]["next_valid"].item() is True
    assert rows[0]["next_obs"]["state"][:, 0].tolist() == [1, 2]
    assert rows[3]["reward"].tolist() == [3, 4] and rows[3]["done"].tolist() == [False, True]
    assert rows[3]["next_obs"]["state"][:, 0].tolist() == [4, 99] and rows[3]["next_valid"].item() is True
    assert rows[3]["next_obs"]["rgb"][:, 0, 0, 0].tolist() == [4, 9]  # the final frame from final/rgb
    assert rows[4]["reward"].tolist() == [4, 0] and rows[4]["valid"].tolist() == [True, False]
    assert rows[4]["done"].tolist() == [True, False] and rows[4]["next_valid"].item() is False
    assert rows[4]["next_obs"]["state"][:, 0].tolist() == [99, 99]
    for r in rows:  # valid is the executed part of action_mask; obs/action as SequenceDataset
        assert r["valid"].tolist() == r["action_mask"][1:3].tolist()
        assert r["reward"].dtype == torch.float32 and r["done"].dtype == r["valid"].dtype == torch.bool
    plain = SequenceDataset(store, ["state", "rgb"], n_obs_steps=2, horizon=3, n_action_steps=2, episodes=[0])
    torch.testing.assert_close(rows[2]["obs"]["state"], plain[2]["obs"]["state"])
    torch.testing.assert_close(rows[2]["action"], plain[2]["action"])


def test_truncated_episode_has_no_done_and_bootstraps_from_final(store):
    ds = ChunkTransitionDataset(store, ["state"], n_obs_steps=2, horizon=3, n_action_steps=2, episodes=[1])
    assert not any(ds[i]["done"].any() for i in range(len(ds)))
    assert ds[3]["next_valid"].item() is True and ds[3]["next_obs"]["state"][:, 0].tolist() == [104, 199]
    assert ds[3]["reward"].tolist() == [103, 104]


def test_first_window_and_long_obs_history_clamp_at_zero(store):
    # To=3 > Ta=1: the next window of t=0 starts before the episode and repeats frame 0, as act()'s fresh history.
    ds = ChunkTransitionDataset(store, ["state"], n_obs_steps=3, horizon=4, n_action_steps=1, episodes=[0])
    first = ds[0]
    assert first["obs"]["state"][:, 0].tolist() == [0, 0, 0] and first["next_obs"]["state"][:, 0].tolist() == [0, 0, 1]
    assert first["reward"].tolist() == [0] and first["next_valid"].item() is True


def test_final_frames_pickling_and_collate(store):
    ds = ChunkTransitionDataset(store.path, ["state", "rgb"], n_obs_steps=2, horizon=3, n_action_steps=2)
    last = ds[4]  # episode 0, next frames [final, final]
    np.testing.assert_array_equal(last["next_obs"]["state"][0].numpy(), np.full(5, 99, np.float32))
    assert last["next_obs"]["rgb"].dtype == torch.uint8
    clone = pickle.loads(pickle.dumps(ds))  # a spawn worker reopens the zarr arrays, final frames included
    torch.testing.assert_close(clone[4]["next_obs"]["rgb"], last["next_obs"]["rgb"])
    batch = next(iter(DataLoader(ds, batch_size=4)))
    assert (
        batch["reward"].shape == (4, 2)
        and batch["next_valid"].shape == (4,)
        and batch["next_valid"].dtype == torch.bool
    )
    assert batch["next_obs"]["state"].shape == (4, 2, 5) and batch["next_obs"]["rgb"].shape == (4, 2, 3, 8, 8)
