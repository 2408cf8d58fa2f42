"""DDIM steps vs success and latency for one trained diffusion checkpoint (S = 1, 2, 5, 10, 20, 50).

Run: ``python benchmarks/ablation_ddim_steps.py --checkpoint outputs/compare_state/runs/diffusion_lr0.001/checkpoint``.
Writes benchmarks/results/ablation_ddim_steps.json and .md. Latency: ms per chunk (predict_chunk) at batch 1
on one CPU thread, median of repeated calls.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import numpy as np
import torch

from _common import machine, parse_args, write_results
from dmrl.policies.checkpoint import load_policy
from dmrl.train.evaluate import evaluate


def chunk_latency_ms(policy, obs_dim: int, repeats: int = 50) -> float:
    obs = {"state": torch.zeros(1, policy.chunk.n_obs_steps, obs_dim)}
    for _ in range(3):
        policy.predict_chunk(obs)
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        policy.predict_chunk(obs)
        times.append((time.perf_counter() - t) * 1e3)
    return float(np.median(times))


@dataclass
class Args:
    checkpoint: Path
    """a trained diffusion run's checkpoint/ folder"""
    episodes: int = 100
    """evaluation episodes per step count"""
    steps: list[int] = field(default_factory=lambda: [1, 2, 5, 10, 20, 50])
    """DDIM step counts S"""
    seed: int = 100_000
    """first evaluation seed"""
    head: Literal["both", "eps", "x0", "blend"] = "both"
    """hybrid: sampling head"""
    name: str = "ablation_ddim_steps"
    """results file stem"""


def main() -> None:
    args = parse_args(Args, __doc__)
    torch.set_num_threads(1)
    policy, meta = load_policy(args.checkpoint)
    rows = []
    for s in args.steps:
        policy.set_sampler(s, head=args.head)
        res = evaluate(policy, meta["env_id"], list(range(args.seed, args.seed + args.episodes)), n_envs=2)
        rows.append(
            {
                "ddim_steps": s,
                "episodes": res.episodes,
                "success_rate": res.success_rate,
                "ci_low": res.ci_low,
                "ci_high": res.ci_high,
                "collision_rate": res.collision_rate,
                "route_left": res.route_left,
                "route_right": res.route_right,
                "jerk": res.jerk,
                "chunk_latency_ms": chunk_latency_ms(policy, policy.obs_dims["state"]),
            }
        )
        print(rows[-1], flush=True)
    meta_out = {
        **machine(),
        "command": f"python benchmarks/ablation_ddim_steps.py --checkpoint {args.checkpoint}",
        "threads": 1,
        "denoiser": policy.config.denoiser,
        "prediction_type": policy.config.prediction_type,
    }
    write_results("ablation_ddim_steps", rows, meta_out, list(rows[0]))


if __name__ == "__main__":
    main()
