"""Several Meta-World tasks behind one env (MT10 and custom sets): one language-conditioned policy learns them all.

Each reset runs one task, picked by the reset seed (``tasks[seed % len(tasks)]``, so seeds 0..499 give 50 episodes
of each of MT10's tasks, interleaved) or named by ``options={"task": ...}``. The observation keys and spaces are a
single task's (:class:`~dmrl.envs.suites.metaworld.MetaWorldEnv`: every Meta-World task has the same 4-D action,
4-D proprio and 39-D state), so a policy trained here is evaluated per task on ``metaworld/<task>`` unchanged; the
``instruction`` (a paraphrase of the current task's sentence) is what tells the tasks apart. Each task keeps its own
simulator and renderer, built on first use.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import gymnasium as gym
import numpy as np

from dmrl.envs.suites import MT10
from dmrl.envs.suites.metaworld import ACTION_MEANING, MetaWorldEnv, task_names

#: Registered multi-task names -> their tasks.
MULTITASK_SETS: dict[str, tuple[str, ...]] = {"mt10": MT10}


class MetaWorldMultiTaskEnv(gym.Env):
    """A fixed list of Meta-World tasks; each reset runs one of them (see the module docstring)."""

    metadata = MetaWorldEnv.metadata
    action_meaning = ACTION_MEANING

    def __init__(
        self,
        tasks: tuple[str, ...] | list[str],
        name: str = "custom",
        obs_modes: tuple[str, ...] = ("state",),
        image_size: int = 84,
        max_steps: int = 200,
        paraphrases: str = "train",
        render_mode: str | None = None,
    ) -> None:
        tasks = tuple(tasks)
        if not tasks or len(set(tasks)) != len(tasks):
            raise ValueError(f"tasks: got {list(tasks)}; give one or more distinct Meta-World task names")
        known = task_names()
        bad = [t for t in tasks if t not in known]
        if bad:
            raise ValueError(f"tasks: unknown {bad}; known: {', '.join(known)}")
        self.tasks, self.name = tasks, name
        self._kwargs = dict(
            obs_modes=tuple(obs_modes),
            image_size=image_size,
            max_steps=max_steps,
            paraphrases=paraphrases,
            render_mode=render_mode,
        )
        self.render_mode = render_mode
        self._envs: dict[str, MetaWorldEnv] = {}
        self.current = self._env(tasks[0])  # validates the options once, and gives the spaces
        self.action_space = self.current.action_space
        self.observation_space = self.current.observation_space

    @property
    def env_id(self) -> str:
        """Its name in the env registry (metaworld/<name>)."""
        return f"metaworld/{self.name}"

    @property
    def task(self) -> str:
        """The task of the current episode (what the scripted expert acts for)."""
        return self.current.task

    @property
    def instruction(self) -> str:
        """The current episode's instruction (collect stores it whatever the observation keys)."""
        return self.current.instruction

    @property
    def raw(self) -> Any:
        """The current task's Meta-World env."""
        return self.current.raw

    @property
    def raw_obs(self) -> np.ndarray:
        """The current task's 39-D Meta-World observation."""
        return self.current.raw_obs

    def _env(self, task: str) -> MetaWorldEnv:
        if task not in self._envs:
            self._envs[task] = MetaWorldEnv(task, **self._kwargs)
        return self._envs[task]

    def task_for_seed(self, seed: int) -> str:
        """The task a reset with this seed runs: ``tasks[seed % len(tasks)]``."""
        return self.tasks[int(seed) % len(self.tasks)]

    def reset(self, *, seed: int | None = None, options: Mapping[str, Any] | None = None):
        super().reset(seed=seed)
        options = dict(options or {})
        options.pop("reset_mask", None)  # gymnasium's vector envs pass it through
        task = options.pop("task", None)
        if task is None and seed is not None:
            task = self.task_for_seed(seed)
        elif task is None:
            task = self.tasks[int(self.np_random.integers(len(self.tasks)))]
        elif task not in self.tasks:
            raise ValueError(f"reset options: task {task!r} is not one of {self.env_id}'s: {', '.join(self.tasks)}")
        self.current = self._env(str(task))
        # The task's own generator draws the layout and the paraphrase: same seed, same episode as metaworld/<task>.
        return self.current.reset(seed=seed, options=options)

    def step(self, action):
        return self.current.step(action)

    def render(self) -> np.ndarray:
        """(H, W, 3) uint8 frame of the current task's corner2 camera."""
        return self.current.render()

    def close(self) -> None:
        for env in self._envs.values():
            env.close()
        self._envs.clear()


def make_metaworld_multitask_env(name: str, obs_modes: tuple[str, ...] = ("state",), **options: Any):
    """Registry factory: ``metaworld/<name>`` (e.g. mt10) -> :class:`MetaWorldMultiTaskEnv`."""
    if name not in MULTITASK_SETS:
        raise ValueError(f"metaworld multi-task set: got {name!r}; known: {', '.join(MULTITASK_SETS)}")
    return MetaWorldMultiTaskEnv(MULTITASK_SETS[name], name=name, obs_modes=obs_modes, **options)
