"""Kinematics of the 5-joint tabletop arm: closed-form inverse kinematics for a downward-pointing tool.

The arm is a yaw base, three pitch joints (shoulder, elbow, wrist) in one vertical plane, and a roll joint
about the tool axis, carrying a suction tool. With the tool held vertical (plus an optional tilt in the arm
plane) the inverse kinematics is the textbook planar two-link solution, so it is exact, branch-free in the
workspace, and costs microseconds: no iterative solver whose convergence could differ between runs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

SHOULDER_HEIGHT = 0.45  # m, shoulder pitch axis above the table
UPPER_ARM = 0.45  # m, shoulder -> elbow
FOREARM = 0.45  # m, elbow -> wrist pitch axis
TOOL = 0.10  # m, wrist pitch axis -> suction tip
N_JOINTS = 5
JOINT_NAMES = ("base_yaw", "shoulder", "elbow", "wrist_pitch", "wrist_roll")
JOINT_LIMITS = np.array(
    [[-2.6, 2.6], [-0.6, 2.2], [-2.8, 0.6], [-2.5, 2.5], [-3.0, 3.0]], dtype=np.float64
)  # rad, (J, 2)


@dataclass(frozen=True)
class Workspace:
    """Box the commanded suction-tip position is clipped to (metres, table frame).

    ``z_max`` is below the obstacle's top, which is what leaves exactly two routes (left or right) around
    it: the arm cannot lift the tip over the obstacle. Meta-World bounds its hand the same way.
    """

    low: tuple[float, float, float] = (-0.32, 0.15, 0.03)
    high: tuple[float, float, float] = (0.32, 0.80, 0.25)
    max_pitch: float = 0.5  # rad, tool tilt in the arm plane

    def clip(self, pos: np.ndarray) -> np.ndarray:
        return np.clip(pos, self.low, self.high)


def inverse_kinematics(tip: np.ndarray, yaw: float, pitch: float = 0.0) -> np.ndarray:
    """Joint angles (J,) that put the suction tip at ``tip`` (3,) with tool yaw ``yaw`` and tilt ``pitch``.

    Angles follow the MuJoCo model in :mod:`dmrl.envs.scene`: base yaw about +z (zero points along +y),
    pitch joints about the local +x axis (positive lifts the link), tool pointing down at zero pitch sum.
    Unreachable targets are projected onto the reachable annulus rather than raising, so a policy's bad
    command produces a saturated, still-valid pose.
    """
    x, y, z = float(tip[0]), float(tip[1]), float(tip[2])
    base = math.atan2(-x, y)
    r_tip = math.hypot(x, y)
    # Wrist pitch axis sits TOOL above the tip along the (tilted) tool direction.
    r_w = r_tip - TOOL * math.sin(pitch)
    z_w = z + TOOL * math.cos(pitch) - SHOULDER_HEIGHT
    d = math.hypot(r_w, z_w)
    d = min(max(d, 1e-3 + abs(UPPER_ARM - FOREARM)), UPPER_ARM + FOREARM - 1e-4)
    beta = math.atan2(z_w, r_w)
    cos_gamma = (UPPER_ARM**2 + d**2 - FOREARM**2) / (2 * UPPER_ARM * d)
    gamma = math.acos(min(1.0, max(-1.0, cos_gamma)))
    shoulder = beta + gamma  # elbow-up solution keeps the links high above the obstacle
    elbow_r = UPPER_ARM * math.cos(shoulder)
    elbow_z = UPPER_ARM * math.sin(shoulder)
    scale = d / max(math.hypot(r_w, z_w), 1e-9)
    fore = math.atan2(z_w * scale - elbow_z, r_w * scale - elbow_r)
    elbow = fore - shoulder
    wrist_pitch = pitch - shoulder - elbow
    roll = _wrap(yaw - base)
    q = np.array([base, shoulder, elbow, wrist_pitch, roll])
    return np.clip(q, JOINT_LIMITS[:, 0], JOINT_LIMITS[:, 1])


def forward_kinematics(q: np.ndarray) -> np.ndarray:
    """Suction-tip position (3,) for joint angles ``q`` (J,); the inverse of :func:`inverse_kinematics`."""
    base, shoulder, elbow, wrist_pitch, _ = (float(v) for v in q[:N_JOINTS])
    a1, a2, a3 = shoulder, shoulder + elbow, shoulder + elbow + wrist_pitch
    r = UPPER_ARM * math.cos(a1) + FOREARM * math.cos(a2) + TOOL * math.sin(a3)
    z = SHOULDER_HEIGHT + UPPER_ARM * math.sin(a1) + FOREARM * math.sin(a2) - TOOL * math.cos(a3)
    return np.array([-r * math.sin(base), r * math.cos(base), z])


def _wrap(a: float) -> float:
    return (a + math.pi) % (2 * math.pi) - math.pi
