"""A disk that fills while a training state is written (ENOSPC injected at each of its file writes): the previous
state stays the newest loadable one, no partial directory is left, and the error is one line."""

from __future__ import annotations

import errno
from pathlib import Path

import pytest
import torch

import dmrl.train.engine.state as state_mod
from dmrl.train.engine.distributed import DistInfo
from dmrl.train.engine.state import load_latest_state, save_state, state_dirs

INFO = DistInfo()


def _save(run: Path, step: int) -> Path | None:
    tensors = {"algo": {"w": torch.full((4, 4), float(step))}}
    objects = {"step": step, "opt": {"lr": torch.tensor(0.1 * step)}}
    return save_state(run, step, INFO, tensors, objects)


def _full(*_args, **_kwargs):
    raise OSError(errno.ENOSPC, "No space left on device")


def _full_torch_save(obj, f, *args, **kwargs):
    # What torch.save really raises on a full disk: a RuntimeError whose context is the file's OSError.
    try:
        f.write(b"PK")
        _full()
    except OSError:
        raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 576 vs 534") from None


def _full_safetensors():
    # safetensors' own exception type; its text carries the OS error
    raise Exception("Error while serializing: I/O error: No space left on device (os error 28)")


_write_text = Path.write_text


def _full_meta(path: Path, *args, **kwargs):
    """meta.json is written through Path.write_text: fail only that one."""
    if path.name == "meta.json":
        _full()
    return _write_text(path, *args, **kwargs)


@pytest.mark.parametrize("where", ["safetensors", "trainer.pt", "meta.json", "mkdtemp"])
def test_disk_full_while_saving_keeps_the_previous_state(tmp_path, monkeypatch, where):
    run = tmp_path / "run"
    _save(run, 100)
    with monkeypatch.context() as m:
        if where == "safetensors":  # safetensors reports it as SafetensorError("... os error 28")
            m.setattr(state_mod, "save_file", lambda *a, **k: _full_safetensors())
        elif where == "trainer.pt":
            m.setattr(state_mod.torch, "save", _full_torch_save)
        elif where == "meta.json":
            m.setattr(Path, "write_text", _full_meta)
        else:
            m.setattr(state_mod.tempfile, "mkdtemp", _full)
        with pytest.raises(RuntimeError) as e:
            _save(run, 200)
    assert str(e.value) == (
        f"disk full while writing training state {run / 'state' / 'step_00000200'}: the previous state "
        "step_00000100 is kept; free space, then continue with --resume"
    )
    assert [p.name for p in state_dirs(run)] == ["step_00000100"]
    assert not list((run / "state").glob(".*partial")), "no half-written state is left"
    loaded = load_latest_state(run, INFO, seed=0)
    assert loaded is not None and loaded.step == 100
    assert torch.equal(loaded.tensors["algo"]["w"], torch.full((4, 4), 100.0))
    assert loaded.objects["step"] == 100
    _save(run, 200)  # room again: saving goes on
    assert load_latest_state(run, INFO, seed=0).step == 200


def test_disk_full_on_the_first_state_says_there_is_none(tmp_path, monkeypatch):
    monkeypatch.setattr(state_mod, "save_file", lambda *a, **k: _full_safetensors())
    with pytest.raises(RuntimeError, match="there is no earlier state; free space"):
        _save(tmp_path / "run", 1)
    assert load_latest_state(tmp_path / "run", INFO, seed=0) is None


def test_other_write_errors_are_not_called_a_full_disk(tmp_path, monkeypatch):
    _save(tmp_path / "run", 1)
    monkeypatch.setattr(state_mod, "save_file", lambda *a, **k: (_ for _ in ()).throw(PermissionError(13, "denied")))
    with pytest.raises(PermissionError):
        _save(tmp_path / "run", 2)
    assert [p.name for p in state_dirs(tmp_path / "run")] == ["step_00000001"]
