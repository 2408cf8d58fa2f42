"""External benchmark suites as registered dmrl environments: Meta-World 3.1.1 and OGBench 1.2.2 (extra ``suites``).

Registering imports neither package: ``metaworld/<task>-v3`` (50 tasks), ``metaworld/mt10`` (MT10's tasks, one per
reset) and
``ogbench/<env>-play-singletask[-task<k>]-v0`` (cube-single, cube-double, scene) are entry-point strings, so
``import dmrl`` stays cheap and works without the extra; building one without its package is a one-line error
saying what to install. See docs/suites.md.
"""

from __future__ import annotations

from typing import Any

from dmrl.envs.suites.metaworld_language import INSTRUCTIONS
from dmrl.envs.suites.ogbench import dataset_names

#: Registered Meta-World names (Meta-World's own task names under metaworld/).
METAWORLD_ENVS: dict[str, str] = {f"metaworld/{t}-v3": f"{t}-v3" for t in INSTRUCTIONS}
#: Meta-World's MT10 (Yu et al. 2019), in its benchmark's order (``metaworld.env_dict.MT10_V3``).
MT10 = (
    "reach-v3",
    "push-v3",
    "pick-place-v3",
    "door-open-v3",
    "drawer-open-v3",
    "drawer-close-v3",
    "button-press-topdown-v3",
    "peg-insert-side-v3",
    "window-open-v3",
    "window-close-v3",
)
#: Registered Meta-World multi-task names (one task per reset, chosen by the seed; metaworld_multitask.py) -> tasks.
METAWORLD_MULTITASK_ENVS: dict[str, tuple[str, ...]] = {"metaworld/mt10": MT10}
#: Registered OGBench names -> (env, task).
OGBENCH_ENVS: dict[str, tuple[str, int]] = dataset_names()


def suite_envs() -> dict[str, dict[str, Any]]:
    """name -> ``register_env`` arguments (factory and metadata) of every suite env; the registry registers them
    (this package does not import it: the registry imports this one)."""
    out: dict[str, dict[str, Any]] = {}
    for name, task in METAWORLD_ENVS.items():
        out[name] = dict(
            factory="dmrl.envs.suites.metaworld:make_metaworld_env",
            kwargs={"task": task},
            obs_modes=("rgb", "depth", "joints", "instruction", "state"),
            # Not image_size: collect would pass its default 64, and 84 is the protocol's size.
            options=("paraphrases", "max_steps"),
            expert="dmrl.envs.suites.metaworld:MetaWorldExpert",
            expert_options=("noise_std",),
            extra={"suite": "metaworld"},
        )
    for name, tasks in METAWORLD_MULTITASK_ENVS.items():
        out[name] = dict(
            factory="dmrl.envs.suites.metaworld_multitask:make_metaworld_multitask_env",
            kwargs={"name": name.split("/", 1)[1]},
            obs_modes=("rgb", "depth", "joints", "instruction", "state"),
            options=("paraphrases", "max_steps"),
            expert="dmrl.envs.suites.metaworld:MetaWorldExpert",
            expert_options=("noise_std",),
            extra={"suite": "metaworld", "tasks": tasks},
        )
    for name, (env, task) in OGBENCH_ENVS.items():
        out[name] = dict(
            factory="dmrl.envs.suites.ogbench:make_ogbench_env",
            kwargs={"env": env, "task": task},
            obs_modes=("joints", "state"),
            options=(),
            # Not noise_std: collect's default 0 would replace the protocol's 0.1.
            expert="dmrl.envs.suites.ogbench:PlayOracle",
            # scene: 1 where OGBench's health check fails (the published script redoes such episodes)
            episode_metrics=("unhealthy",) if env == "scene" else (),
            extra={"suite": "ogbench"},
        )
    return out
