"""Distillation of the multimodal diffusion policy (MultiPathGrasp from rgb + depth + joints + force + instruction)
into a one-step student: issue 29's multimodal target (within 5 points of its teacher on train and on held-out
paraphrases; the full decision's latency is benchmarks/export_latency.py --checkpoints on the runs written here).

Run: ``python benchmarks/distill_multimodal.py`` (collects the multimodal benchmark's dataset and trains the teacher
when absent). For each training seed: the teacher (--config, default configs/grasp_multimodal_cpu.yaml, on
outputs/multimodal/dataset_recovery.zarr: 300 expert + 100 recovery episodes, as benchmarks/multimodal.py); the
teacher run with --baseline-steps DDIM steps (the same network without distillation); the student (``dmrl distill``,
the teacher's encoder frozen and its encoding shared with the teacher's chain, images cached). Each is evaluated on
the same episodes of both paraphrase sets (--eval-seed ..: 100000 for results, 200000 to choose settings): success
with its Wilson interval, routes, collisions, grasps, and the paired difference teacher - policy over the same
episodes with a bootstrap interval. The cost of a distillation is its wall time (DAgger's rollouts included) over
the teacher's training time, the teacher's seconds per step timed over --cost-steps steps just before it.
Finished runs in --out are reused, unfinished ones continued (as benchmarks/distill.py). Writes
benchmarks/results/<name>.json and .md.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from pathlib import Path

from _common import machine, parse_args, write_results
from distill import distill_with_cost, pooled, run_flags
from dmrl.cli import main as dmrl
from dmrl.policies.checkpoint import load_policy
from multimodal import DATASET, collect_if_missing

PARAPHRASES = ("train", "heldout")


@dataclass
class Args:
    out: Path = Path("outputs/distill_mm")
    """Working directory: teacher_seed*/ and student*_seed*/ runs."""
    config: str = "configs/grasp_multimodal_cpu.yaml"
    """The teacher's preset."""
    dataset: Path = DATASET
    """The episode store (collected as benchmarks/multimodal.py does when missing)."""
    seeds: list[int] = field(default_factory=lambda: [0])
    """Training seeds (teacher and student)."""
    student_steps: int = 1
    """Student network calls per chunk."""
    distill_steps: int = 1000
    """Optimizer steps of the distillation (its first round with --dagger-rounds)."""
    batch_size: int = 256
    """Observations per distillation step."""
    noise_samples: int = 1
    """Noises (teacher chains) per observation (dmrl distill --noise-samples)."""
    lr: float = 3e-4
    """Distillation peak learning rate."""
    dagger_rounds: int = 0
    """DAgger rounds after the first distillation (dmrl distill --dagger-rounds)."""
    dagger_episodes: int = 100
    """Student episodes per DAgger round."""
    dagger_steps: int = 300
    """Optimizer steps per DAgger round."""
    baseline_steps: list[int] = field(default_factory=lambda: [1])
    """The teacher run with these DDIM steps, without distillation (none: no baseline rows)."""
    eval_seed: int = 100_000
    """First evaluation seed: 100000 for results, 200000 for choosing settings."""
    eval_episodes: int = 100
    """Evaluation episodes per policy and paraphrase set."""
    eval_envs: int = 2
    """Evaluation envs (worker processes)."""
    cost_steps: int = 100
    """Teacher training steps timed just before each distillation run here (0: no cost column)."""
    name: str = "student_multimodal"
    """Results file: benchmarks/results/<name>.json and .md."""

    # Read by distill.distill (benchmarks/distill.py's flags this script keeps at their defaults).
    start_fraction: float = 0.5
    """Share of each batch trained from the start of the teacher's chain (dmrl distill --start-fraction)."""
    distance: str = "l2"
    hidden_dim: int | None = None
    n_blocks: int | None = None

    def tag(self) -> str:
        """The student run's directory name (without the seed)."""
        tag = f"student{self.student_steps}_s{self.distill_steps}_b{self.batch_size}"
        tag += f"_n{self.noise_samples}" if self.noise_samples != 1 else ""
        tag += f"_lr{self.lr:g}" if self.lr != 3e-4 else ""
        tag += f"_d{self.dagger_rounds}x{self.dagger_episodes}e{self.dagger_steps}" if self.dagger_rounds else ""
        return tag


def evaluate_rows(name: str, seed: int, policy, meta: dict, args: Args, **extra) -> list[dict]:
    """``policy`` on --eval-episodes episodes of each paraphrase set: one row each, with its failed seeds."""
    from dmrl.train.evaluate import evaluate

    rows = []
    seeds = list(range(args.eval_seed, args.eval_seed + args.eval_episodes))
    for paraphrases in PARAPHRASES:
        kwargs = {**meta["env_kwargs"], "paraphrases": paraphrases}
        ev = evaluate(policy, meta["env_id"], seeds, kwargs, n_envs=args.eval_envs, workers=args.eval_envs > 1)
        result = ev.summary()
        keys = ["episodes", "success_rate", "ci_low", "ci_high", "route_left", "route_right", "collision_rate"]
        keys += ["route_none", "grasp_none", "grasp_wrong"]
        rows.append(
            {
                "policy": name,
                "paraphrases": paraphrases,
                "seed": seed,
                "eval_seed": args.eval_seed,
                **{k: result[k] for k in keys},
                **extra,
                "failed_seeds": sorted(r.seed for r in ev.records if not r.success),
            }
        )
        print(json.dumps(rows[-1]), flush=True)
    return rows


def main() -> None:
    args = parse_args(Args, __doc__, allow_empty=("baseline_steps",))
    if args.eval_episodes < 1 or args.distill_steps < 1:
        sys.exit(f"--eval-episodes / --distill-steps: got {args.eval_episodes} / {args.distill_steps}; need >= 1")
    if not Path(args.config).is_file():
        sys.exit(f"--config: no file {args.config}; pass a preset YAML such as configs/grasp_multimodal_cpu.yaml")
    if args.dataset == DATASET:
        collect_if_missing(args.dataset, 300, 100, 64)
    elif not args.dataset.exists():
        sys.exit(f"--dataset {args.dataset}: no such store; collect one (README) or leave the flag out")
    rows: list[dict] = []
    for seed in args.seeds:
        run = args.out / f"teacher_seed{seed}"
        flags = run_flags(run)
        if flags is not None:
            argv = ["train", "--config", args.config, "--dataset", str(args.dataset), "--out", str(run)]
            assert dmrl([*argv, *flags, "--seed", str(seed), "--eval-episodes", "0"]) == 0
        teacher, meta = load_policy(run / "checkpoint")
        name = f"teacher DDIM-{teacher.sampler.num_steps}"
        rows += evaluate_rows(name, seed, teacher, meta, args, train_seconds=meta["train_seconds"])
        for n in args.baseline_steps:
            teacher.set_sampler(n)
            rows += evaluate_rows(f"teacher DDIM-{n} (no distillation)", seed, teacher, meta, args)
        srun = args.out / f"{args.tag()}_seed{seed}"
        flags = run_flags(srun)
        if flags is not None:
            flags += ["--cache-images", "--noise-samples", str(args.noise_samples)]
            distill_with_cost(args, run, srun, seed, args.student_steps, flags, args.dataset, args.config)
        extra = json.loads((srun / "cost.json").read_text()) if (srun / "cost.json").exists() else {}
        student, _ = load_policy(srun / "checkpoint")
        rows += evaluate_rows(f"student {args.student_steps}-step ({args.tag()})", seed, student, meta, args, **extra)
    teacher_name = next(r["policy"] for r in rows if r["policy"].startswith("teacher DDIM-"))
    for paraphrases in PARAPHRASES:  # pooled over seeds, each policy paired with its teacher on the same episodes
        mine = [r for r in rows if r["paraphrases"] == paraphrases]
        rows += [r | {"paraphrases": paraphrases} for r in pooled(mine, teacher_name)]
    columns = ["policy", "paraphrases", "seed", "episodes", "success_rate", "ci_low", "ci_high"]
    columns += ["teacher_minus", "teacher_minus_ci_low", "teacher_minus_ci_high", "route_left", "route_right"]
    columns += ["collision_rate", "grasp_none", "grasp_wrong", "train_seconds", "distill_wall_s"]
    columns += ["teacher_s_per_step", "cost_vs_teacher", "load_avg_1min"]
    meta = {
        **machine(),
        "command": " ".join(["python benchmarks/distill_multimodal.py", *sys.argv[1:]]),
        "args": {k: str(v) for k, v in vars(args).items()},
        "note": "teacher_minus: (teacher succeeded) - (policy succeeded) over the same episodes, pooled over seeds, "
        "95% bootstrap interval; cost_vs_teacher: the whole dmrl distill run's wall time / (teacher steps x "
        "teacher_s_per_step), the teacher's step timed over cost_steps steps just before the distillation, "
        "load_avg_1min the machine's load then; train_seconds: the teacher's training wall time when it was trained",
    }
    write_results(args.name, rows, meta, columns)


if __name__ == "__main__":
    main()
