"""Route-aware distance around the central obstacle (a shortest path in the plane, around a rectangle)."""

from __future__ import annotations

import math

import numpy as np

from dmrl.envs import scene

#: Clearance added around the obstacle footprint: cup radius plus a margin for the tool.
CLEARANCE = scene.CUP_RADIUS + 0.04


def route_distance(p: np.ndarray, goal: np.ndarray, obstacle_y: float) -> float:
    """Length (m) of the shortest path from ``p`` (3,) to ``goal`` (3,) that goes around the obstacle.

    In the table plane the path bends around the corners of the obstacle footprint, inflated by
    :data:`CLEARANCE`, whenever the straight segment would cross it; height is added in quadrature. Used
    for reward shaping, so a policy is never paid for moving straight into the obstacle.
    """
    hx = scene.OBSTACLE_HALF[0] + CLEARANCE
    hy = scene.OBSTACLE_HALF[1] + CLEARANCE
    px, py, gx, gy = float(p[0]), float(p[1]), float(goal[0]), float(goal[1])
    dz = float(goal[2] - p[2])
    near, far = obstacle_y - hy, obstacle_y + hy
    crosses = (py < near and gy > far) or (py > far and gy < near)
    if crosses:
        # x where the straight segment meets the obstacle's centre line
        x_mid = px + (gx - px) * (obstacle_y - py) / (gy - py)
        crosses = abs(x_mid) < hx
    if not crosses:
        return math.hypot(math.hypot(gx - px, gy - py), dz)
    y1, y2 = (near, far) if py < gy else (far, near)
    best = math.inf
    for side in (-hx, hx):
        length = math.hypot(side - px, y1 - py) + abs(y2 - y1) + math.hypot(gx - side, gy - y2)
        best = min(best, length)
    return math.hypot(best, dz)
