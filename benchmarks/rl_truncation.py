"""Truncated backprop through the DDIM chain in Diffusion-QL: k = 1, 2 and S of the S denoising steps carry
the Q gradient. Update throughput (samples/s, one thread, nothing else running) and final success on `mixed`.

Run: ``python benchmarks/rl_truncation.py [--ks 1 2 S] [--seeds 0 1 2]`` after (or instead of) rl_offline.py:
k = S is rl_offline's diffusion-ql run and is read back from outputs/rl_offline when it finished there with the
same settings. Writes benchmarks/results/rl_truncation.json and .md, and the learning curves (as rl_offline.py's:
--curve-every, --curve-episodes) to docs/rl_truncation.png and rl_truncation_curves.json. Settings:
configs/rl_offline.yaml.
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated

import tyro

from _common import RESULTS, machine, parse_args, write_results
from _rl import REWARD_V1, ROOT, make_mixed, mixed_path, plot_curves, read_curve, run_all, template, train_one
from rl_offline import pooled


def _k(text: str) -> int | None:
    return None if text.upper() == "S" else int(text)


# One --ks value: an int, or S (None: the gradient through all DDIM steps).
K = Annotated[
    int | None,
    tyro.constructors.PrimitiveConstructorSpec(
        nargs=1,
        metavar="K|S",
        instance_from_str=lambda a: _k(a[0]),
        is_instance=lambda x: x is None or isinstance(x, int),
        str_from_instance=lambda x: ["S" if x is None else str(x)],
    ),
]


@dataclass
class Args:
    config: Path = ROOT / "configs" / "rl_offline.yaml"
    """actor and critic preset"""
    dataset: Path = mixed_path(REWARD_V1)  # its published numbers predate the reward fix (issue 27)
    """the mixed dataset (made when missing)"""
    ks: list[K] = field(default_factory=lambda: [1, 2, None])
    """k values; S means all steps"""
    seeds: list[int] = field(default_factory=lambda: [0, 1, 2])
    """training seeds per k"""
    steps: int | None = None
    """override the preset's training steps"""
    speed_steps: int = 100
    """updates of each throughput measurement"""
    parallel: int = 2
    """runs trained at a time"""
    speed_only: bool = False
    """measure throughput only (no training to the end)"""
    curve_every: int = 250
    """as rl_offline.py's (k = S reuses its run)"""
    curve_episodes: int = 20
    """episodes per curve point"""
    offline_out: Path = ROOT / "outputs" / "rl_offline"
    """rl_offline.py's run directories (k = S)"""
    out: Path = ROOT / "outputs" / "rl_truncation"
    """run directories go here"""


def main() -> None:
    args = parse_args(Args, __doc__)
    t0 = time.perf_counter()
    make_mixed(args.dataset, reward=REWARD_V1)
    extra = {} if args.steps is None else {"steps": args.steps}

    def cfg(k: int | None, seed: int, out: Path, **more):
        return template(
            args.config,
            dataset=args.dataset,
            out=out,
            algo={"type": "diffusion-ql", "grad_steps_through_chain": k},
            policy="diffusion",
            seed=seed,
            overwrite=True,
            **{**extra, **more},
        )

    def out_dir(k: int | None, seed: int) -> Path:
        return args.offline_out / f"diffusion-ql_seed{seed}" if k is None else args.out / f"k{k}_seed{seed}"

    # Throughput first, alone on the machine: short runs without evaluation, the rate logged at their end.
    speed = {}
    for k in args.ks:
        timing = {"steps": args.speed_steps, "eval_episodes": 0, "source": {"curve_every": 0}}
        s = train_one(cfg(k, 0, args.out / f"speed_k{k or 'S'}", **timing))
        speed[k] = s["samples_per_s"]
        print(f"k={k or 'S'}: {speed[k]:.0f} samples/s", flush=True)
    curve = {"source": {"curve_every": args.curve_every, "curve_episodes": args.curve_episodes}}
    runs = {(k, s): cfg(k, s, out_dir(k, s), **curve) for k in args.ks for s in args.seeds}
    results = {} if args.speed_only else run_all(runs, args.parallel)
    S = runs[next(iter(runs))].policy.num_inference_steps
    full = speed.get(None)
    rows = []
    for k in args.ks:
        name = f"k={k}" if k is not None else f"k={S} (S, full backprop)"
        row = {"k": name} if args.speed_only else pooled(name, [results[(k, s)] for s in args.seeds])
        row["samples_per_s"] = speed[k]
        row["speedup_vs_full"] = speed[k] / full if full else float("nan")
        rows.append(row)
    first = next(iter(runs.values()))
    meta = {
        **machine(),
        "command": "python benchmarks/rl_truncation.py " + " ".join(sys.argv[1:]),
        "config": str(args.config.relative_to(ROOT)),
        "ddim_steps_S": S,
        "steps": first.steps,
        "batch_size": first.batch_size,
        "throughput": f"samples/s of a {args.speed_steps}-update run, 1 thread, nothing else running (data loading "
        "included)",
        "wall_min": round((time.perf_counter() - t0) / 60, 1),
    }
    write_results("rl_truncation_speed" if args.speed_only else "rl_truncation", rows, meta, list(rows[0]))
    if not args.speed_only and args.curve_every:
        curves = {
            row["algo"]: [read_curve(runs[(k, s)].out) for s in args.seeds]
            for k, row in zip(args.ks, rows, strict=True)
        }
        (RESULTS / "rl_truncation_curves.json").write_text(json.dumps(curves) + "\n")
        title = f"Diffusion-QL on mixed, Q gradient through the last k DDIM steps; {args.curve_episodes} episodes/point"
        plot_curves(curves, ROOT / "docs" / "rl_truncation.png", title)
    (args.out / "speed.json").write_text(json.dumps({str(k): v for k, v in speed.items()}))


if __name__ == "__main__":
    main()
