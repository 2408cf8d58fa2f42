"""Route-aware distance around the central obstacle: the shortest path in the plane around a rectangle (the taut
string of a visibility graph over its corners), continuous everywhere, inside the obstacle's footprint too."""

from __future__ import annotations

import math

import numpy as np

from dmrl.envs import scene

#: Clearance added around the obstacle footprint: cup radius plus a margin for the tool.
CLEARANCE = scene.CUP_RADIUS + 0.04
#: Cost per metre travelled inside the inflated footprint, relative to 1 outside. Above 1 + max(hx/hy, hy/hx)
#: (2.5) the distance is continuous across the footprint's faces; above (hx + hy) / (hy - CLEARANCE) (6.75) no
#: point of the clearance margin (the footprint less the block) is closer to the goal through the opposite face
#: than through the one it entered by, so heading into the block never shortens the route.
INSIDE_COST = 8.0
#: Extra cost per metre of depth inside the footprint (depth: distance to its nearest face). Moving along a face's
#: direction toward the block can shorten the way out through that face by up to 1 per metre; any weight above 1
#: outweighs it, so every step toward the block lengthens the route.
DEPTH_COST = 2.0


def footprint() -> tuple[float, float]:
    """Half extents (hx, hy) in metres of the obstacle footprint inflated by :data:`CLEARANCE`."""
    return scene.OBSTACLE_HALF[0] + CLEARANCE, scene.OBSTACLE_HALF[1] + CLEARANCE


def route_distance(p: np.ndarray, goal: np.ndarray, obstacle_y: float) -> float:
    """Length (m) of the shortest path from ``p`` (3,) to ``goal`` (3,) that goes around the obstacle.

    In the table plane the path is the shortest one that avoids the open footprint of the obstacle inflated by
    :data:`CLEARANCE` (a rectangle centred at x = 0, y = ``obstacle_y``); height is added in quadrature. A point
    inside the footprint first leaves it through the face that costs least, travel inside costing
    :data:`INSIDE_COST` per metre, plus :data:`DEPTH_COST` per metre of depth, so the distance is continuous
    everywhere and a step toward the obstacle block never shortens it. A goal inside the footprint is treated the
    same way (between two points both inside this is an upper bound, not 0 at ``p == goal``; no task asks for it).
    """
    hx, hy = footprint()
    planar = _planar(float(p[0]), float(p[1]) - obstacle_y, float(goal[0]), float(goal[1]) - obstacle_y, hx, hy)
    return math.hypot(planar, float(goal[2] - p[2]))


def _planar(px: float, py: float, gx: float, gy: float, hx: float, hy: float) -> float:
    """Shortest planar path length around the open rectangle |x| < hx, |y| < hy (points relative to its centre)."""
    if abs(px) < hx and abs(py) < hy:
        exits = _exits(px, py, hx, hy)
        depth = min(d for *_, d in exits)
        return min(_planar(qx, qy, gx, gy, hx, hy) + INSIDE_COST * d for qx, qy, d in exits) + DEPTH_COST * depth
    if abs(gx) < hx and abs(gy) < hy:
        return _planar(gx, gy, px, py, hx, hy)
    if not _crosses(px, py, gx, gy, hx, hy):
        return math.hypot(gx - px, gy - py)
    return _around(px, py, gx, gy, hx, hy)


def _exits(x: float, y: float, hx: float, hy: float) -> tuple[tuple[float, float, float], ...]:
    """(exit x, exit y, distance) of the orthogonal projection of an inside point onto each face."""
    return ((x, -hy, y + hy), (x, hy, hy - y), (-hx, y, x + hx), (hx, y, hx - x))


def _crosses(px: float, py: float, gx: float, gy: float, hx: float, hy: float) -> bool:
    """Whether the segment p -> g passes through the open rectangle (Liang-Barsky clip, then its midpoint)."""
    t0, t1 = 0.0, 1.0
    dx, dy = gx - px, gy - py
    for d, lo, hi, o in ((dx, -hx, hx, px), (dy, -hy, hy, py)):
        if d == 0.0:
            if not lo < o < hi:
                return False
            continue
        a, b = (lo - o) / d, (hi - o) / d
        t0, t1 = max(t0, min(a, b)), min(t1, max(a, b))
    if t1 <= t0:
        return False
    tm = 0.5 * (t0 + t1)
    return abs(px + tm * dx) < hx and abs(py + tm * dy) < hy


def _around(px: float, py: float, gx: float, gy: float, hx: float, hy: float) -> float:
    """Shorter of the two taut strings from p around the rectangle to g (both outside it; the segment crosses it).

    The shortest path is p -> a corner p sees -> along the faces through a contiguous run of corners -> a corner g
    sees -> g. With four corners, trying every run in both directions (at most 2 x 4 x 3 candidates, each a few
    comparisons) and keeping the shortest visible one is exact and cheaper than a general visibility graph.
    """
    corners = ((hx, hy), (-hx, hy), (-hx, -hy), (hx, -hy))  # counter-clockwise
    best = math.inf
    for step in (1, -1):
        for i in range(4):
            cx, cy = corners[i]
            if not _sees(px, py, cx, cy, hx, hy):
                continue
            length = math.hypot(cx - px, cy - py)
            for k in range(3):
                if k:
                    nx, ny = corners[(i + step * k) % 4]
                    length += abs(nx - cx) + abs(ny - cy)
                    cx, cy = nx, ny
                if length >= best:
                    break
                if _sees(gx, gy, cx, cy, hx, hy):
                    best = min(best, length + math.hypot(gx - cx, gy - cy))
                    break
    return best


def _sees(x: float, y: float, cx: float, cy: float, hx: float, hy: float) -> bool:
    """Whether the outside point (x, y) sees corner (cx, cy): it lies on the outer side of a face through it."""
    return (x * cx >= hx * hx) or (y * cy >= hy * hy)


def route_distance_v1(p: np.ndarray, goal: np.ndarray, obstacle_y: float) -> float:
    """The route distance of the ``shaped_v1`` reward, kept bit for bit to reproduce earlier results.

    It checks for a crossing only when ``p`` starts outside the band y in [near, far] of the inflated footprint, so
    inside the band it returns the straight-line distance through the obstacle (a jump of up to 0.28 m at the
    band's edge), and it always bends around both corners of one side (another jump where the crossing test
    flips). Use :func:`route_distance`.
    """
    hx, hy = footprint()
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
