"""SequenceDataset windows follow diffusion_policy's SequenceSampler (pad_before=To-1, pad_after=Ta-1)."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
import torch
from synthetic_episodes import DA, create_store, make_episode
from torch.utils.data import DataLoader

from dmrl.data import (
    SequenceDataset,
    StoreError,
    split_episodes,
)


def _indexed_episode(ep_id: int, length: int):
    """An episode whose state/actions/rgb at step t all hold the value 100*ep_id + t (rgb: 10*ep_id + t)."""
    ep = make_episode(ep_id, length=length)
    t = np.arange(length, dtype=np.float32) + 100 * ep_id
    ep.obs["state"] = np.repeat(t[:, None], 5, 1)
    ep.actions = np.repeat(t[:, None], DA, 1)
    ep.obs["rgb"] = np.broadcast_to(
        (np.arange(length) + 10 * ep_id).astype(np.uint8)[:, None, None, None], (length, 3, 8, 8)
    ).copy()
    return ep


@pytest.fixture
def indexed_store(store_path):
    store = create_store(store_path)
    for ep_id, length in enumerate([5, 3, 9]):
        store.append(_indexed_episode(ep_id, length))
    return store


def _dp_reference(
    length: int, To: int, Tp: int, Ta: int, pad_after: int | None = None
) -> list[tuple[list[int], list[bool]]]:
    """diffusion_policy create_indices + sample_sequence, reduced to (step indices, not-padded) per window."""
    pad_before, pad_after = min(To - 1, Tp - 1), min(Ta - 1 if pad_after is None else pad_after, Tp - 1)
    out = []
    for idx in range(-pad_before, length - Tp + pad_after + 1):
        b0, b1 = max(idx, 0), min(idx + Tp, length)
        s0, s1 = b0 - idx, Tp - ((idx + Tp) - b1)
        seq = [None] * Tp
        seq[s0:s1] = range(b0, b1)
        seq[:s0] = [b0] * s0  # repeat the first sample
        seq[s1:] = [b1 - 1] * (Tp - s1)  # repeat the last sample
        out.append((seq, [s0 <= p < s1 for p in range(Tp)]))
    return out


def test_hand_computed_windows_L5_To2_Tp4_Ta2(indexed_store):
    ds = SequenceDataset(indexed_store, ["state", "rgb"], n_obs_steps=2, horizon=4, n_action_steps=2, episodes=[0])
    assert len(ds) == 4  # L - Tp + To + Ta - 1, windows s = -1 .. 2
    first, last = ds[0], ds[3]
    assert first["obs"]["state"][:, 0].tolist() == [0, 0]
    assert first["action"][:, 0].tolist() == [0, 0, 1, 2]
    assert first["action_mask"].tolist() == [False, True, True, True]
    assert last["obs"]["state"][:, 0].tolist() == [2, 3]
    assert last["action"][:, 0].tolist() == [2, 3, 4, 4]
    assert last["action_mask"].tolist() == [True, True, True, False]
    assert last["obs"]["rgb"].dtype == torch.uint8 and last["obs"]["rgb"][:, 0, 0, 0].tolist() == [2, 3]
    assert first["obs"]["state"].dtype == torch.float32 and first["action"].shape == (4, DA)
    assert first["episode"] == 0 and "instruction" not in first["obs"]


@pytest.mark.parametrize(("To", "Tp", "Ta"), [(2, 4, 2), (1, 3, 1), (3, 8, 4), (2, 16, 8)])
def test_windows_match_diffusion_policy_sampler(indexed_store, To, Tp, Ta):
    ds = SequenceDataset(indexed_store, ["state"], n_obs_steps=To, horizon=Tp, n_action_steps=Ta)
    expected = [(e, w) for e, L in enumerate([5, 3, 9]) for w in _dp_reference(L, To, Tp, Ta)]
    assert len(ds) == len(expected)
    for i, (e, (window, mask)) in enumerate(expected):
        item = ds[i]
        values = (np.asarray(window) + 100 * e).tolist()
        assert item["episode"] == e
        assert item["action"][:, 0].tolist() == values
        assert item["obs"]["state"][:, 0].tolist() == values[:To]
        assert item["action_mask"].tolist() == mask


@pytest.mark.parametrize(("To", "Tp", "Ta", "pad_after"), [(2, 4, 2, 2), (2, 16, 8, 14), (1, 3, 1, 0), (3, 8, 4, 5)])
def test_pad_after_windows_match_the_sampler_and_reach_the_last_step(indexed_store, To, Tp, Ta, pad_after):
    ds = SequenceDataset(indexed_store, ["state"], n_obs_steps=To, horizon=Tp, n_action_steps=Ta, pad_after=pad_after)
    expected = [(e, w) for e, L in enumerate([5, 3, 9]) for w in _dp_reference(L, To, Tp, Ta, pad_after)]
    assert len(ds) == len(expected)
    for i, (e, (window, mask)) in enumerate(expected):
        item = ds[i]
        assert item["action"][:, 0].tolist() == (np.asarray(window) + 100 * e).tolist()
        assert item["action_mask"].tolist() == mask
    if pad_after == Tp - To:  # every step of every episode is some window's current step (obs index To-1)
        current = {(int(ds[i]["episode"]), int(ds[i]["obs"]["state"][-1, 0]) % 100) for i in range(len(ds))}
        assert current == {(e, t) for e, L in enumerate([5, 3, 9]) for t in range(L)}
    with pytest.raises(ValueError, match="pad_after"):
        SequenceDataset(indexed_store, ["state"], n_obs_steps=To, horizon=Tp, n_action_steps=Ta, pad_after=Tp - To + 1)


def test_instruction_and_errors(indexed_store):
    ds = SequenceDataset(indexed_store, ["rgb", "state", "instruction"], horizon=4, n_action_steps=2)
    item = ds[0]
    assert item["obs"]["instruction"] == indexed_store.instructions()[0]
    assert item["obs"]["rgb"].dtype == torch.uint8  # raw: the policy's encoders scale images themselves
    with pytest.raises(StoreError, match="no modality 'depth'"):
        SequenceDataset(indexed_store, ["depth"])
    with pytest.raises(ValueError, match="Ta <= Tp - To \\+ 1"):
        SequenceDataset(indexed_store, ["state"], n_obs_steps=2, horizon=4, n_action_steps=4)


def test_dataloader_with_workers_and_pickling(indexed_store):
    ds = SequenceDataset(indexed_store.path, ["rgb", "state", "instruction"], horizon=4, n_action_steps=2)
    clone = pickle.loads(pickle.dumps(ds))  # what a spawn worker gets: zarr handles reopened lazily
    for i in (0, len(ds) - 1):
        for k in ("rgb", "state"):
            torch.testing.assert_close(clone[i]["obs"][k], ds[i]["obs"][k])
    loader = DataLoader(ds, batch_size=4, num_workers=2, shuffle=True)
    n = 0
    for batch in loader:
        b = len(batch["episode"])
        assert batch["obs"]["rgb"].shape == (b, 2, 3, 8, 8) and batch["obs"]["rgb"].dtype == torch.uint8
        assert batch["obs"]["state"].shape == (b, 2, 5) and batch["action"].shape == (b, 4, DA)
        assert batch["action_mask"].shape == (b, 4) and len(batch["obs"]["instruction"]) == b
        n += b
    assert n == len(ds)
    cached = SequenceDataset(indexed_store, ["rgb"], horizon=4, n_action_steps=2, cache_images=True)
    torch.testing.assert_close(cached[5]["obs"]["rgb"], ds[5]["obs"]["rgb"])


def test_split_episodes_disjoint_and_deterministic():
    train, val = split_episodes(20, 0.25, seed=3)
    assert len(val) == 5 and len(train) == 15 and not set(train) & set(val)
    assert sorted([*train, *val]) == list(range(20))
    again = split_episodes(20, 0.25, seed=3)
    np.testing.assert_array_equal(again[0], train)
    np.testing.assert_array_equal(again[1], val)
    assert not np.array_equal(split_episodes(20, 0.25, seed=4)[1], val)
    assert [len(x) for x in split_episodes(2, 0.01, seed=0)] == [1, 1]
    assert len(split_episodes(5, 0.0)[1]) == 0
