"""Distillation of the state diffusion policy (MultiPathGrasp) into a one- and a two-step student.

Run: ``python benchmarks/distill.py`` (collects the store and trains the teachers when absent). For each training
seed: the teacher (DDIM-10, configs/grasp_diffusion_state.yaml); the teacher run with one and two DDIM steps (the
same network without distillation: the baselines a student must beat); the students (``dmrl distill``, one and two
steps). Each is evaluated on the same seeds (100000..): success, routes, collisions, and the decision latency at
batch 1 on one thread (torch and onnxruntime). The cost of distillation is timed against the teacher's training.
Writes benchmarks/results/student.json and .md.
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
    cost_steps: int = 200
    """Steps of the back-to-back timing of teacher training and distillation (0: skip it)."""


def decision_ms(planner, policy, reps: int = 200) -> float:
    """Median ms of one plan (a chunk from To frames) at batch 1 on one thread."""
    obs = {"state": torch.zeros(1, policy.chunk.n_obs_steps, int(policy.obs_dims["state"]))}
    times = []
    for i in range(reps + 20):
        t = time.perf_counter()
        planner(obs)
        if i >= 20:
            times.append((time.perf_counter() - t) * 1e3)
    return float(np.median(times))


def latencies(policy) -> dict[str, float]:
    """Decision latency in eager torch and in onnxruntime (the exported graph, checked against torch)."""
    import tempfile

    from dmrl.export import OnnxPlanner, export_onnx

    torch.set_num_threads(1)
    out = {"decision_ms_torch": decision_ms(policy.predict_chunk, policy)}
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "p.onnx"
        export_onnx(policy, path)
        out["decision_ms_onnxruntime"] = decision_ms(OnnxPlanner(path, threads=1), policy)
    return out


def step_seconds(args: Args, store: Path, teacher: Path, student_steps: int) -> tuple[float, float]:
    """Seconds per step of the teacher's training and of a distillation, timed back to back in this process
    (``cost_steps`` each, one after the other, so both see the same machine)."""
    import shutil
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        t_run, s_run = Path(tmp) / "t", Path(tmp) / "s"
        argv = ["train", "--config", "configs/grasp_diffusion_state.yaml", "--dataset", str(store), "--out", str(t_run)]
        assert dmrl([*argv, "--steps", str(args.cost_steps), "--eval-episodes", "0"]) == 0
        argv = ["distill", "--teacher", str(teacher), "--out", str(s_run), "--steps", str(args.cost_steps)]
        assert dmrl([*argv, "--student-steps", str(student_steps)]) == 0
        per = [json.loads((r / "summary.json").read_text())["train_seconds"] / args.cost_steps for r in (t_run, s_run)]
        shutil.rmtree(tmp, ignore_errors=True)
    return per[0], per[1]


def row(name: str, seed: int, policy, env: tuple[str, dict], args: Args, **extra) -> dict:
    seeds = list(range(100_000, 100_000 + args.eval_episodes))
    result = evaluate(policy.cpu(), env[0], seeds, env[1], n_envs=args.eval_envs).summary()
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
        **latencies(policy),
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
        rows.append(row(f"teacher DDIM-{teacher.sampler.num_steps}", seed, teacher, env, args, train_seconds=teacher_s))
        teacher_success = {"teacher_success_rate": rows[-1]["success_rate"]}
        for n in sorted(set(args.student_steps)):  # the same network with as many calls, without distillation
            teacher.set_sampler(n)
            rows.append(row(f"teacher DDIM-{n} (no distillation)", seed, teacher, env, args, **teacher_success))
        for steps in args.student_steps:
            srun = args.out / f"student{steps}_s{args.distill_steps}_seed{seed}"
            if not (srun / "checkpoint").exists():
                argv = ["distill", "--teacher", str(run / "checkpoint"), "--out", str(srun), "--seed", str(seed)]
                assert dmrl([*argv, "--steps", str(args.distill_steps), "--student-steps", str(steps)]) == 0
            student, smeta = load_policy(srun / "checkpoint")
            extra = {**teacher_success, "train_seconds": smeta["train_seconds"]}
            if args.cost_steps and seed == args.seeds[0]:
                t_step, s_step = step_seconds(args, store, run / "checkpoint", steps)
                teacher_steps = json.loads((run / "summary.json").read_text())["train_steps"]
                extra["cost_vs_teacher"] = (s_step * args.distill_steps) / (t_step * teacher_steps)
            rows.append(row(f"student {steps}-step", seed, student, env, args, **extra))
    meta = {
        **machine(),
        "command": " ".join(["python benchmarks/distill.py", *sys.argv[1:]]),
        "args": {k: str(v) for k, v in vars(args).items()},
        "note": "train_seconds: the runs' wall times on 2 cores (other jobs ran beside some of them); cost_vs_teacher: "
        "distill_steps x seconds per distillation step / (teacher steps x seconds per teacher step), both timed back "
        "to back over cost_steps steps; chunk_ms_torch: predict_chunk at batch 1, one thread, eager torch",
    }
    columns = ["policy", "seed", "episodes", "success_rate", "ci_low", "ci_high", "route_left", "route_right"]
    columns += ["collision_rate", "teacher_success_rate", "decision_ms_torch", "decision_ms_onnxruntime"]
    write_results("student", rows, meta, [*columns, "train_seconds", "cost_vs_teacher"])


if __name__ == "__main__":
    main()
