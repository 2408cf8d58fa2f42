"""Whole training runs through the engine: torchrun data parallelism, exact resume after SIGKILL, bad input."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from dmrl.cli import main
from state_store import state_store

ENV = {**os.environ, "OMP_NUM_THREADS": "1"}


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> Path:
    """8 random episodes of 40 steps: state (5,), 3-D actions (no simulator needed to train)."""
    return state_store(tmp_path_factory.mktemp("engine") / "d.zarr")


def _args(store: Path, out: Path, *extra: str, device: str = "cpu") -> list[str]:
    return [
        "train",
        "--dataset",
        str(store),
        "--out",
        str(out),
        "--source.val-fraction",
        "0",
        "--engine.device",
        device,
        *extra,
    ]


def _weights(run: Path) -> dict[str, torch.Tensor]:
    return load_file(str(run / "checkpoint" / "policy.safetensors"))


def test_torchrun_two_ranks_match_one_process_at_the_same_global_batch(store, tmp_path):
    common = ["--policy.type", "gaussian", "--steps", "6", "--batch-size", "16", "--engine.save-every", "3"]
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", "-m", "dmrl"]
    proc = subprocess.run(
        [*cmd, *_args(store, tmp_path / "ddp", *common)], env=ENV, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    summary = json.loads((tmp_path / "ddp" / "summary.json").read_text())
    assert summary["world_size"] == 2  # and check_replicas found both ranks' parameters identical
    assert main(_args(store, tmp_path / "one", *common)) == 0
    ddp, one = _weights(tmp_path / "ddp"), _weights(tmp_path / "one")
    assert ddp.keys() == one.keys()
    for k in one:
        torch.testing.assert_close(ddp[k], one[k], rtol=1e-4, atol=1e-6, msg=k)
    moved = [
        not torch.equal(v, load_file(str(tmp_path / "one" / "state" / "step_00000003" / "algo.safetensors"))[k])
        for k, v in load_file(str(tmp_path / "one" / "state" / "step_00000006" / "algo.safetensors")).items()
    ]
    assert any(moved)  # the runs trained: the comparison above is not between two untouched inits


def test_sigkill_then_resume_ends_with_the_weights_of_an_uninterrupted_run(store, tmp_path):
    common = [
        "--policy.type", "diffusion", "--steps", "400", "--batch-size", "64", "--engine.save-every", "40",
        "--engine.deterministic", "--policy.denoiser-kwargs", "hidden_dim", "128", "n_blocks", "2",
    ]  # fmt: skip
    killed = tmp_path / "killed"
    proc = subprocess.Popen([sys.executable, "-m", "dmrl", *_args(store, killed, *common)], env=ENV)
    deadline = time.monotonic() + 240
    while not (killed / "state" / "step_00000080").is_dir():
        assert proc.poll() is None, "training ended before it could be killed"
        assert time.monotonic() < deadline
        time.sleep(0.01)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert not (killed / "checkpoint").exists()  # it really died mid-run
    assert main(_args(store, killed, *common, "--resume")) == 0
    assert main(_args(store, tmp_path / "straight", *common)) == 0
    a, b = _weights(killed), _weights(tmp_path / "straight")
    assert all(torch.equal(a[k], b[k]) for k in b)
    steps = [json.loads(x)["step"] for x in (killed / "metrics.jsonl").read_text().splitlines()]
    assert steps == sorted(set(steps)) and steps[-1] == 400  # no step logged twice after the resume
    assert len(list((killed / "state").glob("step_*"))) == 2  # keep_last


def test_bad_engine_input_is_one_line_and_writes_nothing(store, tmp_path, capsys):
    for device, flags, needle in [
        ("tpu", [], "allowed: auto, cpu"),
        ("cpu", ["--engine.precision", "fp8"], "fp32, bf16, fp16"),
        ("cpu", ["--engine.accumulate", "3", "--batch-size", "16"], "divisible by accumulate"),
    ]:
        out = tmp_path / "bad"
        args = _args(store, out, "--steps", "2", *flags, device=device)
        assert main(args) == 2, flags
        err = capsys.readouterr().err.strip()
        assert needle in err and "\n" not in err
        assert not (out / "checkpoint").exists()


def test_resume_refuses_a_different_config_and_a_corrupt_state(store, tmp_path, capsys):
    run = tmp_path / "run"
    common = ["--policy.type", "gaussian", "--steps", "4", "--batch-size", "16", "--engine.save-every", "2"]
    assert main(_args(store, run, *common)) == 0
    before = {p: p.read_bytes() for p in run.rglob("*") if p.is_file()}
    assert main(_args(store, run, "--policy.type", "vae", "--steps", "4", "--batch-size", "16", "--resume")) == 2
    assert "--resume: policy.type is 'vae' but the run" in capsys.readouterr().err
    assert main(_args(store, tmp_path / "none", *common, "--resume")) == 2
    assert "start the run without --resume" in capsys.readouterr().err
    assert main(_args(store, run, *common)) == 2  # neither --resume nor --overwrite
    assert {p: p.read_bytes() for p in run.rglob("*") if p.is_file()} == before  # nothing touched
    newest = sorted((run / "state").glob("step_*"))[-1]
    (newest / "algo.safetensors").write_bytes(b"\x00" * 10)
    assert main(_args(store, run, *common, "--resume")) == 2
    err = capsys.readouterr().err
    assert str(newest) in err and "delete that directory" in err
