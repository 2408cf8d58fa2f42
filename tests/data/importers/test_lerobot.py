"""LeRobotDataset v3 -> episode store -> LeRobotDataset v3: frames within codec tolerance, actions exact; mappings
by flags and YAML; resume; one-line errors for bad input."""

from __future__ import annotations

import json
from pathlib import Path

import av
import numpy as np
import pyarrow.parquet as pq
import pytest

from dmrl.cli import main
from dmrl.data import EpisodeStore

CAMS = ("observation.images.front", "observation.images.wrist")
#: libsvtav1 at crf 30 (lerobot's default) on smooth 32 x 32 images: mean error of a few levels.
MEAN_TOL = 4.0


def _rgb_error(store_rgb: np.ndarray, frames_hwc: np.ndarray) -> float:
    return float(np.abs(store_rgb.astype(np.int16) - frames_hwc.transpose(0, 3, 1, 2).astype(np.int16)).mean())


@pytest.fixture(scope="module")
def imported(lerobot_ds, tmp_path_factory) -> Path:
    root, _ = lerobot_ds
    out = tmp_path_factory.mktemp("imp") / "so100.zarr"
    assert main(["data", "import", str(root), "--out", str(out)]) == 0
    return out


def test_import_maps_cameras_state_actions_tasks_and_episode_ends(lerobot_ds, imported):
    _, truth = lerobot_ds
    store = EpisodeStore.open(imported)
    assert store.n_episodes == 3 and store.lengths.tolist() == [7, 9, 6]
    assert store.obs_modes == ("rgb", "joints", "instruction")
    assert store.obs_spec == {"rgb": ((6, 32, 32), "uint8"), "joints": ((4,), "float32")}
    assert store.attrs["action_meaning"] == ["shoulder", "elbow", "gripper"]
    assert store.attrs["env_id"] == "lerobot:so100_pick"
    src = store.attrs["import"]
    assert src["format"] == "lerobot" and src["fps"] == 10 and src["mapping"]["rgb"] == list(CAMS)
    all_actions = np.concatenate([truth[e]["action"] for e in range(3)])
    assert np.allclose(store.attrs["action_range"]["low"], all_actions.min(0))
    assert np.allclose(store.attrs["action_range"]["high"], all_actions.max(0))
    for e in range(3):
        ep = store.episode(e)
        assert np.array_equal(ep.actions, truth[e]["action"])  # exact, in the robot's units (up to 6)
        assert np.array_equal(ep.obs["joints"], truth[e]["state"])
        assert np.array_equal(ep.rewards, truth[e]["reward"])
        for i, cam in enumerate(CAMS):  # cameras stacked along channels, in mapping order
            assert _rgb_error(ep.obs["rgb"][:, 3 * i : 3 * i + 3], truth[e][cam]) < MEAN_TOL
        assert ep.instruction == ("pick the red cube" if e % 2 == 0 else "open the drawer")
        assert ep.terminated == (e % 2 == 0) and ep.truncated == (e % 2 == 1)
        assert ep.seed == e and np.array_equal(ep.final_obs["joints"], ep.obs["joints"][-1])
    assert store.episode(0).actions.max() > 1.0  # the data really is outside [-1, 1]


def test_export_round_trip_same_actions_frames_within_codec_tolerance(lerobot_ds, imported, tmp_path):
    _, truth = lerobot_ds
    out = tmp_path / "exported"
    assert main(["data", "export", str(imported), "--out", str(out)]) == 0
    assert not (tmp_path / "exported.partial").exists()
    info = json.loads((out / "meta/info.json").read_text())
    assert info["codebase_version"] == "v3.0" and info["fps"] == 10 and info["total_frames"] == 22
    assert info["features"]["action"]["names"] == ["shoulder", "elbow", "gripper"]
    assert info["features"][CAMS[0]]["dtype"] == "video" and info["features"][CAMS[0]]["shape"] == [32, 32, 3]
    # read the export back without dmrl: parquet for actions, PyAV for frames at from_timestamp + timestamp
    data = pq.read_table(out / "data/chunk-000/file-000.parquet")
    eps = pq.read_table(out / "meta/episodes/chunk-000/file-000.parquet").to_pylist()
    all_actions = np.asarray(data.column("action").to_pylist(), np.float32)
    assert np.array_equal(all_actions, np.concatenate([truth[e]["action"] for e in range(3)]))
    assert [r["tasks"] for r in eps] == [["pick the red cube"], ["open the drawer"], ["pick the red cube"]]
    with av.open(str(out / f"videos/{CAMS[1]}/chunk-000/file-000.mp4")) as c:
        decoded = {round(f.time, 3): f.to_ndarray(format="rgb24") for f in c.decode(c.streams.video[0])}
    for e, row in enumerate(eps):
        start = row[f"videos/{CAMS[1]}/from_timestamp"]
        frames = np.stack([decoded[round(start + i / 10, 3)] for i in range(row["length"])])
        assert np.abs(frames.astype(np.int16) - truth[e][CAMS[1]]).mean() < 2 * MEAN_TOL  # two encodes
    # ... and through dmrl's importer: the same store again
    again = tmp_path / "again.zarr"
    assert main(["data", "import", str(out), "--out", str(again)]) == 0
    a, b = EpisodeStore.open(imported), EpisodeStore.open(again)
    assert a.obs_spec == b.obs_spec and a.lengths.tolist() == b.lengths.tolist()
    for e in range(3):
        ea, eb = a.episode(e), b.episode(e)
        assert np.array_equal(ea.actions, eb.actions) and np.array_equal(ea.obs["joints"], eb.obs["joints"])
        assert np.abs(ea.obs["rgb"].astype(np.int16) - eb.obs["rgb"]).mean() < MEAN_TOL
        assert (ea.instruction, ea.terminated, ea.rewards.tolist()) == (
            eb.instruction,
            eb.terminated,
            eb.rewards.tolist(),
        )


def test_mapping_by_yaml_and_flags(lerobot_ds, tmp_path):
    root, truth = lerobot_ds
    mapping = tmp_path / "map.yaml"
    mapping.write_text("rgb: observation.images.wrist\njoints: none\nstate: [observation.state]\nreward: none\n")
    out = tmp_path / "m.zarr"
    argv = ["data", "import", str(root), "--out", str(out), "--mapping", str(mapping), "--image-size", "16"]
    assert main([*argv, "--instruction", "do it", "--episodes", "2", "--env-id", "my/robot"]) == 0
    store = EpisodeStore.open(out)
    assert store.obs_spec == {"rgb": ((3, 16, 16), "uint8"), "state": ((4,), "float32")}
    assert store.n_episodes == 2 and store.instructions() == ["do it", "do it"] and store.attrs["env_id"] == "my/robot"
    assert np.array_equal(store.episode(1).obs["state"], truth[1]["state"]) and store.returns.tolist() == [0, 0]
    # a flag overrides the YAML's key
    out2 = tmp_path / "m2.zarr"
    assert main(["data", "import", str(root), "--out", str(out2), "--mapping", str(mapping), "--rgb", CAMS[0]]) == 0
    assert EpisodeStore.open(out2).attrs["import"]["mapping"]["rgb"] == [CAMS[0]]


def test_resume_continues_after_the_committed_episodes(lerobot_ds, imported, tmp_path):
    root, _ = lerobot_ds
    out = tmp_path / "r.zarr"
    assert main(["data", "import", str(root), "--out", str(out), "--episodes", "1"]) == 0  # as if cut off
    assert main(["data", "import", str(root), "--out", str(out), "--resume"]) == 0
    a, b = EpisodeStore.open(imported), EpisodeStore.open(out)
    assert b.n_episodes == 3 and all(np.array_equal(a.episode(e).actions, b.episode(e).actions) for e in range(3))


def _one_line_error(capsys, argv: list[str], *needles: str) -> None:
    capsys.readouterr()
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and all(n in err[0] for n in needles), err


def test_bad_input_is_one_line(lerobot_ds, imported, tmp_path, capsys):
    root, _ = lerobot_ds
    out = str(tmp_path / "x.zarr")
    imp = ["data", "import", str(root), "--out", out]
    _one_line_error(
        capsys, [*imp, "--joints", "observation.stat"], "--joints", "'observation.stat'", "observation.state"
    )
    _one_line_error(capsys, [*imp, "--rgb", "observation.images.top"], "--rgb", "observation.images.front")
    _one_line_error(capsys, [*imp, "--action", "actions"], "--action", "'actions'", "action")
    _one_line_error(capsys, [*imp, "--rgb", "observation.state"], "--rgb", "not an mp4 video")
    _one_line_error(capsys, [*imp, "--joints", "observation.images.front"], "--joints", "not a vector")
    bad_yaml = tmp_path / "bad.yaml"
    bad_yaml.write_text("camera: x\n")
    _one_line_error(capsys, [*imp, "--mapping", str(bad_yaml)], "unknown key 'camera'", "rgb, joints")
    _one_line_error(capsys, [*imp, "--mapping", str(tmp_path / "nope.yaml")], "--mapping", "no such file")
    _one_line_error(capsys, ["data", "import", str(tmp_path), "--out", out], "neither a LeRobot dataset", "--format")
    _one_line_error(capsys, ["data", "import", str(root), "--out", str(imported)], "already exists", "--overwrite")
    _one_line_error(capsys, [*imp, "--image-size", "3"], "--image-size")
    old = tmp_path / "old"
    (old / "meta").mkdir(parents=True)
    (old / "meta/info.json").write_text(json.dumps({"codebase_version": "v2.1", "fps": 30, "features": {}}))
    _one_line_error(capsys, ["data", "import", str(old), "--out", out], "v2.1", "v3")
    # resume into a store of another source / mapping
    _one_line_error(capsys, [*imp[:-1], str(imported), "--resume", "--rgb", CAMS[0]], "--resume", "mapping")
    # export: a store without fps needs --fps; an existing non-dataset --out is never deleted
    assert not (tmp_path / "x.zarr").exists()
    blocker = tmp_path / "notes"
    blocker.mkdir()
    (blocker / "keep.txt").write_text("mine")
    _one_line_error(capsys, ["data", "export", str(imported), "--out", str(blocker), "--overwrite"], "not a LeRobot")
    assert (blocker / "keep.txt").read_text() == "mine"
    _one_line_error(
        capsys, ["data", "export", str(imported), "--out", str(tmp_path / "e"), "--vcodec", "nope"], "--vcodec"
    )
    assert not (tmp_path / "e").exists() and not (tmp_path / "e.partial").exists()
