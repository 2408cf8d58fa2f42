"""Scripted experts: success and route share over many seeds, and the failure of the averaged plan.

Run: ``python benchmarks/experts.py``. Success rates carry 95% Wilson intervals and episode counts.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from _common import machine, parse_args, write_results
from dmrl.data.collect import record_episode
from dmrl.envs import make_env
from dmrl.envs.experts import ExpertConfig, ScriptedExpert, mean_plan_episode
from dmrl.train.metrics import wilson_interval


def averaged_plan_outcomes(env_id: str, seeds: range) -> tuple[int, int]:
    """(failures, collisions) of open-loop execution of the step-wise mean of a left and a right plan."""
    env = make_env(env_id, obs_modes=("state",))
    outcomes = [mean_plan_episode(env, seed)[0] for seed in seeds]
    return sum(not i["is_success"] for i in outcomes), sum(bool(i["collision"]) for i in outcomes)


def draw_route_plots(n: int = 60) -> None:
    """Top views of the expert's tip paths on seeds 0..n-1 (docs/routes_grasp.png, docs/routes_reach.png)."""
    from dmrl.envs.plotting import save_path_plot

    for env_id, task in (("dmrl/MultiPathGrasp-v0", "grasp"), ("dmrl/MultiPathReach-v0", "reach")):
        env = make_env(env_id, obs_modes=("state",))
        eps = [record_episode(env, ScriptedExpert(env), s) for s in range(n)]
        out = Path(__file__).resolve().parents[1] / "docs" / f"routes_{task}.png"
        save_path_plot(
            [e.obs["state"][:, :2] for e in eps],
            [e.route for e in eps],
            task,
            out,
            title=f"{env_id}: {n} expert episodes",
        )


@dataclass
class Args:
    episodes: int = 500
    """expert episodes per environment"""
    average_seeds: int = 100
    """seeds of the averaged-plan check"""
    plots_only: bool = False
    """only redraw docs/routes_{grasp,reach}.png"""


def main() -> None:
    args = parse_args(Args, __doc__)
    draw_route_plots()
    if args.plots_only:
        return
    rows = []
    for env_id in ("dmrl/MultiPathGrasp-v0", "dmrl/MultiPathReach-v0"):
        env = make_env(env_id, obs_modes=("state",))
        for label, cfg in (
            ("expert", ExpertConfig()),
            ("noisy (std 0.2)", ExpertConfig(noise_std=0.2)),
            ("suboptimal", ExpertConfig(suboptimal=True)),
        ):
            eps = [record_episode(env, ScriptedExpert(env, cfg), s) for s in range(args.episodes)]
            k = sum(e.success for e in eps)
            lo, hi = wilson_interval(k, len(eps))
            rows.append(
                {
                    "env": env_id,
                    "policy": label,
                    "episodes": len(eps),
                    "success_rate": k / len(eps),
                    "ci_low": lo,
                    "ci_high": hi,
                    "route_left": np.mean([e.route == "left" for e in eps]),
                    "route_right": np.mean([e.route == "right" for e in eps]),
                    "collision_rate": float(np.mean([e.info["collision"] for e in eps])),
                    "mean_length": float(np.mean([e.length for e in eps])),
                }
            )
        fails, cols = averaged_plan_outcomes(env_id, range(args.average_seeds))
        n = args.average_seeds
        lo, hi = wilson_interval(n - fails, n)
        rows.append(
            {
                "env": env_id,
                "policy": "mean of left+right plans (open loop)",
                "episodes": n,
                "success_rate": (n - fails) / n,
                "ci_low": lo,
                "ci_high": hi,
                "route_left": "",
                "route_right": "",
                "collision_rate": cols / n,
                "mean_length": "",
            }
        )
    meta = {
        **machine(),
        "command": f"python benchmarks/experts.py --episodes {args.episodes} --average-seeds {args.average_seeds}",
        "seeds": "0..N-1 per row",
    }
    write_results(
        "experts",
        rows,
        meta,
        [
            "env",
            "policy",
            "episodes",
            "success_rate",
            "ci_low",
            "ci_high",
            "route_left",
            "route_right",
            "collision_rate",
            "mean_length",
        ],
    )


if __name__ == "__main__":
    main()
