"""Scripted experts for the MultiPath tasks: waypoint controllers on privileged state, route left or right.

Each episode the expert picks a side of the obstacle with p = 0.5, so a dataset of its demonstrations is
bimodal by construction. ``noise_std`` adds Gaussian action noise; ``suboptimal`` adds hesitations,
detours and occasional deliberate failures (dropping the cup, giving up), for offline-RL datasets.
``miss_prob`` makes the first grasp of some episodes aim off the cup; the expert lifts, notices the empty tool
at a random height and grasps again. ``recovered_at`` marks that step: a dataset keeps only what follows it
(``dmrl collect --miss-prob``), so it shows how to recover from a missed grasp and never the deliberate miss.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from dmrl.envs import scene
from dmrl.envs.geometry import CLEARANCE
from dmrl.envs.multipath import MAX_STEP, MultiPathEnv, TaskState

CARRY_Z = 0.22  # tip height while moving between cups, obstacle and pad (cup bottoms clear other cups)
SIDE_X = scene.OBSTACLE_HALF[0] + CLEARANCE + 0.02  # lateral offset of the route waypoints
HOVER = 0.008  # tip height above a cup top when switching suction on
MISS_OFFSET = (0.026, 0.045)  # m, horizontal aim error of a deliberate miss: just outside the 2.5 cm suction window
# Grasp plan phases (indices into the plan of _grasp_plan): the re-approach target after a miss, the lift, and
# the phases that carry the cup (suction on until the release at the pad).
PRE_GRASP, LIFT, CARRY_END = 1, 3, 7


@dataclass
class ExpertConfig:
    """Behaviour of :class:`ScriptedExpert`."""

    route: str | None = None
    """Force "left" or "right"; None draws one per episode with p = 0.5."""
    noise_std: float = 0.0
    """Std of Gaussian noise added to every action (then clipped to [-1, 1])."""
    suboptimal: bool = False
    """Hesitate (pauses), detour (random extra waypoints) and fail on purpose now and then."""
    fail_prob: float = 0.25
    """With suboptimal=True: probability that an episode contains a deliberate failure."""
    gain: float = 0.6
    """Proportional gain from waypoint error (in units of the max step) to action; below 1 the expert slows
    down smoothly near each waypoint instead of stopping dead in one step, which a policy can learn precisely."""

    miss_prob: float = 0.0
    """Grasp task: probability that an episode's first grasp aims 2.6-4.5 cm off the named cup (so it misses);
    lifting without the cup, the expert notices at a random height and re-approaches the true position. The
    steps before ``ScriptedExpert.recovered_at`` are the deliberate miss: not a demonstration."""

    def __post_init__(self) -> None:
        if not 0 <= self.miss_prob <= 1:
            raise ValueError(f"expert miss_prob: got {self.miss_prob}; allowed 0 .. 1")
        if self.miss_prob > 0 and self.suboptimal:
            raise ValueError("expert: miss_prob and suboptimal exclude each other (a miss is recovered, a failure not)")
        if self.route not in (None, "left", "right"):
            raise ValueError(f"expert route: got {self.route!r}; allowed: left, right or None (random)")
        if not (self.noise_std >= 0 and 0 <= self.fail_prob <= 1 and self.gain > 0):
            raise ValueError("expert: noise_std >= 0, 0 <= fail_prob <= 1 and gain > 0 are required")


class ScriptedExpert:
    """Follows a list of (position, suction) waypoints computed from the env's privileged TaskState.

    Call :meth:`reset` after ``env.reset`` and :meth:`act` every step; ``side`` holds the chosen route.
    """

    def __init__(self, env: MultiPathEnv, config: ExpertConfig | None = None, seed: int | None = None):
        self.env = env
        self.cfg = config or ExpertConfig()
        self.rng = np.random.default_rng(seed)
        self.side = "left"
        self._plan: list[tuple[np.ndarray, bool, int]] = []

    def reset(self, seed: int | None = None) -> None:
        """Plan the episode the env was just reset to; with ``seed`` (the env's reset seed) the expert's own draws
        (route, miss, detours) come from a stream of that seed independent of the env's."""
        if seed is not None:
            self.rng = np.random.default_rng((seed, 0xE))
        cfg, rng = self.cfg, self.rng
        self.side = cfg.route or ("left" if rng.random() < 0.5 else "right")
        s = self.env.task_state()
        self._plan = self._grasp_plan(s) if s.task == "grasp" else self._reach_plan(s)
        self._true_plan = self._plan  # the plan after a deliberate miss
        self.recovered_at: int | None = None  # step (act() calls so far) of the first action after noticing a miss
        self._t = 0
        self._notice_z = np.inf
        if cfg.miss_prob > 0 and s.task == "grasp" and rng.random() < cfg.miss_prob:
            self._plan = self._grasp_plan(s, offset=self._miss_offset(s))
            # Notice the empty tool somewhere on the way up (hover .. carry height), so recoveries start from
            # every state a missed grasp followed by part of a lift can leave the arm in.
            top_z = s.cups[s.target][2] + scene.CUP_HALF_HEIGHT
            self._notice_z = rng.uniform(top_z + HOVER + 0.01, CARRY_Z - 0.01)
        self._k = 0
        self._wait = 0
        self._fail_at = -1
        if cfg.suboptimal:
            self._add_detours()
            if rng.random() < cfg.fail_prob:
                self._fail_at = int(rng.integers(1, len(self._plan)))

    def take_over(self) -> None:
        """Plan from the env's state mid-episode, after another policy drove: the route side the tip is nearer to,
        and with a cup held (grasp) the plan resumes at the carry. For continuing someone else's rollout (the
        critic probe's "chunk, then the expert" returns); config draws (detours, failures, misses) are skipped."""
        s = self.env.task_state()
        self.side = self.cfg.route or ("left" if s.tip[0] < 0 else "right")
        self._plan = self._grasp_plan(s) if s.task == "grasp" else self._reach_plan(s)
        self._true_plan, self.recovered_at, self._notice_z = self._plan, None, np.inf
        self._t, self._wait, self._fail_at = 0, 0, -1
        self._k = LIFT + 1 if s.task == "grasp" and s.attached >= 0 else 0

    # ------------------------------------------------------------------ plans
    def _around(self, start_y: float, goal_y: float, oy: float) -> list[np.ndarray]:
        x = -SIDE_X if self.side == "left" else SIDE_X
        hy = scene.OBSTACLE_HALF[1] + CLEARANCE
        y1, y2 = (oy - hy, oy + hy) if goal_y > start_y else (oy + hy, oy - hy)
        return [np.array([x, y1, CARRY_Z]), np.array([x, y2, CARRY_Z])]

    def _grasp_plan(self, s: TaskState, offset=(0.0, 0.0)) -> list[tuple[np.ndarray, bool, int]]:
        """Waypoints to grasp the named cup (its xy shifted by ``offset`` (2,) m) and set it on the pad."""
        cup = s.cups[s.target].copy()
        cup[:2] += offset
        top_z = cup[2] + scene.CUP_HALF_HEIGHT
        above_cup = np.array([cup[0], cup[1], CARRY_Z])
        place_z = scene.PAD_HEIGHT + 2 * scene.CUP_HALF_HEIGHT + 0.012
        above_pad = np.array([s.pad[0], s.pad[1], CARRY_Z])
        # (waypoint, suction, tolerance class: 0 = pass-through, 1 = precise, 2 = dwell one step)
        # Suction goes on for the last few cm of the descent, so the grab happens on the way down and does
        # not hinge on one exact step; it goes off once the cup is just above the pad, and the cup settles.
        plan = [(above_cup, False, 1), (np.array([cup[0], cup[1], top_z + 0.045]), False, 1)]
        plan += [(np.array([cup[0], cup[1], top_z + HOVER]), True, 1), (above_cup, True, 0)]
        plan += [(w, True, 0) for w in self._around(cup[1], s.pad[1], s.obstacle_y)]
        plan += [(above_pad, True, 1), (np.array([s.pad[0], s.pad[1], place_z]), True, 1)]
        plan += [(plan[-1][0], False, 2), (above_pad, False, 0)]
        return plan

    def _miss_offset(self, s: TaskState) -> np.ndarray:
        """(2,) aim error of a deliberate miss: away from the other cups (none is grabbed instead) and not
        toward the obstacle (the arm would touch it)."""
        cup = s.cups[s.target, :2]
        others = np.delete(s.cups[:, :2], s.target, axis=0) - cup
        toward_obstacle = np.sign(s.obstacle_y - cup[1])
        for _ in range(50):
            angle, radius = self.rng.uniform(0, 2 * np.pi), self.rng.uniform(*MISS_OFFSET)
            offset = radius * np.array([np.cos(angle), np.sin(angle)])
            if np.all(np.linalg.norm(others - offset, axis=1) > 0.05) and offset[1] * toward_obstacle < 0.01:
                return offset
        return np.array([radius, 0.0])  # sideways (x): clear of the cup column and the obstacle

    def _reach_plan(self, s: TaskState) -> list[tuple[np.ndarray, bool, int]]:
        cup = s.cups[s.target]
        tip = s.tip
        plan = [(w, False, 0) for w in self._around(tip[1], cup[1], s.obstacle_y)]
        plan += [(np.array([cup[0], cup[1], CARRY_Z]), False, 1)]
        plan += [(np.array([cup[0], cup[1], cup[2] + scene.CUP_HALF_HEIGHT + 0.01]), False, 1)]
        return plan

    def _add_detours(self) -> None:
        """Insert a random sideways/upward wiggle after some pass-through waypoints (stays off the obstacle)."""
        out = []
        for wp, suction, kind in self._plan:
            out.append((wp, suction, kind))
            if kind == 0 and self.rng.random() < 0.5:
                jitter = self.rng.uniform([-0.04, -0.03, -0.03], [0.04, 0.03, 0.02])
                # push the detour away from the obstacle's centre line so it never aims into it
                jitter[0] = np.sign(wp[0] or 1.0) * abs(jitter[0])
                out.append((self.env.workspace.clip(wp + jitter), suction, 0))
        self._plan = out

    # ------------------------------------------------------------------ acting
    @property
    def first_step(self) -> int:
        """The first step worth keeping: after a deliberate miss, the recovery's (see the module docstring)."""
        return self.recovered_at or 0

    def act(self, obs: Mapping[str, Any] | None = None) -> np.ndarray:
        """Action (6,) float32 in [-1, 1] for the env's current state (read from the env: ``obs`` is unused)."""
        s = self.env.task_state()
        lifted = self._k > LIFT or s.tip[2] >= self._notice_z
        if self.recovered_at is None and lifted and self._missed(s, self._k):  # no cup on the way up: regrasp
            self._plan, self._k, self._wait = self._true_plan, PRE_GRASP, 0
            self.recovered_at = self._t
        self._t += 1
        if self._k >= len(self._plan):
            return self._finish(self._toward(s, None, False))
        wp, suction, kind = self._plan[self._k]
        if self._k == self._fail_at:
            # deliberate failure: let go of whatever is held, then wander for the rest of the episode
            self._plan = [(self.env.workspace.clip(wp + self.rng.uniform(-0.1, 0.1, 3)), False, 0)] * 400
            self._k, self._fail_at = 0, -1
            wp, suction, kind = self._plan[0]
        a = self._toward(s, wp, suction)
        err = wp - s.tip
        tol = (0.03, 0.006, 0.0)[kind]
        if kind == 2:  # dwell one step so suction switches while the tip is still
            self._wait += 1
            done = self._wait >= 2
        else:
            done = np.linalg.norm(err) < tol
        if done:
            self._k += 1
            self._wait = 0
        if self.cfg.suboptimal and self.rng.random() < 0.05:
            a[:3] = 0.0  # hesitation: a step without motion
        return self._finish(a)

    def _missed(self, s: TaskState, phase: int) -> bool:
        """An expert that recovers (miss_prob > 0, grasp task) is in carrying ``phase`` without the named cup."""
        recovers = self.cfg.miss_prob > 0 and s.task == "grasp"
        return recovers and LIFT <= phase <= CARRY_END and s.attached != s.target

    def _toward(self, s: TaskState, wp: np.ndarray | None, suction: bool) -> np.ndarray:
        """Proportional step toward waypoint ``wp`` (None: stay), tool kept vertical, suction on or off."""
        a = np.zeros(6)
        a[4] = np.clip(-s.pitch / 0.05, -1, 1)  # keep the tool vertical
        if wp is not None:
            a[:3] = np.clip(self.cfg.gain * (wp - s.tip) / MAX_STEP, -1, 1)
        a[5] = 1.0 if suction else -1.0
        return a

    def _finish(self, a: np.ndarray) -> np.ndarray:
        if self.cfg.noise_std > 0:
            a = a + self.rng.normal(0.0, self.cfg.noise_std, size=6)
        return np.clip(a, -1.0, 1.0).astype(np.float32)


def scripted_expert(
    env: MultiPathEnv, noise_std: float = 0.0, suboptimal: bool = False, miss_prob: float = 0.0
) -> ScriptedExpert:
    """The MultiPath tasks' expert factory in the env registry (``dmrl collect``'s expert flags)."""
    if miss_prob > 0 and (suboptimal or env.cfg.task != "grasp"):
        raise ValueError("--miss-prob needs the grasp env and no --suboptimal (it retries a missed grasp)")
    return ScriptedExpert(env, ExpertConfig(noise_std=noise_std, suboptimal=suboptimal, miss_prob=miss_prob))


def run_expert_episode(env: MultiPathEnv, expert: ScriptedExpert, seed: int, options: dict | None = None):
    """Roll out one expert episode; returns (actions (T,6), final info, summed reward)."""
    env.reset(seed=seed, options=options)
    expert.reset()
    actions, total = [], 0.0
    while True:
        a = expert.act()
        actions.append(a)
        _, r, term, trunc, info = env.step(a)
        total += r
        if term or trunc:
            return np.array(actions), info, total


def mean_plan_episode(env: MultiPathEnv, seed: int) -> tuple[dict, list[dict]]:
    """Execute open loop the step-wise mean of the left and the right expert plans for ``seed``.

    This is what a regressor that averages the two modes would do. Returns (final info of the mean plan,
    [final info of the left plan, of the right plan]); the shorter plan is padded with its last action.
    """
    plans, infos = [], []
    for route in ("left", "right"):
        actions, info, _ = run_expert_episode(env, ScriptedExpert(env, ExpertConfig(route=route)), seed)
        plans.append(actions)
        infos.append(info)
    t = max(map(len, plans))
    plans = [np.concatenate([p, np.repeat(p[-1:], t - len(p), 0)]) for p in plans]
    mean_plan = (plans[0] + plans[1]) / 2
    env.reset(seed=seed)
    info: dict = {}
    for step in range(env.cfg.max_steps):
        *_, terminated, truncated, info = env.step(mean_plan[min(step, t - 1)])
        if terminated or truncated:
            break
    return info, infos
