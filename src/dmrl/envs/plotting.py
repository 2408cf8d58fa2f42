"""Pictures of the MultiPath tasks: rendered frames, and top-down plots of tip paths by route."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # headless; must precede pyplot
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from dmrl.envs import scene  # noqa: E402

ROUTE_COLORS = {"left": "tab:blue", "right": "tab:orange", None: "tab:red"}


def draw_table(ax: plt.Axes, task: str) -> None:
    """Obstacle footprint and nominal pad / cup slots of ``task``, top view (x right, y away from robot)."""
    lay = scene.LAYOUTS[task]
    hx, hy, _ = scene.OBSTACLE_HALF
    ax.add_patch(
        plt.Rectangle((-hx, lay.obstacle_y - hy), 2 * hx, 2 * hy, color="saddlebrown", alpha=0.8, label="obstacle")
    )
    ax.add_patch(plt.Circle(lay.pad, scene.PAD_RADIUS, color="gold", alpha=0.6, label="pad"))
    for y in lay.cup_ys:
        ax.add_patch(plt.Circle((0.0, y), scene.CUP_RADIUS, fill=False, ls="--", color="gray"))
    ax.plot([0], [0], "ks", ms=8, label="robot base")
    ax.set_xlim(-0.4, 0.4)
    ax.set_ylim(-0.05, 0.85)
    ax.set_aspect("equal")
    ax.set_xlabel("x (m, robot's right)")
    ax.set_ylabel("y (m, away from robot)")


def plot_paths(
    ax: plt.Axes, paths: Sequence[np.ndarray], routes: Sequence[str | None], task: str, title: str = ""
) -> None:
    """Draw tip paths (each (T, >=2) in metres) coloured by route over the table of ``task``."""
    draw_table(ax, task)
    seen = set()
    for path, route in zip(paths, routes, strict=True):
        label = f"route {route}" if route not in seen else None
        seen.add(route)
        ax.plot(path[:, 0], path[:, 1], color=ROUTE_COLORS.get(route, "gray"), alpha=0.5, lw=1, label=label)
    counts = {r: sum(1 for x in routes if x == r) for r in ("left", "right", None)}
    ax.set_title(f"{title}\nleft {counts['left']} · right {counts['right']} · none {counts[None]}".strip())
    ax.legend(loc="upper right", fontsize=7)


def save_path_plot(
    paths: Sequence[np.ndarray], routes: Sequence[str | None], task: str, out: Path, title: str = ""
) -> Path:
    fig, ax = plt.subplots(figsize=(4.5, 5))
    plot_paths(ax, paths, routes, task, title)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=120)
    plt.close(fig)
    return out


def save_scene_figure(frames: dict[str, np.ndarray], out: Path) -> Path:
    """Save rendered frames side by side; ``frames`` maps a title to an (H, W, 3) uint8 image."""
    fig, axes = plt.subplots(1, len(frames), figsize=(3.2 * len(frames), 3.4))
    for ax, (title, img) in zip(np.atleast_1d(axes), frames.items(), strict=True):
        ax.imshow(img)
        ax.set_title(title, fontsize=9)
        ax.axis("off")
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=120)
    plt.close(fig)
    return out
