"""Unusable output paths (--out under a file, in a read-only directory, an impossible name): every command that
writes fails in one line before any work starts, with exit status 2 and nothing created."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from dmrl.cli import main
from dmrl.paths import check_output_path
from state_store import state_store

CHECKPOINT = Path(__file__).parent / "artifacts" / "golden_diffusion"
COMMANDS = ["collect", "train", "eval", "export"]


def _argv(command: str, parent: Path, tmp_path: Path) -> tuple[list[str], Path]:
    """The command's argv writing below ``parent``, and the --out it names."""
    if command == "collect":
        out = parent / "d.zarr"
        return ["collect", "--out", str(out), "--episodes", "1", "--workers", "0", "--obs-modes", "state"], out
    if command == "train":
        out = parent / "run"
        dataset = state_store(tmp_path / "data.zarr", episodes=2, steps=20)
        return ["train", "--dataset", str(dataset), "--out", str(out), "--steps", "2"], out
    if command == "eval":
        out = parent / "eval"
        return ["eval", "--checkpoint", str(CHECKPOINT), "--out", str(out), "--episodes", "1", "--envs", "1"], out
    out = parent / "policy.onnx"
    return ["export", "--checkpoint", str(CHECKPOINT), "--out", str(out)], out


def _files(root: Path) -> set[Path]:
    return set(root.rglob("*"))


def _run(argv: list[str], tmp_path: Path, capsys) -> str:
    capsys.readouterr()
    before = _files(tmp_path)
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert _files(tmp_path) == before, "nothing may be created"
    return err[0]


PARAMS = list(COMMANDS)


@pytest.mark.parametrize("command", PARAMS)
def test_out_under_a_file(command, tmp_path, capsys):
    blocker = tmp_path / "a_file"
    blocker.write_text("not a directory")
    argv, out = _argv(command, blocker, tmp_path)
    line = _run(argv, tmp_path, capsys)
    assert line == f"dmrl: error: --out {out}: its parent {blocker} is a file; choose another --out"


def _read_only_dir(tmp_path: Path) -> Path:
    ro = tmp_path / "read_only"
    ro.mkdir()
    ro.chmod(0o500)
    return ro


@pytest.mark.parametrize("command", PARAMS)
def test_out_in_a_read_only_directory(command, tmp_path, capsys):
    ro = _read_only_dir(tmp_path)
    try:
        if os.access(ro, os.W_OK):
            pytest.skip("running as root: a 0o500 directory is still writable")
        argv, out = _argv(command, ro, tmp_path)
        line = _run(argv, tmp_path, capsys)
        assert line == f"dmrl: error: --out {out}: its parent {ro} is not writable; choose another --out"
    finally:
        ro.chmod(0o700)


@pytest.mark.parametrize("command", PARAMS)
def test_out_in_a_directory_the_os_says_is_not_writable(command, tmp_path, capsys, monkeypatch):
    """The read-only case where root can write anywhere: os.access reports the directory as read-only."""
    ro = _read_only_dir(tmp_path)
    ro.chmod(0o700)
    real = os.access
    monkeypatch.setattr(os, "access", lambda p, m, **kw: False if Path(p) == ro else real(p, m, **kw))
    argv, out = _argv(command, ro, tmp_path)
    line = _run(argv, tmp_path, capsys)
    assert line == f"dmrl: error: --out {out}: its parent {ro} is not writable; choose another --out"


def test_check_output_path_cases(tmp_path):
    blocker = tmp_path / "f"
    blocker.write_text("x")
    with pytest.raises(ValueError, match=rf"^--out {blocker}/a/b: its ancestor {blocker} is a file; choose"):
        check_output_path(blocker / "a" / "b")
    with pytest.raises(ValueError, match=rf"^--out {blocker}: is a file, not a directory; choose another --out$"):
        check_output_path(blocker)
    with pytest.raises(ValueError, match=rf"^--out {tmp_path}: is a directory, not a file"):
        check_output_path(tmp_path, directory=False)
    with pytest.raises(ValueError, match="is longer than 255 bytes, so it cannot be created"):
        check_output_path(tmp_path / ("x" * 300) / "run")
    with pytest.raises(ValueError, match=r"^--dataset-out "):
        check_output_path(blocker / "x", "--dataset-out")
    # valid outputs pass and create nothing
    before = _files(tmp_path)
    check_output_path(tmp_path)  # an existing directory (append, resume)
    check_output_path(tmp_path / "new" / "deeper" / "run")  # parents made later
    check_output_path(blocker, directory=False)  # an existing file is overwritten
    check_output_path(tmp_path / "policy.onnx", directory=False)
    check_output_path(Path("relative_run_dir_that_does_not_exist"))
    assert _files(tmp_path) == before
