"""MultiPath tabletop tasks (Reach, Grasp): one obstacle, exactly two good routes, multimodal observations.

The point of the task family is that good behaviour is bimodal: the arm must pass the central obstacle on
the left or on the right, and the average of the two (what a unimodal regressor learns) drives straight
into it. Observations are any subset of RGB, depth, joint angles, wrist force, a language instruction and
a privileged state vector (see :class:`MultiPathConfig` and the README for shapes and the action meaning).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import gymnasium as gym
import mujoco
import numpy as np

from dmrl.envs import arm, language, scene
from dmrl.envs.geometry import route_distance, route_distance_v1
from dmrl.envs.render import DEPTH_MAX, MultiCameraRenderer
from dmrl.types import parse_obs_modes

#: Meaning of each action dimension, stored with every dataset.
ACTION_MEANING = (
    "dx: tip +x (robot's right) velocity, 1 = 3 cm/step",
    "dy: tip +y (away from robot) velocity, 1 = 3 cm/step",
    "dz: tip +z (up) velocity, 1 = 3 cm/step",
    "dyaw: tool yaw rate, 1 = 0.15 rad/step",
    "dpitch: tool tilt rate in the arm plane, 1 = 0.05 rad/step (bounded to +-0.5 rad)",
    "suction: > 0 on (grabs a cup under the tip), <= 0 off (releases)",
)
MAX_STEP = 0.03  # m per control step
SUCTION_XY = 0.025  # m, horizontal distance tip -> cup-top centre within which suction grabs
SUCTION_Z = 0.03  # m, highest tip height above the cup top at which suction grabs
MAX_YAW_STEP = 0.15
MAX_PITCH_STEP = 0.05
TASKS = tuple(scene.LAYOUTS)
REWARDS = ("shaped", "sparse", "shaped_v1")
#: Metres of route the shaped potential counts down from: Phi = held + shaping_scale * max(0, REF_DISTANCE - to_go),
#: above every distance to go of a start state, so Phi >= 0 and stopping (Phi(terminal) = 0) never gains.
REF_DISTANCE = 1.2


@dataclass
class MultiPathConfig:
    """Settings of a MultiPath environment; invalid values raise in ``__post_init__``."""

    task: str = "grasp"
    """"grasp" (carry the named cup around the obstacle onto the pad) or "reach" (tip to the named cup)."""
    obs_modes: tuple[str, ...] = ("rgb", "depth", "joints", "force", "instruction", "state")
    """Observation keys to emit; any non-empty subset of rgb, depth, joints, force, instruction, state."""
    image_size: int = 64
    """H = W of rendered images, 16..128."""
    cameras: tuple[str, ...] = ("front",)
    """Cameras stacked along channels: rgb (3V,H,W), depth (V,H,W). Known: front, top, side."""
    n_objects: int = 3
    """Number of cups (2 or 3); only the instruction says which one is the target."""
    max_steps: int = 200
    """Episode time limit in control steps (10 Hz)."""
    paraphrases: str = "train"
    """Instruction paraphrase set sampled at reset: train, heldout or all."""
    shadows: bool = False
    """Render shadows (about 45 ms/frame on CPU instead of about 1 ms)."""
    substeps: int = 10
    """Physics steps of 10 ms per control step (10 gives 10 Hz control)."""
    reward: str = "shaped"
    """"shaped" (success bonus, collision penalty and potential-based shaping gamma * Phi(s') - Phi(s), Phi = 0 at
    termination), "sparse" (1 on success, else 0; a collision ends the episode with 0) or "shaped_v1" (the reward
    of every RL result before the fix: Phi(s') - Phi(s) with a route distance that cuts through the obstacle band;
    kept bit for bit to reproduce them). docs/tasks.md, "Reward"."""
    success_bonus: float = 10.0
    """Reward on success (shaped rewards)."""
    collision_penalty: float = 2.0
    """Subtracted on the step that touches the obstacle, which ends the episode (shaped rewards)."""
    shaping_scale: float = 5.0
    """Potential per metre of route-aware progress (shaped rewards)."""
    gamma: float = 0.99
    """Discount per env step the shaping is exact for (reward "shaped"); match the critic's (CriticConfig.gamma)."""

    def __post_init__(self) -> None:
        self.obs_modes = parse_obs_modes(self.obs_modes)
        self.cameras = tuple(self.cameras)
        checks = [
            (self.task in TASKS, f"task: got {self.task!r}; allowed: {', '.join(TASKS)}"),
            (16 <= self.image_size <= 128, f"image_size: got {self.image_size}; allowed 16..128"),
            (2 <= self.n_objects <= 3, f"n_objects: got {self.n_objects}; allowed 2 or 3"),
            (1 <= self.max_steps <= 1000, f"max_steps: got {self.max_steps}; allowed 1..1000"),
            (
                self.paraphrases in language.SPLITS,
                f"paraphrases: got {self.paraphrases!r}; allowed: {', '.join(language.SPLITS)}",
            ),
            (
                len(self.cameras) >= 1 and all(c in scene.CAMERA_NAMES for c in self.cameras),
                f"cameras: got {self.cameras!r}; allowed: one or more of {', '.join(scene.CAMERA_NAMES)}",
            ),
            (self.substeps >= 1, f"substeps: got {self.substeps}; must be >= 1"),
            (self.reward in REWARDS, f"reward: got {self.reward!r}; allowed: {', '.join(REWARDS)}"),
            (0.0 < self.gamma <= 1.0, f"gamma: got {self.gamma}; allowed (0, 1]"),
        ]
        for ok, msg in checks:
            if not ok:
                raise ValueError(msg)


@dataclass
class TaskState:
    """Privileged snapshot the scripted experts plan from (metres, table frame)."""

    tip: np.ndarray  # (3,)
    yaw: float
    pitch: float
    suction: bool
    attached: int  # index of the cup held by suction, -1 if none
    cups: np.ndarray  # (n, 3) cup centres
    target: int
    pad: np.ndarray  # (2,)
    obstacle_y: float
    task: str
    colors: tuple[str, ...] = field(default_factory=tuple)


class MultiPathEnv(gym.Env):
    """A 5-joint suction arm, 2-3 coloured cups, a pad and an obstacle; see the module docstring."""

    metadata = {"render_modes": ["rgb_array"], "render_fps": 10}
    action_meaning = ACTION_MEANING

    def __init__(self, config: MultiPathConfig | None = None, render_mode: str | None = None, **overrides):
        cfg = config or MultiPathConfig(**overrides)
        if config is not None and overrides:
            raise ValueError("pass either config= or keyword overrides, not both")
        self.cfg = cfg
        self.render_mode = render_mode
        self.colors = tuple(scene.COLORS)[: cfg.n_objects]
        self.layout = scene.LAYOUTS[cfg.task]
        xml = scene.build_mjcf(cfg.task, self.colors, scene.CAMERA_NAMES, self.layout.obstacle_y)
        self.model = mujoco.MjModel.from_xml_string(xml)
        self.data = mujoco.MjData(self.model)
        self.workspace = arm.Workspace()
        self._renderer: MultiCameraRenderer | None = None
        m = self.model
        self._arm_qadr = np.array([m.jnt_qposadr[m.joint(j).id] for j in arm.JOINT_NAMES])
        self._cup_qadr = [m.jnt_qposadr[m.joint(f"cup_{i}").id] for i in range(cfg.n_objects)]
        self._cup_bodies = [m.body(f"cup_{i}").id for i in range(cfg.n_objects)]
        self._tool_body = m.body("tool").id
        self._tip_site = m.site("tip").id
        self._pad_mocap = m.body_mocapid[m.body("pad").id]
        self._obstacle_touch = m.sensor_adr[m.sensor("obstacle_touch").id]
        self._weld_ids = [m.equality(f"suction_{i}").id for i in range(cfg.n_objects)]
        self.action_space = gym.spaces.Box(-1.0, 1.0, shape=(6,), dtype=np.float32)
        self.observation_space = self._make_obs_space()

    @property
    def env_id(self) -> str:
        """Its name in the env registry: dmrl/MultiPathGrasp-v0 or dmrl/MultiPathReach-v0."""
        return f"dmrl/MultiPath{self.cfg.task.title()}-v0"

    # ----------------------------------------------------------------- spaces
    def _make_obs_space(self) -> gym.spaces.Dict:
        cfg, h = self.cfg, self.cfg.image_size
        v = len(cfg.cameras)
        s_dim = 19 + 4 * cfg.n_objects
        # Joint limits plus the suction flag; force in newtons; state in metres / radians.
        j_low = np.append(arm.JOINT_LIMITS[:, 0], 0.0).astype(np.float32)
        j_high = np.append(arm.JOINT_LIMITS[:, 1], 1.0).astype(np.float32)
        spaces: dict[str, gym.Space] = {
            "rgb": gym.spaces.Box(0, 255, shape=(3 * v, h, h), dtype=np.uint8),
            "depth": gym.spaces.Box(0.0, DEPTH_MAX, shape=(v, h, h), dtype=np.float32),
            "joints": gym.spaces.Box(j_low, j_high, dtype=np.float32),
            "force": gym.spaces.Box(-1e3, 1e3, shape=(4,), dtype=np.float32),
            "instruction": gym.spaces.Text(
                max_length=128,
                min_length=1,
                charset=" ,'abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ",
            ),
            "state": gym.spaces.Box(-10.0, 10.0, shape=(s_dim,), dtype=np.float32),
        }
        return gym.spaces.Dict({k: spaces[k] for k in cfg.obs_modes})

    # ----------------------------------------------------------------- reset
    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        options = dict(options or {})
        unknown = set(options) - {"target", "instruction"}
        if unknown:
            raise ValueError(f"reset options: unknown keys {sorted(unknown)}; allowed: target, instruction")
        rng = self.np_random
        target_color, instruction = self._choose_target(options, rng)
        self.target = self.colors.index(target_color)
        self.instruction = instruction
        mujoco.mj_resetData(self.model, self.data)
        self._sample_layout(rng)
        self.t = 0
        self.route: str | None = None
        self.collided = False
        self.attached = -1
        self.suction = False
        q = arm.inverse_kinematics(self.cmd_pos, self.cmd_yaw, self.cmd_pitch)
        self.data.qpos[self._arm_qadr] = q
        self.data.ctrl[:] = q
        mujoco.mj_forward(self.model, self.data)
        # Let the cups settle on the table so the first observation is at rest.
        for _ in range(5):
            mujoco.mj_step(self.model, self.data)
        self._potential = self._compute_potential()
        return self._get_obs(), self._info(success=False)

    def _choose_target(self, options: dict, rng: np.random.Generator) -> tuple[str, str]:
        target, instruction = options.get("target"), options.get("instruction")
        if target is not None and target not in self.colors:
            raise ValueError(f"reset option target: got {target!r}; cups in the scene: {', '.join(self.colors)}")
        if instruction is not None:
            named = language.parse_target(str(instruction), self.colors)
            if target is not None and target != named:
                raise ValueError(f"reset options disagree: target={target!r} but instruction names {named!r}")
            return named, str(instruction)
        target = target or self.colors[int(rng.integers(len(self.colors)))]
        return target, language.sample_instruction(self.cfg.task, target, self.cfg.paraphrases, rng)

    def _sample_layout(self, rng: np.random.Generator) -> None:
        lay = self.layout
        slots = rng.permutation(len(lay.cup_ys))[: self.cfg.n_objects]
        for i, qadr in enumerate(self._cup_qadr):
            x = rng.uniform(-0.02, 0.02)
            y = lay.cup_ys[slots[i]] + rng.uniform(-0.008, 0.008)
            self.data.qpos[qadr : qadr + 7] = (x, y, scene.CUP_HALF_HEIGHT, 1, 0, 0, 0)
        pad = np.array(lay.pad) + rng.uniform(-0.02, 0.02, size=2)
        self.data.mocap_pos[self._pad_mocap] = (pad[0], pad[1], 0.0)
        self.cmd_pos = np.array(lay.home) + rng.uniform(-0.02, 0.02, size=3)
        self.cmd_yaw = float(rng.uniform(-0.3, 0.3))
        self.cmd_pitch = 0.0
        for wid in self._weld_ids:
            self.data.eq_active[wid] = 0

    # ----------------------------------------------------------------- step
    def step(self, action):
        a = np.clip(np.asarray(action, dtype=np.float64).reshape(6), -1.0, 1.0)
        self.cmd_pos = self.workspace.clip(self.cmd_pos + a[:3] * MAX_STEP)
        self.cmd_yaw = math.remainder(self.cmd_yaw + a[3] * MAX_YAW_STEP, 2 * math.pi)
        mp = self.workspace.max_pitch
        self.cmd_pitch = float(np.clip(self.cmd_pitch + a[4] * MAX_PITCH_STEP, -mp, mp))
        self.data.ctrl[:] = arm.inverse_kinematics(self.cmd_pos, self.cmd_yaw, self.cmd_pitch)
        self.suction = bool(a[5] > 0)
        for _ in range(self.cfg.substeps):
            mujoco.mj_step(self.model, self.data)
            self.collided = self.collided or self._touching_obstacle()
        self._update_suction()
        self.t += 1
        tip = self.data.site_xpos[self._tip_site]
        if self.route is None and abs(tip[1] - self.layout.obstacle_y) < scene.OBSTACLE_HALF[1] + 0.02:
            self.route = "left" if tip[0] < 0 else "right"
        success = (not self.collided) and self._is_success()
        terminated = success or self.collided
        truncated = (not terminated) and self.t >= self.cfg.max_steps
        reward = self._reward(success, terminated)
        return self._get_obs(), float(reward), terminated, truncated, self._info(success)

    def _reward(self, success: bool, terminated: bool) -> float:
        cfg = self.cfg
        if cfg.reward == "sparse":
            return 1.0 if success else 0.0
        potential = self._compute_potential()
        if cfg.reward == "shaped_v1":
            reward = potential - self._potential
        else:
            # Ng et al. (1999): F = gamma * Phi(s') - Phi(s) with Phi = 0 at termination changes every discounted
            # return by -Phi(s0) alone, so rankings of episodes (and the optimal policy) are those of the
            # bonus/penalty reward. Phi >= 0 makes ending an episode forfeit its potential, so a chunk that ends in
            # the obstacle never out-earns one that goes on. A time-limit truncation is not terminal: Phi(s') stays.
            reward = cfg.gamma * (0.0 if terminated else potential) - self._potential
        self._potential = potential
        if success:
            reward += cfg.success_bonus
        if self.collided:
            reward -= cfg.collision_penalty
        return reward

    def _touching_obstacle(self) -> bool:
        # Any contact force on the obstacle: read from a touch sensor filled by this substep's collision pass.
        return self.data.sensordata[self._obstacle_touch] > 0.0

    def _update_suction(self) -> None:
        if not self.suction:
            if self.attached >= 0:
                self.data.eq_active[self._weld_ids[self.attached]] = 0
                self.attached = -1
            return
        if self.attached >= 0:
            return
        tip = self.data.site_xpos[self._tip_site]
        for i, body in enumerate(self._cup_bodies):
            top = self.data.xpos[body] + self.data.xmat[body].reshape(3, 3)[:, 2] * scene.CUP_HALF_HEIGHT
            dz = tip[2] - top[2]
            # A suction cup seals when it is over the rim and close: a window of a few cm, as a real one has,
            # so a learned policy need not hit one exact step and height.
            if np.hypot(*(tip[:2] - top[:2])) < SUCTION_XY and -0.015 < dz < SUCTION_Z:
                self._attach(i)
                return

    def _attach(self, i: int) -> None:
        # Weld the cup to the tool at their current relative pose (relpose = pose of cup in tool frame),
        # so attaching never makes the cup jump.
        d, wid = self.data, self._weld_ids[i]
        tool, cup = self._tool_body, self._cup_bodies[i]
        rel_pos = d.xmat[tool].reshape(3, 3).T @ (d.xpos[cup] - d.xpos[tool])
        inv_tool = np.zeros(4)
        mujoco.mju_negQuat(inv_tool, d.xquat[tool])
        rel_quat = np.zeros(4)
        mujoco.mju_mulQuat(rel_quat, inv_tool, d.xquat[cup])
        self.model.eq_data[wid, 0:3] = 0.0
        self.model.eq_data[wid, 3:6] = rel_pos
        self.model.eq_data[wid, 6:10] = rel_quat
        self.model.eq_data[wid, 10] = 1.0
        d.eq_active[wid] = 1
        self.attached = i

    # ----------------------------------------------------------------- task logic
    def task_state(self) -> TaskState:
        d = self.data
        return TaskState(
            tip=d.site_xpos[self._tip_site].copy(),
            yaw=self.cmd_yaw,
            pitch=self.cmd_pitch,
            suction=self.suction,
            attached=self.attached,
            cups=np.array([d.xpos[b] for b in self._cup_bodies]),
            target=self.target,
            pad=d.mocap_pos[self._pad_mocap][:2].copy(),
            obstacle_y=self.layout.obstacle_y,
            task=self.cfg.task,
            colors=self.colors,
        )

    def _cup_top(self, i: int) -> np.ndarray:
        return self.data.xpos[self._cup_bodies[i]] + np.array([0.0, 0.0, scene.CUP_HALF_HEIGHT])

    def _is_success(self) -> bool:
        tip = self.data.site_xpos[self._tip_site]
        if self.cfg.task == "reach":
            top = self._cup_top(self.target)
            return bool(np.hypot(*(tip[:2] - top[:2])) < 0.02 and -0.01 < tip[2] - top[2] < 0.03)
        cup = self.data.xpos[self._cup_bodies[self.target]]
        pad = self.data.mocap_pos[self._pad_mocap]
        on_pad = np.hypot(*(cup[:2] - pad[:2])) < scene.PAD_RADIUS - 0.01
        resting = cup[2] < scene.CUP_HALF_HEIGHT + scene.PAD_HEIGHT + 0.01
        return bool(self.attached < 0 and on_pad and resting)

    def _compute_potential(self) -> float:
        """Shaping potential Phi(s): route-aware distance still to go (m), scaled, plus 1 while the target cup is
        held. Reward "shaped": held + shaping_scale * max(0, REF_DISTANCE - to_go) >= 0; "shaped_v1":
        held - shaping_scale * to_go with :func:`route_distance_v1`; "sparse": 0."""
        cfg = self.cfg
        if cfg.reward == "sparse":
            return 0.0
        v1 = cfg.reward == "shaped_v1"
        distance = route_distance_v1 if v1 else route_distance
        oy = self.layout.obstacle_y
        tip = self.data.site_xpos[self._tip_site]
        top = self._cup_top(self.target)
        if cfg.task == "reach" and v1:
            return -cfg.shaping_scale * distance(tip, top, oy)
        if cfg.task == "reach":
            to_go, held = distance(tip, top, oy), 0.0
        else:
            cup = self.data.xpos[self._cup_bodies[self.target]]
            pad = np.array([*self.data.mocap_pos[self._pad_mocap][:2], scene.CUP_HALF_HEIGHT])
            to_go = distance(cup, pad, oy)
            if self.attached != self.target:
                reach = float(np.linalg.norm(tip - top))
                if v1:
                    to_go += reach if to_go > scene.PAD_RADIUS else 0.0
                else:
                    # the tip's way to the cup counts until the cup is on the pad, phased out over 2 cm (continuous)
                    to_go += reach * min(1.0, max(0.0, (to_go - scene.PAD_RADIUS) / 0.02))
            held = 1.0 if self.attached == self.target else 0.0
        if v1:
            return held - cfg.shaping_scale * to_go
        return held + cfg.shaping_scale * max(0.0, REF_DISTANCE - to_go)

    # ----------------------------------------------------------------- observations
    def _get_obs(self) -> dict:
        cfg, d = self.cfg, self.data
        obs: dict = {}
        if "rgb" in cfg.obs_modes or "depth" in cfg.obs_modes:
            if self._renderer is None:
                self._renderer = MultiCameraRenderer(self.model, cfg.image_size, cfg.cameras, cfg.shadows)
            rgb, depth = self._renderer.render(d, "rgb" in cfg.obs_modes, "depth" in cfg.obs_modes)
            if rgb is not None:
                obs["rgb"] = rgb
            if depth is not None:
                obs["depth"] = depth
        if "joints" in cfg.obs_modes:
            obs["joints"] = np.append(d.qpos[self._arm_qadr], float(self.suction)).astype(np.float32)
        if "force" in cfg.obs_modes:
            obs["force"] = d.sensordata[:4].astype(np.float32)
        if "instruction" in cfg.obs_modes:
            obs["instruction"] = self.instruction
        if "state" in cfg.obs_modes:
            obs["state"] = self._state_vector()
        return obs

    def _state_vector(self) -> np.ndarray:
        """(19 + 4n,): tip(3) yaw pitch suction held target_cup(3) pad(3) target_cup-tip(3) pad-tip(3)
        cups(3n) target_onehot(n). The relative vectors are redundant but spare a policy from learning a
        subtraction to centimetre precision."""
        d = self.data
        cups = np.array([d.xpos[b] for b in self._cup_bodies])
        onehot = np.eye(self.cfg.n_objects)[self.target]
        head = [
            d.site_xpos[self._tip_site],
            [self.cmd_yaw, self.cmd_pitch, float(self.suction), float(self.attached == self.target)],
        ]
        tip, target, pad = d.site_xpos[self._tip_site], cups[self.target], d.mocap_pos[self._pad_mocap]
        return np.concatenate([*head, target, pad, target - tip, pad - tip, cups.ravel(), onehot]).astype(np.float32)

    def _info(self, success: bool) -> dict:
        info = {
            "tip": self.data.site_xpos[self._tip_site].copy(),
            "is_success": bool(success),
            "collision": bool(self.collided),
            "route": self.route,
            "target": self.colors[self.target],
            "instruction": self.instruction,
        }
        if self.cfg.task != "reach":
            # Colour of the cup held by suction now (None: none): evaluation records the first one, which tells a
            # missed grasp from a wrong cup from a dropped one.
            info["held"] = self.colors[self.attached] if self.attached >= 0 else None
        return info

    def render(self):
        if self._renderer is None:
            self._renderer = MultiCameraRenderer(self.model, self.cfg.image_size, self.cfg.cameras, self.cfg.shadows)
        rgb, _ = self._renderer.render(self.data, True, False)
        return np.moveaxis(rgb[:3], 0, -1)

    def close(self) -> None:
        if self._renderer is not None:
            self._renderer.close()
            self._renderer = None
