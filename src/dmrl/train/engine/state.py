"""Resumable training states: model, EMA, optimizer, LR schedule, loss scaler, every rank's RNGs, step counter.

Layout: ``<run>/state/step_00001000/`` holding ``<name>.safetensors`` per weight set (model, ema), ``trainer.pt``
(optimizer / scheduler / scaler / trainer counters), ``rng.pt`` (one entry per rank) and ``meta.json``, which
is written last. A state is written into a hidden ``.step_*.partial`` directory and renamed into place, so a
crash (SIGKILL included) or a full disk leaves either the previous states or a complete new one; ``keep_last``
complete states are kept (older ones are deleted only after the new one is in place). Everything loads with
``torch.load(weights_only=True)``: no pickled code.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import tempfile
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import load_file, save_file
from torch import Tensor

from dmrl.paths import is_disk_full
from dmrl.train.engine.device import rng_state, set_rng_state
from dmrl.train.engine.distributed import DistInfo, barrier, gather_to_main, scatter_from_main

STATE_DIR = "state"
FORMAT = 1


@dataclass
class TrainingState:
    """A loaded state: ``tensors`` {name: state_dict}, ``objects`` (trainer.pt), this rank's RNG applied already."""

    step: int
    tensors: dict[str, dict[str, Tensor]] = field(default_factory=dict)
    objects: dict[str, Any] = field(default_factory=dict)
    path: Path | None = None


def _portable_rng() -> dict[str, Any]:
    # numpy's state holds an ndarray and numpy scalars; lists and ints keep the file loadable with weights_only.
    s = rng_state()
    name, keys, pos, has_gauss, cached = s["numpy"]
    s["numpy"] = [name, keys.tolist(), int(pos), int(has_gauss), float(cached)]
    s["python"] = list(s["python"][1]), s["python"][0]
    return s


def _apply_rng(s: dict[str, Any]) -> None:
    name, keys, pos, has_gauss, cached = s["numpy"]
    state, version = s["python"]
    set_rng_state(
        {
            **s,
            "numpy": (name, np.asarray(keys, dtype=np.uint32), pos, has_gauss, cached),
            "python": (version, tuple(state), None),
        }
    )


def state_dirs(run_dir: Path) -> list[Path]:
    """Complete training states of a run, oldest first."""
    root = Path(run_dir) / STATE_DIR
    if not root.is_dir():
        return []
    return sorted(p for p in root.glob("step_*") if (p / "meta.json").is_file())


def save_state(
    run_dir: Path,
    step: int,
    info: DistInfo,
    tensors: dict[str, dict[str, Tensor]],
    objects: dict[str, Any],
    keep_last: int = 2,
    extra: Callable[[Path], None] | None = None,
) -> Path | None:
    """Write the state of ``step`` (collective: every rank calls it; rank 0 writes). Returns its dir on rank 0.

    ``extra(dir)`` (rank 0) writes further files into the state directory before it is complete (online training:
    the replay ring), so they are part of the same atomic state."""
    rngs = gather_to_main(_portable_rng(), info)
    final = None
    if info.is_main:
        root = Path(run_dir) / STATE_DIR
        final = root / f"step_{step:08d}"
        tmp = None
        try:
            root.mkdir(parents=True, exist_ok=True)
            tmp = Path(tempfile.mkdtemp(dir=root, prefix=f".{final.name}.", suffix=".partial"))
            for name, sd in tensors.items():
                save_file({k: v.detach().cpu().clone() for k, v in sd.items()}, str(tmp / f"{name}.safetensors"))
            # Through Python file objects: torch.save on a path reports a full disk without its errno.
            with open(tmp / "trainer.pt", "wb") as f:
                torch.save(objects, f)
            with open(tmp / "rng.pt", "wb") as f:
                torch.save({"ranks": rngs}, f)
            if extra is not None:
                extra(tmp)
            meta = {"format": FORMAT, "step": step, "world_size": info.world_size, "tensors": sorted(tensors)}
            (tmp / "meta.json").write_text(json.dumps(meta))  # last: its presence marks the state complete
            if final.exists():  # the same step saved again after a resume: the old copy is equivalent
                shutil.rmtree(final)
            os.replace(tmp, final)
        except Exception as e:
            if not is_disk_full(e):
                raise
            kept = state_dirs(run_dir)
            prev = f"the previous state {kept[-1].name} is kept" if kept else "there is no earlier state"
            raise RuntimeError(
                f"disk full while writing training state {final}: {prev}; free space, then continue with --resume"
            ) from e
        finally:
            if tmp is not None and tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)
        for old in state_dirs(run_dir)[:-keep_last]:
            shutil.rmtree(old)
        for stale in root.glob(".step_*.partial"):  # left by a crash mid-write
            shutil.rmtree(stale, ignore_errors=True)
    barrier(info)
    return final


def load_latest_state(run_dir: Path, info: DistInfo, seed: int) -> TrainingState | None:
    """The newest complete state of ``run_dir`` with this rank's RNGs restored, or None if there is none."""
    dirs = state_dirs(run_dir)
    if not dirs:
        return None
    path = dirs[-1]
    try:
        meta = json.loads((path / "meta.json").read_text())
        if meta.get("format") != FORMAT:
            raise ValueError(f"format {meta.get('format')!r}, expected {FORMAT}")
        tensors = {name: load_file(str(path / f"{name}.safetensors")) for name in meta["tensors"]}
        objects = torch.load(path / "trainer.pt", weights_only=True)
        rngs = torch.load(path / "rng.pt", weights_only=True)["ranks"] if info.is_main else None
    except Exception as e:  # a truncated or foreign file: name it and say how to go on
        msg = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise ValueError(
            f"training state {path} is unreadable ({msg}); delete that directory to resume from the one before"
        ) from None
    mine = scatter_from_main(
        [rngs[r] if r < len(rngs) else None for r in range(info.world_size)] if rngs is not None else None, info
    )
    if mine is None:
        warnings.warn(
            f"resuming a {meta['world_size']}-rank state on {info.world_size} ranks: new ranks reseeded, "
            "the run continues but is not bit-identical to an uninterrupted one",
            stacklevel=2,
        )
        random.seed(seed + info.rank + meta["step"])
        np.random.seed((seed + info.rank + meta["step"]) % 2**32)
        torch.manual_seed(seed + info.rank + meta["step"])
    else:
        _apply_rng(mine)
    return TrainingState(int(meta["step"]), tensors, objects, path)
