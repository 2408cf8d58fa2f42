"""Offline RL on the `mixed` dataset: BC (diffusion) vs Diffusion-QL vs its advantage-weighted variant
(diffusion-ql-aw: eta 0, BC weighted by the critic's advantage) vs TD3+BC (MLP actor), several seeds.

Run: ``python benchmarks/rl_offline.py [--seeds 0 1 2] [--steps N]`` (collects outputs/rl/mixed.zarr first if absent).
Writes benchmarks/results/rl_offline.json and .md: per algorithm the success over all seeds' episodes pooled
(Wilson interval on the pooled count), the per-seed rates and their mean ± std. Settings: configs/rl_offline.yaml.
Every run also logs a learning curve (--curve-every updates, --curve-episodes evaluation seeds from 100000), drawn
in docs/rl_offline.png and kept in benchmarks/results/rl_offline_curves.json.
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import numpy as np

from _common import RESULTS, machine, parse_args, write_results
from _rl import MIXED_PARTS, ROOT, eval_row, make_mixed, plot_curves, read_curve, run_all, template
from dmrl.train.metrics import wilson_interval

ALGOS = {  # name -> (algo, policy) merged into the preset (whose algo is diffusion-ql, policy diffusion)
    "bc": ({"type": "bc", "lr": 0.0003}, "diffusion"),  # the actor lr of diffusion-ql and td3-bc (BC's default: 1e-3)
    "diffusion-ql": ("diffusion-ql", "diffusion"),
    # Advantage-weighted BC on the same critic, no Q gradient (eta 0): the critic is read only at the dataset's
    # chunks and the actor's own samples (see DiffusionQLConfig.bc_weighting).
    "diffusion-ql-aw": ({"type": "diffusion-ql", "eta": 0.0, "bc_weighting": "advantage"}, "diffusion"),
    "td3-bc": ("td3-bc", "gaussian"),
}
Algo = Literal[tuple(ALGOS)]  # --algos choices


def pooled(name: str, summaries: list[dict]) -> dict:
    """One result row from one summary per seed: the seeds' episodes pooled, plus per-seed rates."""
    rows = [eval_row(s) for s in summaries]
    n = sum(r["episodes"] for r in rows)
    wins = int(round(sum(r["success_rate"] * r["episodes"] for r in rows)))
    lo, hi = wilson_interval(wins, n)
    rates = [r["success_rate"] for r in rows]
    return {
        "algo": name,
        "seeds": len(summaries),
        "episodes": n,
        "success_rate": wins / n,
        "ci_low": lo,
        "ci_high": hi,
        "success_mean": float(np.mean(rates)),
        "success_std": float(np.std(rates)),
        "per_seed": ", ".join(f"{x:.2f}" for x in rates),
        "route_left": float(np.mean([r["route_left"] for r in rows])),
        "route_right": float(np.mean([r["route_right"] for r in rows])),
        "collision_rate": float(np.mean([r["collision_rate"] for r in rows])),
        "train_min": float(np.mean([s["train_seconds"] for s in summaries]) / 60),
    }


@dataclass
class Args:
    config: Path = ROOT / "configs" / "rl_offline.yaml"
    """actor and critic preset"""
    dataset: Path = ROOT / "outputs" / "rl" / "mixed.zarr"
    """the mixed dataset (made when missing)"""
    algos: list[Algo] = field(default_factory=lambda: list(ALGOS))
    """algorithms to train"""
    seeds: list[int] = field(default_factory=lambda: [0, 1, 2])
    """training seeds per algorithm"""
    steps: int | None = None
    """override the preset's training steps"""
    parallel: int = 2
    """runs trained at a time"""
    etas: list[float] = field(default_factory=lambda: [0.05, 0.2, 1.0])
    """Diffusion-QL Q weights tried on seed 0, scored on the selection seeds; the best one is compared"""
    select_episodes: int = 50
    """episodes per eta on the selection seeds"""
    curve_every: int = 250
    """updates between learning-curve points (0: none)"""
    curve_episodes: int = 20
    """episodes per curve point (seeds 100000..)"""
    out: Path = ROOT / "outputs" / "rl_offline"
    """run directories go here"""


def main() -> None:
    args = parse_args(Args, __doc__)
    t0 = time.perf_counter()
    make_mixed(args.dataset)
    extra = {} if args.steps is None else {"steps": args.steps}
    selection, eta = select_eta(args, extra) if "diffusion-ql" in args.algos else ([], None)
    runs = {
        (name, s): template(
            args.config,
            dataset=args.dataset,
            out=args.out / f"{name}_seed{s}",
            algo={"type": "diffusion-ql", "eta": eta} if name == "diffusion-ql" else ALGOS[name][0],
            policy=ALGOS[name][1],
            seed=s,
            overwrite=True,
            source={"curve_every": args.curve_every, "curve_episodes": args.curve_episodes},
            **extra,
        )
        for s in args.seeds
        for name in args.algos
    }
    results = run_all(runs, args.parallel)
    commit = machine()["git_commit"]
    rows = [pooled(name, [results[(name, s)] for s in args.seeds]) | {"git_commit": commit} for name in args.algos]
    curves = {name: [read_curve(runs[(name, s)].out) for s in args.seeds] for name in args.algos}
    curves_file = RESULTS / "rl_offline_curves.json"
    if curves_file.is_file():  # keep the curves of algorithms not run this time
        curves = {k: v for k, v in json.loads(curves_file.read_text()).items() if k not in curves} | curves
    old = RESULTS / "rl_offline.json"
    if old.is_file():  # keep the rows of algorithms not run this time, with the commit they were measured at
        prev = json.loads(old.read_text())
        kept = [r for r in prev["results"] if r["algo"] not in args.algos]
        rows = [r | {"git_commit": r.get("git_commit", prev["meta"].get("git_commit", "?"))} for r in kept] + rows
        rows.sort(key=lambda r: list(ALGOS).index(r["algo"]) if r["algo"] in ALGOS else len(ALGOS))
    first = next(iter(runs.values()))
    meta = {
        **machine(),
        "command": "python benchmarks/rl_offline.py " + " ".join(sys.argv[1:]),
        "config": str(args.config.relative_to(ROOT)),
        "dataset": "mixed: " + ", ".join(f"{n} {p} (seeds {s}..)" for p, n, s, _, _ in MIXED_PARTS),
        "steps": first.steps,
        "batch_size": first.batch_size,
        "eval_seeds": f"{first.eval_seed}..{first.eval_seed + first.eval_episodes - 1} for every run",
        "diffusion_ql_eta": eta,
        "eta_selection": "; ".join(f"eta {e}: {r:.2f}" for e, r in selection)
        + f" (seed 0, {args.select_episodes} episodes on selection seeds 200000..)"
        if selection
        else "not run this time (diffusion-ql not in --algos)",
        "wall_min": round((time.perf_counter() - t0) / 60, 1),
        "curves": f"every {args.curve_every} updates, {args.curve_episodes} episodes (seeds 100000..) per point",
    }
    write_results("rl_offline", rows, meta, list(rows[0]))
    curves_file.write_text(json.dumps(curves) + "\n")
    if any(any(seeds) for seeds in curves.values()):
        title = f"offline RL on mixed: {meta['curves']}"
        plot_curves({k: v for k, v in curves.items() if any(v)}, ROOT / "docs" / "rl_offline.png", title)


def select_eta(args, extra: dict) -> tuple[list[tuple[float, float]], float]:
    """Train Diffusion-QL (seed 0) with each eta, score it on the selection seeds (never the evaluation seeds)."""
    runs = {
        e: template(
            args.config,
            dataset=args.dataset,
            out=args.out / "select" / f"eta{e}",
            algo={"type": "diffusion-ql", "eta": e},
            policy="diffusion",
            seed=0,
            overwrite=True,
            eval_seed=200_000,
            eval_episodes=args.select_episodes,
            **extra,
        )
        for e in args.etas
    }
    res = run_all(runs, args.parallel)
    scores = [(e, res[e]["eval"]["success_rate"]) for e in args.etas]
    best = max(scores, key=lambda t: t[1])[0]
    print("eta selection: " + ", ".join(f"{e}: {r:.2f}" for e, r in scores) + f" -> {best}", flush=True)
    return scores, best


if __name__ == "__main__":
    main()
