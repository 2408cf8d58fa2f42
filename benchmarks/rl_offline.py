"""Offline RL on the `mixed` dataset: BC (diffusion) vs Diffusion-QL vs its advantage-weighted variant
(diffusion-ql-aw: eta 0, BC weighted by the critic's advantage) vs TD3+BC (MLP actor) vs the in-support critics QC
and IDQL (BC proposal, best-of-N by Q) vs FQL (one-step student distilled from the BC teacher), several seeds.

Run: ``python benchmarks/rl_offline.py [--algos ...] [--seeds 0 1 2] [--steps N] [--reward shaped]`` (collects
outputs/rl/mixed_<reward>.zarr first if absent). Writes benchmarks/results/rl_offline.json and .md (other rewards:
rl_offline_<reward>.*): per algorithm the success over all seeds' episodes pooled (Wilson interval on the pooled
count), the per-seed rates and their mean ± std, and whether its critic steers (critic_guided). Settings:
configs/rl_offline.yaml. Every run also logs a learning curve (--curve-every updates, --curve-episodes evaluation
seeds from 100000), drawn in docs/rl_offline.png and kept in benchmarks/results/rl_offline_curves.json.
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import numpy as np
import yaml

from _common import RESULTS, machine, parse_args, write_results
from _rl import MIXED_PARTS, REWARD, ROOT, eval_row, make_mixed, mixed_path, plot_curves, read_curve, run_all, template
from dmrl.envs.multipath import REWARDS
from dmrl.train.metrics import wilson_interval

ALGOS = {  # name -> (algo, policy) merged into the preset (whose algo is diffusion-ql, policy diffusion)
    "bc": ({"type": "bc", "lr": 0.0003}, "diffusion"),  # the actor lr of diffusion-ql and td3-bc (BC's default: 1e-3)
    "diffusion-ql": ("diffusion-ql", "diffusion"),
    # Advantage-weighted BC on the same critic, no Q gradient (eta 0): the critic is read only at the dataset's
    # chunks and the actor's own samples (see DiffusionQLConfig.bc_weighting).
    "diffusion-ql-aw": ({"type": "diffusion-ql", "eta": 0.0, "bc_weighting": "advantage"}, "diffusion"),
    # The same training, acting best-of-32 by its critic (N chosen on the selection seeds: rl_best_of_n_select.md).
    "diffusion-ql-aw-bon": (
        {"type": "diffusion-ql", "eta": 0.0, "bc_weighting": "advantage", "n_action_samples": 32},
        "diffusion",
    ),
    "td3-bc": ("td3-bc", "gaussian"),
    # In-support critics (dmrl.algos.qc, dmrl.algos.iql): a BC proposal, best-of-N chosen by Q at every decision.
    "qc": ("qc", "diffusion"),
    "idql": ("idql", "diffusion"),
    # One-step student maximising Q while distilled from the BC teacher (alpha: --algo-overrides '{alpha: ..}').
    "fql": ("fql", "diffusion"),
}
#: Arms whose critic chooses or shapes the actions (issue 27's `critic_guided`); the others are BC variants.
CRITIC_GUIDED = {"diffusion-ql", "td3-bc", "qc", "idql", "fql", "diffusion-ql-aw-bon"}
Algo = Literal[tuple(ALGOS)]  # --algos choices
Reward = Literal[REWARDS]  # --reward choices


def pooled(name: str, summaries: list[dict]) -> dict:
    """One result row from one summary per seed: the seeds' episodes pooled, plus per-seed rates."""
    rows = [eval_row(s) for s in summaries]
    n = sum(r["episodes"] for r in rows)
    wins = int(round(sum(r["success_rate"] * r["episodes"] for r in rows)))
    lo, hi = wilson_interval(wins, n)
    rates = [r["success_rate"] for r in rows]
    return {
        "algo": name,
        "critic_guided": name in CRITIC_GUIDED,
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
    reward: Reward = REWARD
    """the MultiPath reward `mixed` is collected with"""
    dataset: Path | None = None
    """the mixed dataset (made when missing; default outputs/rl/mixed_<reward>.zarr)"""
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
    selection: bool = False
    """seed 0.. scored on the selection seeds (200000..) into rl_offline*_select.json, to choose settings"""
    algo_overrides: str = ""
    """extra algorithm settings for every non-BC arm, as YAML (e.g. '{n_action_samples: 8}')"""
    curve_every: int = 250
    """updates between learning-curve points (0: none)"""
    curve_episodes: int = 20
    """episodes per curve point (seeds 100000..)"""
    out: Path | None = None
    """run directories go here (default outputs/rl_offline/<reward>)"""


def main() -> None:
    args = parse_args(Args, __doc__)
    t0 = time.perf_counter()
    args.dataset = args.dataset or mixed_path(args.reward)
    args.out = args.out or ROOT / "outputs" / "rl_offline" / args.reward
    # One table per reward: rl_offline.json for the default, rl_offline_<reward>.json for the others.
    stem = "rl_offline" if args.reward == REWARD else f"rl_offline_{args.reward}"
    if args.selection:
        stem, args.out = stem + "_select", args.out / "select"
    scoring = {"eval_seed": 200_000, "eval_episodes": args.select_episodes} if args.selection else {}
    overrides = yaml.safe_load(args.algo_overrides) or {} if args.algo_overrides else {}
    if not isinstance(overrides, dict):
        sys.exit(f"--algo-overrides: got {args.algo_overrides!r}; need a YAML mapping, e.g. '{{n_action_samples: 8}}'")
    label = {name: name if name == "bc" else name + _suffix(overrides) for name in args.algos}  # row and run names
    make_mixed(args.dataset, reward=args.reward)
    extra = {} if args.steps is None else {"steps": args.steps}
    dql = "diffusion-ql" in args.algos and not args.selection
    selection, eta = select_eta(args, extra) if dql else ([], None)
    runs = {
        (name, s): template(
            args.config,
            dataset=args.dataset,
            out=args.out / f"{label[name]}_seed{s}",
            algo=_algo(name, eta, overrides),
            policy=ALGOS[name][1],
            seed=s,
            overwrite=True,
            source={"curve_every": 0 if args.selection else args.curve_every, "curve_episodes": args.curve_episodes},
            **extra,
            **scoring,
        )
        for s in args.seeds
        for name in args.algos
    }
    commit = machine()["git_commit"]  # the code the runs start from (a commit made while they run is not theirs)
    results = run_all(runs, args.parallel)
    rows = [
        pooled(name, [results[(name, s)] for s in args.seeds]) | {"algo": label[name], "git_commit": commit}
        for name in args.algos
    ]
    curves = {label[n]: [read_curve(runs[(n, s)].out) for s in args.seeds] for n in args.algos}
    curves = {} if args.selection else curves
    curves_file = RESULTS / f"{stem}_curves.json"
    if curves_file.is_file():  # keep the curves of algorithms not run this time
        curves = {k: v for k, v in json.loads(curves_file.read_text()).items() if k not in curves} | curves
    old, prev = RESULTS / f"{stem}.json", {"results": [], "meta": {}}
    if old.is_file() and json.loads(old.read_text())["meta"].get("reward", "shaped_v1") == args.reward:
        # keep the rows of algorithms not run this time (same reward), with the commit they were measured at
        prev = json.loads(old.read_text())
        kept = [r for r in prev["results"] if r["algo"] not in label.values()]
        rows = [r | {"git_commit": r.get("git_commit", prev["meta"].get("git_commit", "?"))} for r in kept] + rows
        order = list(ALGOS)
        rows.sort(key=lambda r: order.index(r["algo"]) if r["algo"] in order else len(order))
    first = next(iter(runs.values()))
    meta = {
        **machine(),
        "command": "python benchmarks/rl_offline.py " + " ".join(sys.argv[1:]),
        "config": str(args.config.relative_to(ROOT)),
        "reward": args.reward,
        "dataset": "mixed: " + ", ".join(f"{n} {p} (seeds {s}..)" for p, n, s, _, _ in MIXED_PARTS),
        "steps": first.steps,
        "batch_size": first.batch_size,
        "eval_seeds": f"{first.eval_seed}..{first.eval_seed + first.eval_episodes - 1} for every run",
        "diffusion_ql_eta": eta if selection else prev["meta"].get("diffusion_ql_eta"),
        "eta_selection": "; ".join(f"eta {e}: {r:.2f}" for e, r in selection)
        + f" (seed 0, {args.select_episodes} episodes on selection seeds 200000..)"
        if selection
        else prev["meta"].get("eta_selection", "not run (diffusion-ql not in --algos)"),
        "wall_min": round((time.perf_counter() - t0) / 60, 1),
        "curves": f"every {args.curve_every} updates, {args.curve_episodes} episodes (seeds 100000..) per point",
    }
    write_results(stem, rows, meta, list(rows[0]))
    if not args.selection:
        curves_file.write_text(json.dumps(curves) + "\n")
    if any(any(seeds) for seeds in curves.values()):
        title = f"offline RL on mixed: {meta['curves']}"
        plot_curves({k: v for k, v in curves.items() if any(v)}, ROOT / "docs" / f"{stem}.png", title)


def _algo(name: str, eta: float | None, overrides: dict) -> dict:
    """The algo section of arm ``name``: its ALGOS entry, the selected eta for diffusion-ql, then ``overrides``."""
    base = ALGOS[name][0]
    algo = {"type": base} if isinstance(base, str) else dict(base)
    if name == "diffusion-ql" and eta is not None:
        algo["eta"] = eta
    return algo if name == "bc" else algo | overrides


def _suffix(overrides: dict) -> str:
    """Run-directory tag of the overrides ('' for none): arms with other settings never share a directory."""
    return "".join(f"_{k}{v}" for k, v in sorted(overrides.items()))


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
