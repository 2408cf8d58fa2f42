"""OGBench 1.2.2 manipulation tasks (Park et al. ICLR 2025) as single-task dmrl environments, with the `play` oracles.

``ogbench/<env>-play-singletask[-task<k>]-v0`` (env: cube-single, cube-double, scene; task 1-5, default task 2) is
OGBench's single-task environment: ``state`` is its observation (proprio + objects), ``joints`` its first 19 values
(the arm's proprio), the reward ``successes - n`` of the task's n subgoals, the episode ends at success or after
200 / 500 / 750 steps; success is the env's ``success``. Nothing is downloaded: datasets are generated here.

Collecting with the registered expert (:class:`PlayOracle`) follows OGBench's published `play` protocol (its
``data_gen_scripts/generate_manipspace.py`` with the flags of ``commands.sh``): the env switches to OGBench's
data-collection mode, episodes run 1001 steps, the non-Markovian plan oracles act with noise 0.1 (smoothing 0.5)
and a new random target is set whenever one is reached. The stored reward of each step is the *single-task* one,
computed from the state before the action exactly as OGBench relabels its datasets (``relabel_utils``), so a
store holds what ``make_env_and_datasets("<env>-play-singletask-task<k>-v0")`` would load, its ``masks`` included:
each step's info ``terminal`` (the task holds before the action, mask 0) becomes the store's per-step terminal.
"""

from __future__ import annotations

import importlib
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import gymnasium as gym
import numpy as np

PLAY_STEPS = 1001
PLAY_NOISE = 0.1
PLAY_NOISE_SMOOTHING = 0.5
PROPRIO_DIM = 19  # joint pos 6, joint vel 6, effector xyz 3, yaw cos/sin 2, gripper opening 1, gripper contact 1
QPOS_OBJ = 14  # first object joint in qpos (relabel_utils)
QPOS_CUBE = 7
ACTION_MEANING = ("dx", "dy", "dz", "dyaw", "gripper")


@dataclass(frozen=True)
class Suite:
    """One OGBench manipulation environment."""

    module: str
    cls: str
    env_type: str
    max_steps: int
    """Episode length of the single-task env (OGBench's registration)."""
    oracles: tuple[str, ...]
    """Plan oracles the play protocol uses."""


SUITES: dict[str, Suite] = {
    "cube-single": Suite("cube_env", "CubeEnv", "single", 200, ("cube",)),
    "cube-double": Suite("cube_env", "CubeEnv", "double", 500, ("cube",)),
    "scene": Suite("scene_env", "SceneEnv", "scene", 750, ("cube", "button", "drawer", "window")),
}
TASKS = (1, 2, 3, 4, 5)
DEFAULT_TASK = 2  # OGBench's reward_task_id 0


def dataset_names() -> dict[str, tuple[str, int]]:
    """Registered names -> (env, task): OGBench's single-task dataset names under ``ogbench/``."""
    out = {}
    for env in SUITES:
        out[f"ogbench/{env}-play-singletask-v0"] = (env, DEFAULT_TASK)
        for k in TASKS:
            out[f"ogbench/{env}-play-singletask-task{k}-v0"] = (env, k)
    return out


def _manipspace(suite: Suite, **kwargs: Any) -> Any:
    # OGBench builds a float64 Box for its action space on every access; gymnasium warns each time it casts.
    warnings.filterwarnings("ignore", message=r".*Box (low|high)'s precision lowered", module="gymnasium")
    try:
        module = importlib.import_module(f"ogbench.manipspace.envs.{suite.module}")
    except ImportError:  # RuntimeError: the CLI prints it as one line
        raise RuntimeError(
            'ogbench/* envs need OGBench 1.2.2: run `pip install -e ".[suites]"` (or make install)'
        ) from None
    return getattr(module, suite.cls)(env_type=suite.env_type, **kwargs)


def scene_unhealthy(qpos: np.ndarray) -> bool:
    """OGBench's health check of a scene play step: the cube went too far right, or too far left outside the
    drawer (the published script discards and redoes such episodes; here they are kept and flagged)."""
    x, y, z = qpos[QPOS_OBJ : QPOS_OBJ + 3]
    return bool(y >= 0.29 or (y <= -0.3 and (z < 0.06 or z > 0.08)))


class OGBenchEnv(gym.Env):
    """One OGBench single-task manipulation env (state observations); see the module docstring."""

    metadata = {"render_modes": ["rgb_array"], "render_fps": 20}
    action_meaning = ACTION_MEANING

    def __init__(self, env: str, task: int = DEFAULT_TASK, obs_modes: tuple[str, ...] = ("state",)) -> None:
        if env not in SUITES:
            raise ValueError(f"ogbench env: got {env!r}; known: {', '.join(SUITES)}")
        if task not in TASKS:
            raise ValueError(f"ogbench task: got {task!r}; allowed: {', '.join(map(str, TASKS))}")
        bad = [m for m in obs_modes if m not in ("joints", "state")]
        if bad or not obs_modes:
            raise ValueError(f"obs_modes: ogbench/{env} emits joints and state (state observations); got {bad}")
        self.suite_name, self.suite, self.task, self.obs_modes = env, SUITES[env], int(task), tuple(obs_modes)
        self.task_env = _manipspace(
            self.suite, permute_blocks=False, success_timing="pre", reward_task_id=self.task, terminate_at_goal=True
        )
        self.play_env: Any = None  # OGBench's data-collection env, built by use_play_mode()
        self._targets: dict[str, Any] | None = None  # the task's goal (task_successes)
        self.max_steps = self.suite.max_steps
        ob, _ = self.task_env.reset(seed=0)
        self.ob_dim = int(np.asarray(ob).shape[0])
        self.action_space = gym.spaces.Box(-1.0, 1.0, shape=(5,), dtype=np.float32)
        spaces = {
            "joints": gym.spaces.Box(-np.inf, np.inf, shape=(PROPRIO_DIM,), dtype=np.float32),
            "state": gym.spaces.Box(-np.inf, np.inf, shape=(self.ob_dim,), dtype=np.float32),
        }
        self.observation_space = gym.spaces.Dict({k: spaces[k] for k in self.obs_modes})
        self.raw_ob, self.raw_info = np.asarray(ob), {}
        self.success, self.t, self.unhealthy = False, 0, False

    @property
    def env_id(self) -> str:
        """Its registered name (the task's own one; the default task registers under a second name too)."""
        return f"ogbench/{self.suite_name}-play-singletask-task{self.task}-v0"

    @property
    def active(self) -> Any:
        """The OGBench env stepped now: the data-collection one in play mode, else the single-task one."""
        return self.play_env if self.play_env is not None else self.task_env

    def use_play_mode(self) -> None:
        """Switch to OGBench's data-collection mode (the play oracle does this): 1001-step episodes without
        termination, random targets; rewards and success still those of this env's task."""
        if self.play_env is None:
            self.play_env = _manipspace(self.suite, terminate_at_goal=False, mode="data_collection")
            self.max_steps = PLAY_STEPS

    def _task_targets(self) -> dict[str, Any]:
        # The task's goal, read as relabel_utils reads it: from the single-task env after a reset.
        e = self.task_env
        e.reset(seed=0)
        out = {"cubes": e._data.mocap_pos.copy()}
        if self.suite_name == "scene":
            out |= {"buttons": e._target_button_states.copy(), "drawer": e._target_drawer_pos}
            out |= {"window": e._target_window_pos}
        return out

    def task_successes(self, qpos: np.ndarray, button_states: np.ndarray | None = None) -> np.ndarray:
        """(n,) bool: which subgoals of the task ``qpos`` (and scene's button states) meets, as OGBench's
        ``relabel_dataset`` computes them (cubes within 4 cm, buttons equal, drawer / window within 4 cm)."""
        if self._targets is None:
            self._targets = self._task_targets()
        tg, n_cubes = self._targets, self.task_env._num_cubes
        cubes = np.stack([qpos[QPOS_OBJ + i * QPOS_CUBE : QPOS_OBJ + i * QPOS_CUBE + 3] for i in range(n_cubes)])
        parts = [np.linalg.norm(tg["cubes"] - cubes, axis=-1) <= 0.04]
        if self.suite_name == "scene":
            drawer = QPOS_OBJ + n_cubes * QPOS_CUBE + self.task_env._num_buttons
            parts += [np.asarray(button_states) == tg["buttons"]]
            parts += [[abs(qpos[drawer] - tg["drawer"]) <= 0.04, abs(qpos[drawer + 1] - tg["window"]) <= 0.04]]
        return np.concatenate([np.asarray(p, dtype=bool).ravel() for p in parts])

    def reset(self, *, seed: int | None = None, options: Mapping[str, Any] | None = None):
        super().reset(seed=seed)
        unknown = set(options or {}) - {"reset_mask"}
        if unknown:
            raise ValueError(f"reset options: unknown keys {sorted(unknown)}; ogbench envs take none")
        ob, info = self.active.reset(seed=seed)
        self.raw_ob, self.raw_info = np.asarray(ob), info
        self.success, self.t, self.unhealthy = False, 0, False
        return self._obs(), {"is_success": False, "success_now": False}

    def step(self, action):
        a = np.clip(np.asarray(action, dtype=np.float64).reshape(5), -1.0, 1.0)
        ob, reward, terminated, _, info = self.active.step(a)
        self.raw_ob, self.raw_info = np.asarray(ob), info
        self.t += 1
        if self.play_env is not None:  # the task's reward of the state before the action ('pre', as relabelled)
            ok = self.task_successes(info["prev_qpos"], info.get("prev_button_states"))
            now, reward, terminated = bool(ok.all()), float(ok.sum() - ok.size), False
        else:
            now = bool(info["success"])
        self.success = self.success or now
        truncated = (not terminated) and self.t >= self.max_steps
        # terminal: the task holds before the action, OGBench's mask 0 (relabel_utils): the single-task env ends
        # the episode here, the play recording goes on; dmrl collect keeps it as the store's per-step terminal.
        out = {"is_success": self.success, "success_now": now, "terminal": now}
        if self.play_env is not None:  # the oracle's current (random) target reached, before the action
            out["target_reached"] = bool(info["success"])
            if self.suite_name == "scene":
                self.unhealthy = self.unhealthy or scene_unhealthy(info["prev_qpos"])
                out["unhealthy"] = float(self.unhealthy)
        return self._obs(), float(reward), bool(terminated), truncated, out

    def _obs(self) -> dict[str, np.ndarray]:
        ob = self.raw_ob.astype(np.float32)
        obs = {"joints": ob[:PROPRIO_DIM].copy(), "state": ob}
        return {k: obs[k] for k in self.obs_modes}

    def render(self) -> np.ndarray:
        """(H, W, 3) uint8 frame of OGBench's own front camera."""
        return np.asarray(self.active.render())

    def close(self) -> None:
        for e in (self.task_env, self.play_env):
            if e is not None:
                e.close()


class PlayOracle:
    """OGBench's `play` data: its plan oracles with noise 0.1, a new random target whenever one is reached.

    Puts the env into play mode when built. The oracles draw from numpy's global generator; their draws come
    from a generator seeded by the episode seed, swapped in around each call, so an episode is a function of its
    seed and the caller's global stream is untouched.
    """

    def __init__(self, env: gym.Env, noise_std: float = PLAY_NOISE) -> None:
        from ogbench.manipspace.oracles.plan import button_plan, cube_plan, drawer_plan, window_plan

        self.env: OGBenchEnv = env.unwrapped  # type: ignore[assignment]
        self.env.use_play_mode()
        kinds = {
            "cube": cube_plan.CubePlanOracle,
            "button": button_plan.ButtonPlanOracle,
            "drawer": drawer_plan.DrawerPlanOracle,
            "window": window_plan.WindowPlanOracle,
        }
        kw = {"noise": float(noise_std), "noise_smoothing": PLAY_NOISE_SMOOTHING}
        self.agents = {k: kinds[k](env=self.env.play_env, **kw) for k in self.env.suite.oracles}
        self.agent: Any = None
        self._state = np.random.RandomState(0).get_state()
        self.p_stack = 0.0

    def _draws(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        outer = np.random.get_state()
        np.random.set_state(self._state)
        try:
            return fn(*args, **kwargs)
        finally:
            self._state = np.random.get_state()
            np.random.set_state(outer)

    def reset(self, seed: int) -> None:
        rng = np.random.RandomState(np.random.SeedSequence([int(seed), 2]).generate_state(1)[0])
        self._state = rng.get_state()
        name = self.env.suite_name
        # Stacking probability per episode, as the published script draws it.
        self.p_stack = 0.0 if name == "cube-single" else (rng.uniform(0.0, 0.25) if name == "cube-double" else 0.5)
        self._state = rng.get_state()
        self.agent = self.agents[self.env.raw_info["privileged/target_task"]]
        self._draws(self.agent.reset, self.env.raw_ob, self.env.raw_info)

    def act(self, obs: Mapping[str, Any]) -> np.ndarray:
        play = self.env.play_env
        if self.agent.done:  # the target is reached: a new one, and the oracle for its kind
            ob, info = self._draws(play.set_new_target, p_stack=self.p_stack)
            self.agent = self.agents[info["privileged/target_task"]]
            self._draws(self.agent.reset, ob, info)
        action = self._draws(self.agent.select_action, self.env.raw_ob, self.env.raw_info)
        return np.clip(np.asarray(action, dtype=np.float32), -1.0, 1.0)


def make_ogbench_env(env: str, task: int, obs_modes: tuple[str, ...] = ("state",)) -> OGBenchEnv:
    """Registry factory: ``ogbench/<env>-play-singletask[-task<k>]-v0`` -> :class:`OGBenchEnv`."""
    return OGBenchEnv(env, task, obs_modes=obs_modes)
