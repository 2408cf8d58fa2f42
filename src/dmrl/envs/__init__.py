"""Environments: the task registry (name -> factory + task metadata, also registered with gymnasium), the
MultiPath MuJoCo tasks and their scripted experts.

Importing this package is cheap: MuJoCo loads with the first MultiPath env (or attribute) asked for.
"""

from __future__ import annotations

from typing import Any

from dmrl.envs.registry import (
    MULTIPATH_ENVS,
    REGISTRY,
    EnvSpec,
    Expert,
    env_factory,
    env_spec,
    make_env,
    make_expert,
    register_env,
)
from dmrl.types import InfoField

#: The built-in MultiPath tasks: env id -> task name (REGISTRY holds every registered env).
ENV_IDS = MULTIPATH_ENVS
_MULTIPATH = ("ACTION_MEANING", "MultiPathConfig", "MultiPathEnv", "TaskState")


def __getattr__(name: str) -> Any:
    # PEP 562: the MultiPath classes import MuJoCo, so they load when first used, not with the package.
    if name in _MULTIPATH:
        from dmrl.envs import multipath

        return getattr(multipath, name)
    raise AttributeError(f"module 'dmrl.envs' has no attribute {name!r}")


__all__ = [
    "ACTION_MEANING",
    "ENV_IDS",
    "REGISTRY",
    "EnvSpec",
    "Expert",
    "InfoField",
    "MultiPathConfig",
    "MultiPathEnv",
    "TaskState",
    "env_factory",
    "env_spec",
    "make_env",
    "make_expert",
    "register_env",
]
