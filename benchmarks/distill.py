"""Distillation of the state diffusion policy (MultiPathGrasp) into a one- and a two-step student.

Run: ``python benchmarks/distill.py`` (collects the store and trains the teachers when absent). For each training
seed: the teacher (DDIM-10, configs/grasp_diffusion_state.yaml); the teacher run with one and two DDIM steps (the
same network without distillation: the baselines a student must beat); the students (``dmrl distill``, one and two
steps, of the size and with the DAgger rounds asked for). Each is evaluated on the same seeds (--eval-seed ..:
100000 for results, 200000 to choose settings): success, routes, collisions, and the decision latency at batch 1 on
one thread (torch and onnxruntime). The cost of a distillation is its whole wall time (DAgger's rollouts included)
over the teacher's training time, the teacher's seconds per step timed just before it in this process.
Runs already in --out are reused: a finished one (its checkpoint written) is evaluated again, not retrained; an
unfinished one (a crash, a stopped job) is continued with ``--resume`` and gets no cost column (its wall time is
not one piece). Delete a run's directory (and its ``-dagger`` one) to train it again.
Writes benchmarks/results/<name>.json and .md.
"""

from __future__ import annotations

import json
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from _common import machine, median_ms, parse_args, write_results
from dmrl.cli import main as dmrl
from dmrl.policies.checkpoint import load_policy
from dmrl.train.distill import visited_windows


@dataclass
class Args:
    out: Path = Path("outputs/distill")
    """Working directory: the store, teacher_seed*/ and student*_seed*/ runs."""
    seeds: list[int] = field(default_factory=lambda: [0])
    """Training seeds (teacher and students)."""
    student_steps: list[int] = field(default_factory=lambda: [1, 2])
    """Student network calls per chunk."""
    distill_steps: int = 1000
    """Optimizer steps of each distillation (its first round with --dagger-rounds)."""
    hidden_dim: int | None = None
    """Student MLP width (None: the teacher's, starting from its weights)."""
    n_blocks: int | None = None
    """Student MLP blocks (None: the teacher's)."""
    lr: float = 3e-4
    """Distillation peak learning rate."""
    batch_size: int = 256
    """Observations per distillation step (each labelled by the teacher's whole DDIM chain: the step's main cost)."""
    distance: str = "l2"
    """Distillation loss: l2 or pseudo_huber (dmrl distill --distance)."""
    start_fraction: float = 0.5
    """Share of each batch trained from the start of the teacher's chain (dmrl distill --start-fraction)."""
    dagger_rounds: int = 0
    """DAgger rounds after the first distillation (dmrl distill --dagger-rounds)."""
    dagger_episodes: int = 100
    """Student episodes per DAgger round."""
    dagger_steps: int = 500
    """Optimizer steps per DAgger round."""
    teacher_rows: bool = True
    """Evaluate the teacher (DDIM-10, and DDIM-1/2 without distillation) too."""
    eval_seed: int = 100_000
    """First evaluation seed: 100000 for results, 200000 for choosing settings."""
    name: str = "student"
    """Results file: benchmarks/results/<name>.json and .md."""
    episodes: int = 300
    """Expert episodes in the store."""
    eval_episodes: int = 100
    """Evaluation episodes per policy, seeds 100000.."""
    eval_envs: int = 2
    """Evaluation envs (1: stepped in this process, which is faster on a machine busy with other jobs)."""
    cost_steps: int = 200
    """Teacher training steps timed just before each distillation run here (0: no cost column)."""

    def tag(self, steps: int) -> str:
        """The student run's directory name (without the seed)."""
        size = f"_h{self.hidden_dim}b{self.n_blocks}" if self.hidden_dim or self.n_blocks else ""
        lr = f"_lr{self.lr:g}" if self.lr != 3e-4 else ""
        lr += f"_b{self.batch_size}" if self.batch_size != 256 else ""
        lr += f"_start{self.start_fraction:g}" if self.start_fraction != 0.5 else ""
        lr += "_ph" if self.distance == "pseudo_huber" else ""
        dagger = f"_d{self.dagger_rounds}x{self.dagger_episodes}e{self.dagger_steps}" if self.dagger_rounds else ""
        return f"student{steps}_s{self.distill_steps}{size}{lr}{dagger}"


def run_flags(run: Path) -> list[str] | None:
    """How to (re)start the ``dmrl train`` / ``dmrl distill`` run in ``run``: None when it is finished (its
    checkpoint written: reuse it), ``["--resume"]`` when it was started and not finished (its config.json, or a
    DAgger run's ``-dagger`` rounds, exist), ``[]`` when it is new."""
    if (run / "checkpoint" / "config.json").is_file():
        return None
    if (run / "config.json").is_file() or Path(f"{run}-dagger").is_dir():
        return ["--resume"]
    return []


STATE_CONFIG = "configs/grasp_diffusion_state.yaml"
"""The teacher's preset."""

FAR = 0.1
"""A chunk this far (RMS, normalised action units) from the teacher's chunk for the same noise counts as far."""


def store_windows(store: Path, n_obs_steps: int, n: int = 1000) -> np.ndarray:
    """``n`` observation windows (n, To, D) of the store's states, drawn uniformly (seed 0) from whole windows."""
    from dmrl.data import EpisodeStore

    s = EpisodeStore.open(store)
    states = np.asarray(s.array("state")[:])
    ends = np.asarray(s.episode_ends)
    starts = np.concatenate([[0], ends[:-1]])
    last = np.concatenate([np.arange(a + n_obs_steps - 1, b) for a, b in zip(starts, ends, strict=True)])
    last = np.random.default_rng(0).choice(last, min(n, len(last)), replace=False)
    return np.stack([states[last - n_obs_steps + 1 + i] for i in range(n_obs_steps)], 1)


@torch.no_grad()
def teacher_gap(policy, reference, windows: np.ndarray, name: str, n: int = 1000) -> dict[str, float]:
    """How far ``policy``'s chunk lands from the ``reference`` (the teacher, DDIM-10) chunk for the same noise, over
    up to ``n`` of ``windows`` (N, To, D): {gap_mse_<name>: mean squared distance, far_<name>: share of (window,
    noise) pairs farther than FAR (RMS)}, in normalised action units."""
    idx = np.random.default_rng(1).permutation(len(windows))[:n]
    obs = {"state": torch.as_tensor(windows[idx], dtype=torch.float32)}
    gen = torch.Generator().manual_seed(2)
    z = torch.randn(len(idx), policy.chunk.horizon, policy.action_dim, generator=gen)
    ref = reference.sample_chunk(*reference.condition(obs), init_noise=z)
    torch.manual_seed(3)  # a two-step student's re-noising draw
    out = policy.sample_chunk(*policy.condition(obs), init_noise=z)
    mse = (out - ref).pow(2).mean(dim=(1, 2))
    return {f"gap_mse_{name}": float(mse.mean()), f"far_{name}": float((mse.sqrt() > FAR).float().mean())}


def pooled(rows: list[dict], reference: str) -> list[dict]:
    """One row per policy over all its training seeds: success with a Wilson interval over every episode, the
    route and failure shares averaged, and the paired difference to ``reference`` (the teacher) on the same
    episode seeds: mean of (reference succeeded) - (policy succeeded), with a 95% bootstrap interval (10000
    resamples of the episodes, seed 0)."""
    from dmrl.train.metrics import wilson_interval

    ref = {(r["seed"], s) for r in rows if r["policy"] == reference for s in r["failed_seeds"]}
    ref_seeds = {r["seed"] for r in rows if r["policy"] == reference}
    out = []
    for name in dict.fromkeys(r["policy"] for r in rows):
        mine = [r for r in rows if r["policy"] == name]
        n = sum(r["episodes"] for r in mine)
        k = sum(round(r["success_rate"] * r["episodes"]) for r in mine)
        lo, hi = wilson_interval(k, n)
        row = {"policy": name, "seed": "all", "episodes": n, "success_rate": k / n, "ci_low": lo, "ci_high": hi}
        for key in ("route_left", "route_right", "collision_rate", "route_none", "grasp_none", "grasp_wrong"):
            row[key] = float(np.mean([r[key] for r in mine]))
        if name != reference and {r["seed"] for r in mine} <= ref_seeds:
            first = int(mine[0]["eval_seed"])
            diffs = np.array(
                [
                    float((r["seed"], e) not in ref) - float(e not in set(r["failed_seeds"]))
                    for r in mine
                    for e in range(first, first + r["episodes"])
                ]
            )
            rng = np.random.default_rng(0)
            boot = [diffs[rng.integers(0, len(diffs), len(diffs))].mean() for _ in range(10_000)]
            row |= {"teacher_minus": float(diffs.mean())}
            low, high = np.percentile(boot, [2.5, 97.5])
            row |= {"teacher_minus_ci_low": float(low), "teacher_minus_ci_high": float(high)}
        out.append(row)
    return out


def decision_ms(planner, policy, reps: int = 200) -> float:
    """Median ms of one plan (a chunk from To frames) at batch 1 on one thread."""
    obs = {"state": torch.zeros(1, policy.chunk.n_obs_steps, int(policy.obs_dims["state"]))}
    return median_ms(lambda: planner(obs), reps, warmup=20)


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


def teacher_step_seconds(steps: int, store: Path, config: str = STATE_CONFIG) -> float:
    """Seconds per step of the teacher's training (``steps`` steps of ``config`` on ``store``)."""
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        run = Path(tmp) / "t"
        argv = ["train", "--config", config, "--dataset", str(store), "--out", str(run)]
        assert dmrl([*argv, "--steps", str(steps), "--eval-episodes", "0"]) == 0
        return json.loads((run / "summary.json").read_text())["train_seconds"] / steps


def distill(args: Args, teacher: Path, out: Path, seed: int, steps: int, flags: list[str]) -> float:
    """Run ``dmrl distill`` into ``out`` (``flags``: :func:`run_flags`'s and any more); -> its wall seconds (rounds
    and DAgger rollouts included)."""
    argv = ["distill", "--teacher", str(teacher), "--out", str(out), "--seed", str(seed), "--lr", str(args.lr)]
    argv += flags
    argv += ["--steps", str(args.distill_steps), "--student-steps", str(steps)]
    argv += ["--start-fraction", str(args.start_fraction)] if args.start_fraction != 0.5 else []
    argv += ["--batch-size", str(args.batch_size)] if args.batch_size != 256 else []
    argv += ["--distance", args.distance] if args.distance != "l2" else []
    argv += ["--hidden-dim", str(args.hidden_dim)] if args.hidden_dim else []
    argv += ["--n-blocks", str(args.n_blocks)] if args.n_blocks else []
    if args.dagger_rounds:
        argv += ["--dagger-rounds", str(args.dagger_rounds), "--dagger-episodes", str(args.dagger_episodes)]
        argv += ["--dagger-steps", str(args.dagger_steps), "--eval-envs", str(args.eval_envs)]
    t = time.perf_counter()
    assert dmrl(argv) == 0
    return time.perf_counter() - t


def distill_with_cost(
    args, teacher_run: Path, out: Path, seed: int, steps: int, flags: list[str], store: Path, config: str = STATE_CONFIG
) -> None:
    """:func:`distill` from ``teacher_run``'s checkpoint; a new run (no --resume in ``flags``) with ``args.cost_steps``
    also writes ``out/cost.json``: its wall time over the teacher's training time, the teacher's step (``config`` on
    ``store``) timed just before. A resumed run's wall time is not the whole run's, so it gets none."""
    cost = {}
    if args.cost_steps and "--resume" not in flags:
        t_step = teacher_step_seconds(args.cost_steps, store, config)
        cost = {"teacher_s_per_step": t_step, "load_avg_1min": os.getloadavg()[0]}
    wall = distill(args, teacher_run / "checkpoint", out, seed, steps, flags)
    if cost:
        teacher_steps = json.loads((teacher_run / "summary.json").read_text())["train_steps"]
        cost |= {"distill_wall_s": wall, "cost_vs_teacher": wall / (teacher_steps * cost["teacher_s_per_step"])}
        (out / "cost.json").write_text(json.dumps(cost) + "\n")


def row(name: str, seed: int, policy, env: tuple[str, dict], args: Args, gap: tuple | None = None, **extra) -> dict:
    """Evaluate ``policy``; ``gap`` (the reference teacher, the store's windows): also its distance to the
    teacher's chunks on the store's windows and on the windows it planned from in these episodes (``own``)."""
    seeds = list(range(args.eval_seed, args.eval_seed + args.eval_episodes))
    own, evaluated = visited_windows(policy.cpu(), env[0], env[1], seeds, args.eval_envs)
    result = evaluated.summary()
    if gap is not None:
        extra |= teacher_gap(policy, gap[0], gap[1], "store") | teacher_gap(policy, gap[0], own["state"], "own")
    # Per-episode outcomes (JSON only): the same seeds for every policy, so failures can be paired across rows.
    failed = sorted(r.seed for r in evaluated.records if not r.success)
    collided = sorted(r.seed for r in evaluated.records if r.collision)
    out = {
        "policy": name,
        "seed": seed,
        "eval_seed": args.eval_seed,
        "episodes": result["episodes"],
        "success_rate": result["success_rate"],
        "ci_low": result["ci_low"],
        "ci_high": result["ci_high"],
        "route_left": result["route_left"],
        "route_right": result["route_right"],
        "collision_rate": result["collision_rate"],
        "route_none": result["route_none"],
        "grasp_none": result["grasp_none"],
        "grasp_wrong": result["grasp_wrong"],
        **latencies(policy),
        **extra,
        "failed_seeds": failed,
        "collided_seeds": collided,
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
        flags = run_flags(run)
        if flags is not None:
            argv = [
                "train",
                "--config",
                STATE_CONFIG,
                "--dataset",
                str(store),
                "--out",
                str(run),
            ]
            assert dmrl([*argv, *flags, "--seed", str(seed), "--eval-episodes", "0"]) == 0
        teacher, meta = load_policy(run / "checkpoint")
        env = (meta["env_id"], meta["env_kwargs"])
        teacher_success = {}
        reference, _ = load_policy(run / "checkpoint")  # the teacher's own chain (DDIM-10, deterministic)
        reference.set_sampler(reference.sampler.num_steps, eta=0.0)
        gap = (reference, store_windows(store, reference.chunk.n_obs_steps))
        if args.teacher_rows:
            name = f"teacher DDIM-{teacher.sampler.num_steps}"
            rows.append(row(name, seed, teacher, env, args, train_seconds=meta["train_seconds"]))
            teacher_success = {"teacher_success_rate": rows[-1]["success_rate"]}
            for n in sorted(set(args.student_steps)):  # the same network with as many calls, without distillation
                teacher.set_sampler(n)
                name = f"teacher DDIM-{n} (no distillation)"
                rows.append(row(name, seed, teacher, env, args, gap, **teacher_success))
        for steps in args.student_steps:
            srun = args.out / f"{args.tag(steps)}_seed{seed}"
            extra: dict = dict(teacher_success)
            flags = run_flags(srun)
            if flags is not None:
                distill_with_cost(args, run, srun, seed, steps, flags, store)
            if (srun / "cost.json").exists():
                extra |= json.loads((srun / "cost.json").read_text())
            student, _ = load_policy(srun / "checkpoint")
            settings = args.tag(steps).removeprefix(f"student{steps}_s{args.distill_steps}").replace("_", " ").strip()
            name = f"student {steps}-step" + (f" ({settings})" if settings else "")
            rows.append(row(name, seed, student, env, args, gap, **extra))
    meta = {
        **machine(),
        "command": " ".join(["python benchmarks/distill.py", *sys.argv[1:]]),
        "args": {k: str(v) for k, v in vars(args).items()},
        "note": "train_seconds: the teacher's training wall time when it was trained (2 cores, other jobs beside it); "
        "cost_vs_teacher: distill_wall_s (the whole dmrl distill run, DAgger rollouts included) / (teacher steps x "
        "teacher_s_per_step), the teacher's step timed over cost_steps steps just before the distillation, "
        "load_avg_1min the machine's load then; decision_ms_*: one plan at batch 1, one thread; gap_mse_* / far_*: the "
        "mean squared distance (normalised actions) between the policy's chunk and the teacher's DDIM-10 chunk from "
        "the same noise, and the share of pairs farther than 0.1 RMS, on 1000 store windows (store) and on up to 1000 "
        "of the windows the policy planned from in its evaluation episodes (own)",
    }
    columns = ["policy", "seed", "episodes", "success_rate", "ci_low", "ci_high", "route_left", "route_right"]
    columns += [
        "collision_rate",
        "route_none",
        "grasp_none",
        "grasp_wrong",
        "teacher_success_rate",
        "gap_mse_store",
        "far_store",
        "gap_mse_own",
        "far_own",
        "decision_ms_torch",
        "decision_ms_onnxruntime",
    ]
    columns += ["train_seconds", "distill_wall_s", "teacher_s_per_step", "cost_vs_teacher", "load_avg_1min"]
    if args.teacher_rows:  # pooled over the training seeds, each paired with its teacher on the same episodes
        rows += pooled(rows, next(r["policy"] for r in rows if r["policy"].startswith("teacher DDIM-")))
        columns[6:6] = ["teacher_minus", "teacher_minus_ci_low", "teacher_minus_ci_high"]
    write_results(args.name, rows, meta, columns)


if __name__ == "__main__":
    main()
