"""A loss or gradient that turns NaN in full precision stops the run with one line, before anything is saved."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from dmrl.algos import ALGOS, BC, register_algo
from dmrl.algos.bc import BCConfig
from dmrl.cli import main
from dmrl.train.finite import FiniteWatch, NonFiniteError
from state_store import state_store


@dataclass
class PoisonedConfig(BCConfig):
    """BC's settings (a class of its own: a run's config names its algorithm by its config class)."""


class PoisonedBC(BC):
    """Behaviour cloning whose third update turns the weights and the loss NaN (a diverged run)."""

    def update(self, batch: dict) -> dict:
        logs = super().update(batch)
        if self.n_updates == 3:
            with torch.no_grad():
                next(self.actor.parameters()).fill_(math.nan)
            logs["loss"] = logs["loss"] * math.nan
        return logs


@pytest.fixture
def poisoned():
    with pytest.raises(ValueError, match="already configures another algorithm"):
        register_algo("poisoned-bc", PoisonedBC, BCConfig)
    register_algo("poisoned-bc", PoisonedBC, PoisonedConfig)
    yield
    ALGOS.pop("poisoned-bc")


def test_nan_stops_the_run_and_keeps_the_last_good_state(poisoned, tmp_path: Path, capsys):
    store = state_store(tmp_path / "d.zarr")
    run = tmp_path / "run"
    args = ["--algo.type", "poisoned-bc", "--steps", "6", "--batch-size", "16", "--engine.save-every", "2"]
    argv = ["train", "--dataset", str(store), "--out", str(run), "--source.val-fraction", "0", *args]
    assert main([*argv, "--policy.type", "gaussian", "--engine.device", "cpu"]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith("dmrl: error: step 3: non-finite loss") and "step 2) is kept" in err, err
    assert [p.name for p in (run / "state").iterdir()] == ["step_00000002"]  # step 4's state was not written
    assert not (run / "checkpoint").exists()


def test_watch_reads_tensors_floats_and_arrays_and_is_off_for_fp16():
    import numpy as np

    w = FiniteWatch(enabled=True)
    w.observe(1, {"loss": torch.tensor(0.5), "lr": 1e-3, "td_error": np.ones(4, np.float32)})
    w.check(None)
    w.observe(2, {"loss": torch.tensor(0.5), "td_error": np.array([1.0, np.inf])})
    w.observe(3, {"loss": torch.tensor(float("inf")), "td_error": np.ones(2)})
    with pytest.raises(NonFiniteError, match=r"step 2: non-finite loss \(NaN/inf\)"):
        w.check(None)  # the first bad update (2, by td_error), keys as in the latest logs
    off = FiniteWatch(enabled=False)
    off.observe(1, {"loss": torch.tensor(float("nan"))})
    off.check(None)  # fp16: the loss scaler's business
