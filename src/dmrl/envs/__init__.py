"""Environments: the MultiPath MuJoCo tasks (registered with gymnasium) and their scripted experts."""

from __future__ import annotations

import gymnasium as gym

from dmrl.envs.multipath import ACTION_MEANING, MultiPathConfig, MultiPathEnv, TaskState

ENV_IDS = {"dmrl/MultiPathReach-v0": "reach", "dmrl/MultiPathGrasp-v0": "grasp"}


def _register() -> None:
    for env_id, task in ENV_IDS.items():
        if env_id not in gym.registry:
            gym.register(
                env_id,
                entry_point="dmrl.envs.multipath:MultiPathEnv",
                kwargs={"task": task},
                disable_env_checker=True,
            )


def make_env(env_id: str, **overrides) -> MultiPathEnv:
    """Build a MultiPath env by id with config overrides; an unknown id or key is a one-line error."""
    if env_id not in ENV_IDS:
        raise ValueError(f"--env: got {env_id!r}; known environments: {', '.join(ENV_IDS)}")
    known = set(MultiPathConfig.__dataclass_fields__)
    bad = sorted(set(overrides) - known)
    if bad:
        raise ValueError(f"env option(s) {bad} unknown; allowed: {', '.join(sorted(known - {'task'}))}")
    return MultiPathEnv(MultiPathConfig(task=ENV_IDS[env_id], **overrides))


_register()

__all__ = ["ACTION_MEANING", "ENV_IDS", "MultiPathConfig", "MultiPathEnv", "TaskState", "make_env"]
