"""robomimic-style HDF5 written here with h5py imports: images to rgb (C, H, W), vector keys concatenated, next_obs
as the final observation, dones as terminated; missing keys are one-line errors."""

from __future__ import annotations

import h5py
import numpy as np
import pytest
from fixtures import write_robomimic

from dmrl.cli import main
from dmrl.data import EpisodeStore


@pytest.fixture(scope="module")
def robomimic(tmp_path_factory):
    path = tmp_path_factory.mktemp("rm") / "lift_ph.hdf5"
    return path, write_robomimic(path)


def test_import_robomimic(robomimic, tmp_path):
    path, truth = robomimic
    out = tmp_path / "lift.zarr"
    argv = ["data", "import", str(path), "--out", str(out), "--state", "object", "robot0_joint_pos"]
    assert main([*argv, "--instruction", "lift the cube"]) == 0
    store = EpisodeStore.open(out)
    assert store.n_episodes == 2 and store.lengths.tolist() == [8, 5]
    assert store.obs_modes == ("rgb", "joints", "instruction", "state")  # canonical order
    assert store.obs_spec == {"rgb": ((3, 16, 16), "uint8"), "joints": ((7,), "float32"), "state": ((17,), "float32")}
    assert store.attrs["env_id"] == "robomimic:Lift" and store.attrs["import"]["format"] == "hdf5"
    for n in range(2):
        ep, t = store.episode(n), truth[n]
        assert np.array_equal(ep.obs["rgb"], t["agentview_image"][:-1].transpose(0, 3, 1, 2))
        assert np.allclose(ep.obs["joints"], t["robot0_joint_pos"][:-1])
        assert np.allclose(ep.obs["state"], np.concatenate([t["object"], t["robot0_joint_pos"]], 1)[:-1])
        assert np.allclose(ep.actions, t["actions"]) and ep.actions.dtype == np.float32
        assert np.array_equal(ep.final_obs["rgb"], t["agentview_image"][-1].transpose(2, 0, 1))  # from next_obs
        assert ep.terminated and ep.success and ep.rewards[-1] == 1 and ep.instruction == "lift the cube"


def test_hdf5_bad_input_is_one_line(robomimic, tmp_path, capsys):
    path, _ = robomimic
    out = str(tmp_path / "x.zarr")
    cases = [
        (["--joints", "robot0_eef_pos"], ["--joints", "'robot0_eef_pos'", "agentview_image, object, robot0_joint_pos"]),
        (["--action", "act"], ["--action", "'act'", "actions"]),
        (["--rgb", "object"], ["--rgb", "not an (H, W, 3) image"]),
    ]
    for extra, needles in cases:
        capsys.readouterr()
        assert main(["data", "import", str(path), "--out", out, *extra]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and all(n in err[0] for n in needles), err
    empty = tmp_path / "empty.h5"
    with h5py.File(empty, "w") as f:
        f.create_group("data")
    capsys.readouterr()
    assert main(["data", "import", str(empty), "--out", out]) == 2
    assert "no demo_N groups" in capsys.readouterr().err
    assert not (tmp_path / "x.zarr").exists()  # nothing written by a refused import
