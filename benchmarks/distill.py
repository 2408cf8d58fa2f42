"""Distillation of the state diffusion policy (MultiPathGrasp) into a one- and a two-step student.

Run: ``python benchmarks/distill.py`` (collects the store and trains the teachers when absent; about 20 minutes
per training seed on 2 cores). For each training seed: the teacher (DDIM-10, configs/grasp_diffusion_state.yaml), the
teacher run with one DDIM step (the same network without distillation, the baseline a student must beat), and the
students (``dmrl distill``, one and two steps); each evaluated on the same seeds (100000..) with success, routes
and collisions, the chunk latency at batch 1 on one thread (torch), and the distillation's wall time against the
teacher's. Writes benchmarks/results/distill.json and .md.
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from _common import machine, parse_args, write_results
from dmrl.cli import main as dmrl
from dmrl.policies.checkpoint import load_policy
from dmrl.train.evaluate import evaluate


@dataclass
class Args:
    out: Path = Path("outputs/distill")
    """Working directory: the store, teacher_seed*/ and student*_seed*/ runs."""
    seeds: list[int] = field(default_factory=lambda: [0])
    """Training seeds (teacher and students)."""
    student_steps: list[int] = field(default_factory=lambda: [1, 2])
    """Student network calls per chunk."""
    distill_steps: int = 1000
    """Optimizer steps of each distillation."""
    episodes: int = 300
    """Expert episodes in the store."""
    eval_episodes: int = 100
    """Evaluation episodes per policy, seeds 100000.."""
    eval_envs: int = 2
    """Evaluation env processes."""


def chunk_ms(policy, reps: int = 200) -> float:
    """Median ms of predict_chunk at batch 1 on one thread."""
    obs = {"state": torch.zeros(1, policy.chunk.n_obs_steps, int(policy.obs_dims["state"]))}
    times = []
    for i in range(reps + 20):
        t = time.perf_counter()
        policy.predict_chunk(obs)
        if i >= 20:
            times.append((time.perf_counter() - t) * 1e3)
    return float(np.median(times))


def row(name: str, seed: int, policy, env: tuple[str, dict], args: Args, **extra) -> dict:
    seeds = list(range(100_000, 100_000 + args.eval_episodes))
    result = evaluate(policy.cpu(), env[0], seeds, env[1], n_envs=args.eval_envs).summary()
    torch.set_num_threads(1)
    out = {
        "policy": name,
        "seed": seed,
        "episodes": result["episodes"],
        "success_rate": result["success_rate"],
        "ci_low": result["ci_low"],
        "ci_high": result["ci_high"],
        "route_left": result["route_left"],
        "route_right": result["route_right"],
        "collision_rate": result["collision_rate"],
        "chunk_ms_torch": chunk_ms(policy),
        **extra,
    }
    print(json.dumps(out), flush=True)
    return out


def main() -> None:
    args = parse_args(Args, __doc__)
    store = args.out / "grasp_state.zarr"
    if not store.exists():
        argv = ["collect", "--out", str(store), "--episodes", str(args.episodes), "--obs-modes", "state"]
        assert dmrl(argv) == 0
    rows = []
    for seed in args.seeds:
        run = args.out / f"teacher_seed{seed}"
        if not (run / "checkpoint").exists():
            argv = [
                "train",
                "--config",
                "configs/grasp_diffusion_state.yaml",
                "--dataset",
                str(store),
                "--out",
                str(run),
            ]
            assert dmrl([*argv, "--seed", str(seed), "--eval-episodes", "0"]) == 0
        teacher, meta = load_policy(run / "checkpoint")
        env = (meta["env_id"], meta["env_kwargs"])
        teacher_s = meta["train_seconds"]
        rows.append(row("teacher DDIM-10", seed, teacher, env, args, train_seconds=teacher_s))
        teacher.set_sampler(1)
        rows.append(row("teacher DDIM-1 (no distillation)", seed, teacher, env, args))
        for steps in args.student_steps:
            srun = args.out / f"student{steps}_s{args.distill_steps}_seed{seed}"
            if not (srun / "checkpoint").exists():
                argv = ["distill", "--teacher", str(run / "checkpoint"), "--out", str(srun), "--seed", str(seed)]
                assert dmrl([*argv, "--steps", str(args.distill_steps), "--student-steps", str(steps)]) == 0
            student, smeta = load_policy(srun / "checkpoint")
            s = smeta["train_seconds"]
            rows.append(
                row(f"student {steps}-step", seed, student, env, args, train_seconds=s, cost_vs_teacher=s / teacher_s)
            )
    meta = {
        **machine(),
        "command": " ".join(["python benchmarks/distill.py", *sys.argv[1:]]),
        "args": {k: str(v) for k, v in vars(args).items()},
        "note": "train_seconds are wall times on 2 shared cores (other jobs ran beside some of them); "
        "chunk_ms_torch: predict_chunk at batch 1, one thread, eager torch",
    }
    columns = ["policy", "seed", "episodes", "success_rate", "ci_low", "ci_high", "route_left", "route_right"]
    columns += ["collision_rate", "chunk_ms_torch", "train_seconds", "cost_vs_teacher"]
    write_results("distill", rows, meta, columns)


if __name__ == "__main__":
    main()
