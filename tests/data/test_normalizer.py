"""Normalizer: limits/gaussian fits, numpy+torch round trips, state_dict/json, store-saved stats."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from dmrl.data import MissingStatError, Normalizer, RunningStats, StoreError, fit_normalizer


def _data(seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    state = rng.normal(3.0, 2.0, (50, 5)).astype(np.float32)
    state[:, 2] = 7.5  # a constant dim
    return {
        "state": state,
        "actions": rng.uniform(-0.3, 0.8, (50, 3)).astype(np.float32),
        "rgb": rng.integers(0, 256, (50, 3, 8, 8), dtype=np.uint8),
        "depth": rng.uniform(0.2, 3.0, (50, 1, 8, 8)).astype(np.float32),
    }


def test_limits_map_to_unit_box_and_constant_dim_is_safe():
    data = _data()
    norm = Normalizer.fit(data, mode="limits")
    y = norm.normalize("state", data["state"])
    live = [0, 1, 3, 4]
    np.testing.assert_allclose(y[:, live].min(0), -1, atol=1e-5)
    np.testing.assert_allclose(y[:, live].max(0), 1, atol=1e-5)
    np.testing.assert_array_equal(y[:, 2], 0.0)  # constant dim: scale 1, value -> 0, no division by ~0
    assert norm.scale["state"][2] == 1.0 and np.isfinite(y).all()
    np.testing.assert_allclose(norm.unnormalize("state", y), data["state"], atol=1e-5)
    d = norm.normalize("depth", data["depth"])
    assert norm.scale["depth"].shape == (1, 1, 1)  # one range per channel, not per pixel
    assert d.min() == pytest.approx(-1, abs=1e-5) and d.max() == pytest.approx(1, abs=1e-5)
    rgb = norm.normalize("rgb", np.array([0, 255], np.uint8).reshape(1, 1, 2, 1).repeat(3, 1))
    assert rgb.dtype == np.float32 and norm.modes["rgb"] == "fixed"
    np.testing.assert_allclose(rgb[0, :, 0, 0], -1)
    np.testing.assert_allclose(rgb[0, :, 1, 0], 1, rtol=1e-6)


def test_gaussian_and_streaming_matches_one_shot():
    data = _data()
    norm = Normalizer.fit({"state": data["state"]}, mode="gaussian")
    y = norm.normalize("state", data["state"])
    np.testing.assert_allclose(y.mean(0), 0, atol=1e-5)
    np.testing.assert_allclose(y[:, [0, 1, 3, 4]].std(0), 1, atol=1e-4)
    stats = RunningStats((5,))
    for block in np.array_split(data["state"], 7):
        stats.update(block)
    one = RunningStats((5,))
    one.update(data["state"])
    for mode in ("limits", "gaussian"):
        np.testing.assert_allclose(stats.affine(mode, 1e-4), one.affine(mode, 1e-4), rtol=1e-6)
    with pytest.raises(ValueError, match="allowed values are limits, gaussian"):
        Normalizer.fit({"state": data["state"]}, mode="minmax")


def test_torch_keeps_dtype_and_device_and_round_trips():
    data = _data()
    norm = Normalizer.fit(data)
    x = torch.from_numpy(data["actions"]).double()
    y = norm.normalize("actions", x)
    assert y.dtype == torch.float64 and y.device == x.device
    np.testing.assert_allclose(y.numpy(), norm.normalize("actions", data["actions"]), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(norm.unnormalize("actions", y), x)
    img = norm.normalize("rgb", torch.from_numpy(data["rgb"][:2]))
    assert img.dtype == torch.float32 and img.shape == (2, 3, 8, 8)
    with pytest.raises(ValueError, match="do not fit input"):
        norm.normalize("actions", torch.zeros(4, 5))


def test_state_dict_and_json_round_trip_and_missing_key():
    norm = Normalizer.fit(_data(), mode="gaussian")
    sd = norm.state_dict()
    assert set(sd) == {f"{k}.{p}" for k in ("state", "actions", "rgb", "depth") for p in ("scale", "offset")}
    again = Normalizer.from_state_dict({k: torch.from_numpy(v) for k, v in sd.items()})
    x = _data(1)["state"]
    np.testing.assert_array_equal(again.normalize("state", x), norm.normalize("state", x))
    from_json = Normalizer.from_json(norm.to_json())
    assert from_json.modes == norm.modes
    for k in norm.keys:
        np.testing.assert_array_equal(from_json.scale[k], norm.scale[k])
    del sd["actions.offset"]
    with pytest.raises(MissingStatError) as err:
        Normalizer.from_state_dict(sd, keys=("state", "actions"))
    assert "missing key 'actions.offset'" in str(err.value) and "\n" not in str(err.value)
    with pytest.raises(MissingStatError, match="no stats for 'force'"):
        norm.normalize("force", np.zeros((2, 4), np.float32))


def test_fit_from_store(filled_store):
    norm = fit_normalizer(filled_store, ["actions", "state", "rgb"], mode="limits")
    n = filled_store.n_steps
    y = norm.normalize("actions", np.asarray(filled_store.array("actions")[:n]))
    assert y.min() == pytest.approx(-1, abs=1e-5) and y.max() == pytest.approx(1, abs=1e-5)
    with pytest.raises(StoreError, match="no modality 'depth'"):
        fit_normalizer(filled_store, ["depth"])
