"""Policy checkpoints: format number and migrations, one-line errors for newer formats, loading needs only policies."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import dmrl
from dmrl.models.proprio import LowDimEncoderConfig
from dmrl.policies import ChunkConfig, GaussianPolicyConfig, build_policy
from dmrl.policies import checkpoint as ckpt
from dmrl.policies.checkpoint import FORMAT, load_policy, save_policy, upgrade_config

GOLDEN = Path(__file__).resolve().parents[1] / "artifacts" / "golden_gaussian"


def _saved(tmp_path: Path) -> Path:
    chunk = ChunkConfig(horizon=8, n_action_steps=4, encoder=LowDimEncoderConfig(width=16, depth=1))
    policy = build_policy("gaussian", chunk, GaussianPolicyConfig(hidden=16, depth=1), {"state": 5}, 3)
    return save_policy(tmp_path / "ckpt", policy, {"note": "x"})


def _set_format(directory: Path, **fields) -> None:
    path = directory / "config.json"
    path.write_text(json.dumps(json.loads(path.read_text()) | fields))


def test_save_writes_the_format_and_the_dmrl_version(tmp_path):
    cfg = json.loads((_saved(tmp_path) / "config.json").read_text())
    assert cfg["format"] == FORMAT == 2 and cfg["dmrl"] == dmrl.__version__
    policy, meta = load_policy(tmp_path / "ckpt")
    assert policy.name == "gaussian" and meta == {"note": "x"} and not policy.training


def test_a_newer_format_is_a_one_line_error_naming_writer_and_reader(tmp_path):
    directory = _saved(tmp_path)
    _set_format(directory, format=FORMAT + 1, dmrl="9.9.9")
    with pytest.raises(ValueError, match=rf"format {FORMAT + 1}, written by dmrl 9\.9\.9; this dmrl .* reads") as e:
        load_policy(directory)
    assert "\n" not in str(e.value) and "upgrade dmrl" in str(e.value)
    _set_format(directory, format="one")
    with pytest.raises(ValueError, match="no valid format number"):
        load_policy(directory)


def test_older_formats_are_migrated_in_turn(tmp_path, monkeypatch):
    # Pretend this dmrl writes format FORMAT + 2 and today's checkpoints are older: both migrations run, in order.
    n = FORMAT

    def first(cfg):
        cfg["meta"]["seen"] = [n]
        return cfg

    def second(cfg):
        assert cfg["format"] == n + 1
        cfg["meta"]["seen"].append(n + 1)
        return cfg

    directory = _saved(tmp_path)
    monkeypatch.setattr(ckpt, "FORMAT", n + 2)
    monkeypatch.setattr(ckpt, "MIGRATIONS", {n: first, n + 1: second})
    policy, meta = load_policy(directory)
    assert meta["seen"] == [n, n + 1] and policy.name == "gaussian"
    raw = json.loads((directory / "config.json").read_text())
    assert upgrade_config(raw)["format"] == n + 2 and raw["format"] == n, "the caller's dict is left as read"
    monkeypatch.setattr(ckpt, "MIGRATIONS", {n: first})
    with pytest.raises(ValueError, match=f"format {n + 1} has no migration to {n + 2}"):
        load_policy(directory)


def test_golden_format_1_has_no_version_field_and_still_loads():
    assert "dmrl" not in json.loads((GOLDEN / "config.json").read_text())
    policy, _ = load_policy(GOLDEN)
    assert policy.predict_chunk({"state": torch.zeros(1, 2, 5)}).shape == (1, 16, 3)


def test_loading_a_policy_imports_no_algorithm_engine_or_env():
    # Measured against a bare ``import dmrl`` (which registers the env names with gymnasium, nothing more).
    code = (
        "import sys, dmrl; before = set(sys.modules); from dmrl.policies.checkpoint import load_policy; "
        f"load_policy({str(GOLDEN)!r}); "
        "print(sorted(m for m in set(sys.modules) - before if m.startswith(('dmrl.algos', 'dmrl.train', 'dmrl.envs',"
        " 'dmrl.config')) and m != 'dmrl.config_utils'))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
