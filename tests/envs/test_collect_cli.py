"""CLI smoke runs of collect/info/demo, one-line errors on bad input, and Ctrl-C keeping completed episodes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from dmrl.cli import main
from dmrl.data import EpisodeStore


def _err_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, f"expected one error line, got {err}"
    return err[0]


def _collect(out, *args: str, episodes: int = 1) -> int:
    """``dmrl collect`` in this process (no worker processes) with extra flags; returns the exit status."""
    return main(["collect", "--out", str(out), "--episodes", str(episodes), "--workers", "0", *args])


def test_collect_info_round_trip(tmp_path, capsys):
    out = tmp_path / "d.zarr"
    assert _collect(out, "--obs-modes", "state,rgb", "instruction", "--image-size", "32", episodes=3) == 0
    store = EpisodeStore.open(out)
    assert store.n_episodes == 3 and set(store.obs_modes) == {"rgb", "instruction", "state"}
    ep = store.episode(1)
    assert ep.obs["rgb"].shape[1:] == (3, 32, 32) and ep.seed == 1 and ep.success
    assert ep.actions.shape[1] == 6 and ep.target in ep.instruction
    assert len(store.attrs["action_meaning"]) == 6
    capsys.readouterr()
    assert main(["info", str(out)]) == 0
    assert '"episodes": 3' in capsys.readouterr().out
    # --append continues the seed sequence
    assert (
        _collect(out, "--append", "--obs-modes", "state", "rgb", "instruction", "--image-size", "32", episodes=2) == 0
    )
    store = EpisodeStore.open(out)
    assert store.n_episodes == 5 and list(store.seeds) == [0, 1, 2, 3, 4]


def test_miss_prob_stores_recovery_episodes(tmp_path):
    """--miss-prob 1: every stored episode starts where the expert noticed its missed grasp and succeeds."""
    out = tmp_path / "d.zarr"
    assert _collect(out, "--obs-modes", "state", "joints", "--miss-prob", "1", episodes=2) == 0
    store = EpisodeStore.open(out)
    assert [info["first_step"] > 0 for info in store.infos()] == [True, True]
    for i in range(2):
        ep = store.episode(i)
        assert ep.success and ep.info == store.infos()[i]
        assert ep.obs["joints"][0, -1] == 1.0 and ep.actions[0, 5] < 0


def test_parallel_workers_match_serial(tmp_path):
    kw = ["--episodes", "4", "--obs-modes", "state", "--seed", "7"]
    assert main(["collect", "--out", str(tmp_path / "a.zarr"), "--workers", "2", *kw]) == 0
    assert main(["collect", "--out", str(tmp_path / "b.zarr"), "--workers", "0", *kw]) == 0
    a, b = EpisodeStore.open(tmp_path / "a.zarr"), EpisodeStore.open(tmp_path / "b.zarr")
    for i in range(4):
        np.testing.assert_array_equal(a.episode(i).actions, b.episode(i).actions)
        np.testing.assert_array_equal(a.episode(i).obs["state"], b.episode(i).obs["state"])


@pytest.mark.parametrize(
    "args, match",
    [
        (["--obs-modes", "lidar"], "obs_modes"),
        (["--env", "dmrl/Nope-v0"], "--env"),
        (["--episodes", "0"], "--episodes"),
        (["--overwrite", "--append"], "exclude"),
        (["--miss-prob", "2"], "--miss-prob"),
        (["--miss-prob", "0.5", "--env", "dmrl/MultiPathReach-v0"], "--miss-prob"),
        (["--miss-prob", "0.5", "--suboptimal"], "--miss-prob"),
    ],
)
def test_bad_flags_are_one_line_errors(tmp_path, capsys, args, match):
    assert _collect(tmp_path / "x.zarr", *args) == 2
    assert match in _err_line(capsys)
    assert not (tmp_path / "x.zarr").exists(), "a failed start must not create anything"


def test_existing_store_is_never_overwritten_silently(tmp_path, capsys):
    out = tmp_path / "d.zarr"
    assert _collect(out, "--obs-modes", "state", episodes=2) == 0
    before = EpisodeStore.open(out).episode(1).actions.copy()
    capsys.readouterr()
    assert _collect(out, "--obs-modes", "state") == 2
    assert str(out) in _err_line(capsys)
    assert _collect(out, "--append", "--obs-modes", "state", "joints") == 2
    assert "--append" in _err_line(capsys)
    store = EpisodeStore.open(out)
    assert store.n_episodes == 2
    np.testing.assert_array_equal(store.episode(1).actions, before)


def test_info_on_missing_and_non_store_paths(tmp_path, capsys):
    assert main(["info", str(tmp_path / "missing.zarr")]) == 2
    assert "missing.zarr" in _err_line(capsys)
    (tmp_path / "junk").mkdir()
    (tmp_path / "junk" / "file.txt").write_text("hello")
    assert main(["info", str(tmp_path / "junk")]) == 2
    assert "junk" in _err_line(capsys)


def test_ctrl_c_keeps_every_completed_episode(tmp_path):
    out = tmp_path / "d.zarr"
    cmd = [
        sys.executable,
        "-m",
        "dmrl",
        "collect",
        "--out",
        str(out),
        "--episodes",
        "500",
        "--workers",
        "1",
        "--obs-modes",
        "state",
        "rgb",
        "--image-size",
        "32",
    ]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env={**os.environ})
    try:
        deadline = time.time() + 60
        while time.time() < deadline:
            time.sleep(0.3)
            try:
                if EpisodeStore.open(out).n_episodes >= 3:
                    break
            except ValueError:
                continue
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == 130, err.decode()[-500:]
    assert "interrupted" in err.decode()
    store = EpisodeStore.open(out)
    assert 3 <= store.n_episodes < 500
    for i in range(store.n_episodes):
        ep = store.episode(i)
        assert ep.success and ep.obs["rgb"].shape[0] == ep.length
    # and the store accepts more episodes afterwards
    assert _collect(out, "--append", "--obs-modes", "state", "rgb", "--image-size", "32") == 0


def test_collect_reward_option_is_stored_and_recorded(tmp_path, capsys):
    """--reward picks the stored rewards and is recorded with the other env options (collect attrs)."""
    out = tmp_path / "d.zarr"
    assert _collect(out, "--obs-modes", "state", "--reward", "sparse", episodes=2) == 0
    store = EpisodeStore.open(out)
    assert store.attrs["collect"]["reward"] == "sparse"
    for i in range(2):
        ep = store.episode(i)
        assert set(np.unique(ep.rewards)) <= {0.0, 1.0} and ep.rewards[-1] == float(ep.success)
    capsys.readouterr()
    assert _collect(tmp_path / "e.zarr", "--reward", "dense") != 0
    assert "reward: got 'dense'; allowed: shaped, sparse, shaped_v1" in _err_line(capsys)
