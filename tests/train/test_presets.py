"""Every YAML preset under configs/ loads into its config class (a typo in a preset is caught here, not mid-run)."""

from __future__ import annotations

from pathlib import Path

import pytest

from dmrl.config_utils import load_yaml, merge, to_dict
from dmrl.train.compare import CompareConfig
from dmrl.train.config import TrainConfig

PRESETS = sorted((Path(__file__).resolve().parents[2] / "configs").glob("*.yaml"))


@pytest.mark.parametrize("path", PRESETS, ids=[p.name for p in PRESETS])
def test_preset_loads(path: Path) -> None:
    cls = CompareConfig if path.name.startswith("compare") else TrainConfig
    data = load_yaml(path)
    cfg = merge(cls(), data)
    assert isinstance(cfg, cls)
    if cls is TrainConfig:  # the types the preset names are the ones built
        for field in ("policy", "algo", "source"):
            if isinstance(data.get(field), dict) and "type" in data[field]:
                assert to_dict(cfg)[field]["type"] == data[field]["type"]


def test_there_are_presets() -> None:
    assert len(PRESETS) >= 4


def test_choice_fields_switch_type_and_keep_same_type_values() -> None:
    cfg = merge(TrainConfig(), {"policy": {"type": "diffusion", "num_inference_steps": 4}})
    assert cfg.policy_type == "diffusion" and cfg.policy.num_inference_steps == 4
    same = merge(cfg, {"policy": {"denoiser": "unet"}})  # no type: the current one, updated
    assert same.policy.num_inference_steps == 4 and same.policy.denoiser == "unet"
    other = merge(cfg, {"policy": "gaussian"})  # a bare name: that type's defaults
    assert other.policy_type == "gaussian" and to_dict(other)["policy"]["type"] == "gaussian"
    with pytest.raises(ValueError, match=r"'policy.type': got 'mlp'; allowed: diffusion, gaussian, vae"):
        merge(cfg, {"policy": {"type": "mlp"}})
    with pytest.raises(ValueError, match="trains a gaussian policy"):
        merge(TrainConfig(), {"algo": {"type": "td3-bc"}})


@pytest.mark.parametrize("path", [p for p in PRESETS if not p.name.startswith("compare")], ids=lambda p: p.name)
def test_a_runs_saved_config_reads_back_as_its_settings(path: Path, tmp_path: Path) -> None:
    """--resume compares config.json with the flags: every preset (multimodal, RL) must read back equal."""
    import json

    from dmrl.train.config import flat
    from dmrl.train.run import saved_settings

    cfg = merge(TrainConfig(), load_yaml(path))
    saved = tmp_path / "config.json"
    saved.write_text(json.dumps(to_dict(cfg)))
    assert saved_settings(saved) == flat(json.loads(json.dumps(to_dict(cfg))))
    old = {**json.loads(saved.read_text()), "policy": "diffusion"}  # written before --policy.type
    saved.write_text(json.dumps(old))
    with pytest.raises(ValueError, match="before --policy.type"):
        saved_settings(saved)
