"""The env registry: `import dmrl` registers the MultiPath tasks with gymnasium, cheaply; metadata and errors."""

from __future__ import annotations

import dataclasses
import subprocess
import sys

import pytest

from dmrl.envs import REGISTRY, env_spec, make_env, register_env
from dmrl.envs.registry import MULTIPATH_OPTIONS


def test_import_dmrl_registers_with_gymnasium_without_mujoco_or_torch():
    code = (
        "import sys, dmrl, gymnasium\n"
        "assert 'mujoco' not in sys.modules and 'torch' not in sys.modules, 'import dmrl loaded mujoco/torch'\n"
        "env = gymnasium.make('dmrl/MultiPathGrasp-v0', obs_modes=('state',))\n"
        "print(env.reset(seed=0)[0]['state'].shape)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().startswith("(")


def test_multipath_metadata_matches_its_config():
    from dmrl.envs import MultiPathConfig

    fields = {f.name for f in dataclasses.fields(MultiPathConfig)} - {"task", "obs_modes"}
    assert set(MULTIPATH_OPTIONS) == fields
    spec = env_spec("dmrl/MultiPathGrasp-v0")
    assert set(spec.episode_info) == {"route", "target"} and spec.expert is not None


def test_errors_are_one_line():
    with pytest.raises(ValueError, match="known environments") as e:
        env_spec("dmrl/Nope-v0")
    assert "\n" not in str(e.value)
    with pytest.raises(ValueError, match=r"env option\(s\) \['colour'\] unknown"):
        make_env("dmrl/MultiPathReach-v0", colour="red")
    with pytest.raises(ValueError, match="unknown metadata"):
        register_env("x/Y-v0", "m:f", epsiode_info={})
    with pytest.raises(ValueError, match="already registered"):
        register_env("dmrl/MultiPathGrasp-v0", "m:f")
    assert "x/Y-v0" not in REGISTRY
