"""Meta-World 3.1.1 single tasks (Yu et al. CoRL 2019) as dmrl environments, with its scripted policies as experts.

Every reset draws a fresh random layout from the reset seed (as the 3D Diffusion Policy protocol does; Meta-World's
``MT1`` would cycle through 50 fixed layouts instead); the goal is observable in the 39-D state. Observations
(DESIGN.md's keys): ``rgb`` (3,84,84) uint8 and ``depth`` (1,84,84) metres from the ``corner2`` camera, moved
closer to the table as most image-based Meta-World work does; ``joints`` (4,) end-effector xyz and gripper
opening (the agent's proprio, the first 4 values of the state); ``state`` (39,) Meta-World's observation
(privileged: object poses and goal); ``instruction`` a sentence per task. Success: ``info["success"]`` at any step
so far (``info["is_success"]`` latches it), the suite's definition.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from typing import Any

import gymnasium as gym
import numpy as np

from dmrl.envs.language import SPLITS
from dmrl.envs.suites import metaworld_language as language
from dmrl.envs.suites.metaworld_compat import apply_shim

CAMERA = "corner2"
#: corner2 moved closer to the table (pos from Hansen et al. 2022, arXiv 2212.05698, used by TD-MPC2 and LeRobot).
CAMERA_POS = (0.75, 0.075, 0.7)
ACTION_MEANING = ("dx", "dy", "dz", "gripper")
STATE_DIM = 39
JOINTS_DIM = 4


def _import_metaworld() -> Any:
    try:
        import metaworld.env_dict as env_dict
    except ImportError:  # RuntimeError: the CLI prints it as one line
        raise RuntimeError(
            "metaworld/* envs need Meta-World 3.1.1: run `make install` (or `pip install --no-deps metaworld==3.1.1` "
            'after `pip install -e ".[suites]"`)'
        ) from None
    apply_shim()
    return env_dict


def task_names() -> tuple[str, ...]:
    """The 50 Meta-World v3 task names (e.g. button-press-v3), read from the installed package."""
    return tuple(_import_metaworld().ALL_V3_ENVIRONMENTS)


class MetaWorldEnv(gym.Env):
    """One Meta-World task with a fresh layout per reset; see the module docstring for the observation keys."""

    metadata = {"render_modes": ["rgb_array"], "render_fps": 80}
    action_meaning = ACTION_MEANING

    def __init__(
        self,
        task: str,
        obs_modes: tuple[str, ...] = ("state",),
        image_size: int = 84,
        max_steps: int = 200,
        paraphrases: str = "train",
        render_mode: str | None = None,
    ) -> None:
        env_dict = _import_metaworld()
        if task not in env_dict.ALL_V3_ENVIRONMENTS:
            raise ValueError(f"metaworld task: got {task!r}; known: {', '.join(env_dict.ALL_V3_ENVIRONMENTS)}")
        if image_size < 8:
            raise ValueError(f"image_size: got {image_size}; must be >= 8")
        if max_steps < 1:
            raise ValueError(f"max_steps: got {max_steps}; must be >= 1")
        if paraphrases not in SPLITS:
            raise ValueError(f"paraphrases: got {paraphrases!r}; allowed: {', '.join(SPLITS)}")
        self.task, self.obs_modes, self.image_size = task, tuple(obs_modes), int(image_size)
        self.max_steps, self.paraphrases, self.render_mode = int(max_steps), paraphrases, render_mode
        raw = env_dict.ALL_V3_ENVIRONMENTS[task]()
        # What Meta-World's goal-observable constructor does, without its fixed layout: the goal is part of the
        # state, and every reset draws its layout from the env's own seeded generator (not the global numpy one).
        raw._partially_observable = False
        del raw.sawyer_observation_space  # a cached_property that depends on the flag above
        raw._set_task_called = True
        raw._freeze_rand_vec = False
        raw.seeded_rand_vec = True
        raw.max_path_length = self.max_steps
        raw.model.cam_pos[raw.model.camera(CAMERA).id] = CAMERA_POS
        raw.model.vis.quality.offsamples = 0  # no multisampling: software GL pays for every sample
        self.raw = raw
        self.raw_obs = np.zeros(STATE_DIM)
        self.instruction = language.paraphrases(task, "train")[0]
        self.success = False
        self.t = 0
        self._renderer = None
        self.action_space = gym.spaces.Box(-1.0, 1.0, shape=(4,), dtype=np.float32)
        self.observation_space = self._make_obs_space()

    @property
    def env_id(self) -> str:
        """Its name in the env registry (metaworld/<task>)."""
        return f"metaworld/{self.task}"

    def _make_obs_space(self) -> gym.spaces.Dict:
        h = self.image_size
        spaces: dict[str, gym.Space] = {
            "rgb": gym.spaces.Box(0, 255, shape=(3, h, h), dtype=np.uint8),
            "depth": gym.spaces.Box(0.0, np.inf, shape=(1, h, h), dtype=np.float32),
            "joints": gym.spaces.Box(-np.inf, np.inf, shape=(JOINTS_DIM,), dtype=np.float32),
            "instruction": gym.spaces.Text(max_length=128, min_length=1, charset=" abcdefghijklmnopqrstuvwxyz"),
            "state": gym.spaces.Box(-np.inf, np.inf, shape=(STATE_DIM,), dtype=np.float32),
        }
        bad = [m for m in self.obs_modes if m not in spaces]
        if bad:
            raise ValueError(f"obs_modes: metaworld/{self.task} does not emit {bad}; it has {list(spaces)}")
        return gym.spaces.Dict({k: spaces[k] for k in self.obs_modes})

    def reset(self, *, seed: int | None = None, options: Mapping[str, Any] | None = None):
        super().reset(seed=seed)
        options = dict(options or {})
        options.pop("reset_mask", None)  # gymnasium's vector envs pass it through
        unknown = set(options) - {"instruction"}
        if unknown:
            raise ValueError(f"reset options: unknown keys {sorted(unknown)}; allowed: instruction")
        if seed is not None:
            self.raw.seed(int(seed))  # the layout generator: same seed, same layout
        obs, _ = self.raw.reset()
        self.raw_obs = np.asarray(obs, dtype=np.float64)
        self.instruction = str(
            options.get("instruction") or language.sample_instruction(self.task, self.paraphrases, self.np_random)
        )
        self.success, self.t = False, 0
        return self._get_obs(), self._info(False)

    def step(self, action):
        a = np.clip(np.asarray(action, dtype=np.float32).reshape(4), -1.0, 1.0)
        obs, reward, _, truncated, info = self.raw.step(a)
        self.raw_obs = np.asarray(obs, dtype=np.float64)
        self.t += 1
        now = bool(info.get("success", False))
        self.success = self.success or now
        truncated = bool(truncated) or self.t >= self.max_steps
        return self._get_obs(), float(reward), False, truncated, self._info(now)

    def _info(self, now: bool) -> dict[str, Any]:
        return {
            "is_success": self.success,
            "success_now": now,
            "tip": self.raw_obs[:3].copy(),
            "instruction": self.instruction,
        }

    def _get_obs(self) -> dict[str, Any]:
        obs: dict[str, Any] = {}
        if "rgb" in self.obs_modes or "depth" in self.obs_modes:
            rgb, depth = self._render("rgb" in self.obs_modes, "depth" in self.obs_modes)
            if rgb is not None:
                obs["rgb"] = rgb
            if depth is not None:
                obs["depth"] = depth
        if "joints" in self.obs_modes:
            obs["joints"] = self.raw_obs[:JOINTS_DIM].astype(np.float32)
        if "instruction" in self.obs_modes:
            obs["instruction"] = self.instruction
        if "state" in self.obs_modes:
            obs["state"] = self.raw_obs.astype(np.float32)
        return obs

    def _render(self, rgb: bool, depth: bool) -> tuple[np.ndarray | None, np.ndarray | None]:
        # An own GL context and scene per env (dmrl's renderer: shadows and reflections off, colour and depth from
        # one draw). Going through gymnasium's MujocoRenderer instead gave a second env in one process black frames.
        if self._renderer is None:
            from dmrl.envs.render import MultiCameraRenderer

            self._renderer = MultiCameraRenderer(self.raw.model, self.image_size, (CAMERA,), shadows=False)
        return self._renderer.render(self.raw.data, rgb, depth)

    def render(self) -> np.ndarray:
        """(H, W, 3) uint8 frame of the corner2 camera."""
        rgb, _ = self._render(True, False)
        assert rgb is not None
        return np.moveaxis(rgb, 0, -1)

    def close(self) -> None:
        if self._renderer is not None:
            self._renderer.close()
            self._renderer = None
        self.raw.close()


class MetaWorldExpert:
    """Meta-World's scripted policy for the env's current task (``metaworld.policies``), acting on the 39-D state
    whatever observation keys are recorded; ``noise_std`` adds seeded Gaussian noise to its actions."""

    def __init__(self, env: gym.Env, noise_std: float = 0.0) -> None:
        from metaworld.policies import ENV_POLICY_MAP

        # Its policies warn on every step that their gains exceed the action range (the env clips): not news.
        warnings.filterwarnings("ignore", message=r"Constant\(s\) may be too high", module="metaworld")
        if noise_std < 0:
            raise ValueError(f"--noise-std: got {noise_std}; must be >= 0")
        # A MetaWorldEnv, or a multi-task env whose task changes at each reset: the policy follows env.task.
        self.env: MetaWorldEnv = env.unwrapped  # type: ignore[assignment]
        self._policies = ENV_POLICY_MAP
        self._built: dict[str, Any] = {}
        self.noise_std = float(noise_std)
        self.rng = np.random.default_rng(0)

    def reset(self, seed: int) -> None:
        self.rng = np.random.default_rng([int(seed), 1])

    @property
    def policy(self) -> Any:
        """Meta-World's scripted policy for the env's current task."""
        task = self.env.task
        if task not in self._built:
            self._built[task] = self._policies[task]()
        return self._built[task]

    def act(self, obs: Mapping[str, Any]) -> np.ndarray:
        action = np.asarray(self.policy.get_action(self.env.raw_obs), dtype=np.float32)
        if self.noise_std > 0:
            action = action + self.rng.normal(0.0, self.noise_std, size=action.shape).astype(np.float32)
        return np.clip(action, -1.0, 1.0).astype(np.float32)


def make_metaworld_env(task: str, obs_modes: tuple[str, ...] = ("state",), **options: Any) -> MetaWorldEnv:
    """Registry factory: ``metaworld/<task>`` -> :class:`MetaWorldEnv`."""
    return MetaWorldEnv(task, obs_modes=obs_modes, **options)
