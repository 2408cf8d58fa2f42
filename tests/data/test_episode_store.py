"""EpisodeStore: round trip, meta columns, append-mode reopen, refusals and one-line StoreErrors."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
from synthetic_episodes import OBS_SPEC, assert_episode_equal, create_store, make_episode

from dmrl.data import EpisodeStore, StoreError, StoreExistsError


def test_round_trip_and_meta(filled_store, store_path):
    eps = [make_episode(s) for s in range(4)]
    store = EpisodeStore.open(store_path)
    assert store.n_episodes == 4 and store.n_steps == sum(e.length for e in eps)
    for i, ep in enumerate(eps):
        assert_episode_equal(store.episode(i), ep)
    assert_episode_equal(store.episode(-1), eps[-1])
    np.testing.assert_array_equal(store.episode_ends, np.cumsum([e.length for e in eps]))
    assert store.episode_ends.dtype == np.int64
    assert store.episode_slice(1) == slice(eps[0].length, eps[0].length + eps[1].length)
    assert store.routes() == [e.route for e in eps]
    assert store.instructions() == [e.instruction for e in eps]
    assert store.targets() == [e.target for e in eps]
    np.testing.assert_array_equal(store.success, [e.success for e in eps])
    np.testing.assert_allclose(store.returns, [e.episode_return for e in eps], rtol=1e-6)
    np.testing.assert_array_equal(store.seeds, range(4))
    np.testing.assert_array_equal(store.terminated, [e.terminated for e in eps])
    np.testing.assert_array_equal(store.truncated, [e.truncated for e in eps])
    assert store.meta("route").dtype == np.int8
    attrs = store.attrs
    assert attrs["dmrl_format_version"] == 1 and attrs["env_id"] == "dmrl/Test-v0"
    assert attrs["obs_spec"] == OBS_SPEC and attrs["expert"] == "scripted"
    assert attrs["obs_modes"] == ["rgb", "instruction", "state"] and attrs["action_meaning"] == [
        "dx",
        "dy",
        "grip",
    ]
    assert store.array("rgb").shape == (store.n_steps, 3, 8, 8)
    summary = store.summary()
    assert summary["episodes"] == 4 and summary["steps"] == store.n_steps
    assert summary["routes"] == {"left": 1, "right": 1, "none": 2}
    assert summary["success_rate"] == pytest.approx(0.75)
    assert summary["mean_length"] == pytest.approx(store.n_steps / 4)
    with pytest.raises(IndexError):
        store.episode(4)


def test_reopen_append_mode_and_append_more(filled_store, store_path):
    store = EpisodeStore.open(store_path, mode="a")
    store.append(make_episode(10))
    store = EpisodeStore.open(store_path)
    assert store.n_episodes == 5
    assert_episode_equal(store.episode(4), make_episode(10))
    assert_episode_equal(store.episode(0), make_episode(0))
    with pytest.raises(StoreError, match="read-only"):
        store.append(make_episode(11))


def test_append_validates_against_spec(filled_store):
    ep = make_episode(1)
    del ep.obs["state"]
    with pytest.raises(ValueError, match=r"Episode\.obs\['state'\]: missing"):
        filled_store.append(ep)
    ep = make_episode(1)
    ep.obs["rgb"] = ep.obs["rgb"].astype(np.float32)
    with pytest.raises(ValueError, match=r"Episode\.obs\['rgb'\]: got float32"):
        filled_store.append(ep)
    ep = make_episode(1)
    ep.final_obs["state"] = np.zeros(4, np.float32)
    with pytest.raises(ValueError, match=r"final_obs\['state'\]"):
        filled_store.append(ep)
    assert filled_store.n_episodes == 4


def test_create_refuses_existing_path(filled_store, store_path, tmp_path):
    with pytest.raises(StoreExistsError) as err:
        create_store(store_path)
    msg = str(err.value)
    assert str(store_path) in msg and "--overwrite" in msg and "--out" in msg and "\n" not in msg
    assert create_store(store_path, overwrite=True).n_episodes == 0
    precious = tmp_path / "precious"
    precious.mkdir()
    (precious / "thesis.tex").write_text("x")
    with pytest.raises(StoreExistsError, match="refusing to delete"):
        create_store(precious, overwrite=True)
    assert (precious / "thesis.tex").exists()


def _one_line_error(path, fragment):
    with pytest.raises(StoreError) as err:
        EpisodeStore.open(path)
    msg = str(err.value)
    assert str(path) in msg and fragment in msg and "\n" not in msg, msg


def test_open_errors_name_path_and_key(filled_store, store_path, tmp_path):
    _one_line_error(tmp_path / "nope.zarr", "does not exist")
    (tmp_path / "plain").mkdir()
    _one_line_error(tmp_path / "plain", "missing 'zarr.json'")
    broken = tmp_path / "broken.zarr"
    shutil.copytree(store_path, broken)
    shutil.rmtree(broken / "data" / "actions")
    _one_line_error(broken, "missing array 'data/actions'")
    shutil.copytree(store_path, broken, dirs_exist_ok=True)
    (broken / "meta" / "episode_ends" / "zarr.json").write_text("{not json")
    _one_line_error(broken, "corrupt metadata for 'meta/episode_ends'")
    (broken / "zarr.json").write_text("{not json")
    _one_line_error(broken, "corrupt 'zarr.json'")
    doc = json.loads((store_path / "zarr.json").read_text())
    del doc["attributes"]["obs_spec"]
    (broken / "zarr.json").write_text(json.dumps(doc))
    _one_line_error(broken, "missing attribute 'obs_spec'")


def test_missing_modality_error_lists_what_the_store_has(filled_store, store_path):
    with pytest.raises(StoreError) as err:
        filled_store.array("depth")
    msg = str(err.value)
    assert str(store_path) in msg and "'depth'" in msg and "store has: rgb, state" in msg
    assert "--obs-modes including depth" in msg


def test_store_without_instruction_or_images(tmp_path):
    store = EpisodeStore.create(
        tmp_path / "s.zarr",
        env_id="x",
        obs_modes=("state",),
        action_meaning=["a", "b", "c"],
        obs_spec={"state": ((5,), "float32")},
        action_dim=3,
    )
    ep = make_episode(2)
    del ep.obs["rgb"], ep.final_obs["rgb"]
    store.append(ep)
    assert store.episode(0).instruction == ep.instruction
    with pytest.raises(ValueError, match="obs_spec keys"):
        EpisodeStore.create(
            tmp_path / "t.zarr",
            env_id="x",
            obs_modes=("rgb",),
            action_meaning=["a"],
            obs_spec={},
            action_dim=1,
        )


def test_store_from_before_task_metadata_reads_as_before(filled_store, store_path):
    # A store written before the episode_info attribute existed: MultiPath's route and target columns.
    import zarr

    expected = [filled_store.episode(i) for i in range(filled_store.n_episodes)]
    del zarr.open_group(str(store_path), mode="r+").attrs["episode_info"]
    old = EpisodeStore.open(store_path, "a")
    assert set(old.episode_info) == {"route", "target"} and old.meta("route").dtype == np.int8
    for i, ep in enumerate(expected):
        assert_episode_equal(old.episode(i), ep)
    assert old.summary()["routes"] == filled_store.summary()["routes"]
    old.append(make_episode(9))
    assert EpisodeStore.open(store_path).routes()[-1] == make_episode(9).route


def test_task_info_is_the_tasks_own(store_path):
    from dmrl.types import InfoField

    store = create_store(store_path, episode_info={"bin": InfoField(), "side": InfoField(categories=("a", "b"))})
    ep = make_episode(1)
    ep.task_info = {"bin": "blue", "side": "b"}
    store.append(ep)
    back = EpisodeStore.open(store_path).episode(0)
    assert back.task_info == {"bin": "blue", "side": "b"} and back.route is None
    assert "routes" not in store.summary() and store.task_values("side") == ["b"]
    with pytest.raises(StoreError, match="no per-episode 'route'"):
        store.routes()
    ep.task_info = {"bin": "blue"}
    with pytest.raises(ValueError, match="task_info: got keys"):
        store.append(ep)
    ep.task_info = {"bin": "blue", "side": "c"}
    with pytest.raises(ValueError, match=r"task_info\['side'\]"):
        store.append(ep)
    empty = create_store(store_path.with_name("none.zarr"), episode_info={})
    plain = make_episode(2)
    plain.task_info = {}
    empty.append(plain)
    assert EpisodeStore.open(empty.path).episode(0).task_info == {}


def test_overwrite_with_bad_spec_keeps_the_old_store(filled_store, store_path):
    bad = {**OBS_SPEC, "state": (OBS_SPEC["state"][0], "float33")}
    with pytest.raises(ValueError, match=r"obs_spec\['state'\]: dtype 'float33'"):
        create_store(store_path, obs_spec=bad, overwrite=True)
    assert EpisodeStore.open(store_path).n_episodes == 4  # checked before the old store was deleted
