"""Critic-ranked sampling (best-of-N, as Diffusion-QL and IDQL select actions): success of a trained actor-critic
run when its actor samples N chunks per decision and the critic's min-ensemble Q picks one, for several N.

Run: ``python benchmarks/rl_best_of_n.py --runs outputs/rl_offline/diffusion-ql_seed0 [...] --n 1 4 16``.
Each run directory is a finished ``dmrl train --algo.type diffusion-ql`` run: its config.json rebuilds the algorithm
and its newest state/ restores actor, EMA actor and critics (the exported checkpoint holds the actor alone).
Writes benchmarks/results/rl_best_of_n.json and .md (or --name), one row per (run, N).
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from _common import machine, parse_args, write_results
from _rl import load_run
from dmrl.train.evaluate import evaluate
from dmrl.train.offline import env_kwargs_from_store


@dataclass
class Args:
    runs: list[Path]
    """finished actor-critic run directories (diffusion-ql, qc, idql)"""
    n: list[int] = field(default_factory=lambda: [1, 4, 16])
    """chunks sampled per decision"""
    noise: list[float] = field(default_factory=lambda: [0.0])
    """qc / idql: candidate noise settings (algo.candidate_noise; the run's candidate_margin is kept)"""
    episodes: int = 50
    """evaluation episodes per (run, N)"""
    seed: int = 200_000
    """first episode seed (200000..: selection seeds)"""
    envs: int = 2
    """parallel evaluation environments"""
    name: str = "rl_best_of_n"
    """results file stem"""


def main() -> None:
    args = parse_args(Args, __doc__)
    if min(args.n) < 1:
        sys.exit(f"--n: got {min(args.n)}; need >= 1 samples per decision")
    t0, rows = time.perf_counter(), []
    seeds = list(range(args.seed, args.seed + args.episodes))
    for run in args.runs:
        algo, cfg, store = load_run(run)
        for n, noise in [(n, s) for n in args.n for s in args.noise]:
            algo.config.n_action_samples = n
            if hasattr(algo.config, "candidate_noise"):
                algo.config.candidate_noise = noise if n > 1 else 0.0
            elif noise:
                sys.exit(f"--noise: {run} is a {cfg.algo_type} run; candidate noise is qc's and idql's")
            ev = evaluate(algo.evaluation_policy().cpu(), store.attrs["env_id"], seeds, env_kwargs_from_store(store),
                          n_envs=args.envs).summary()  # fmt: skip
            row = {"run": str(run), "algo": cfg.algo_type, "eta": getattr(cfg.algo, "eta", None), "n_samples": n,
                   "candidate_noise": getattr(algo.config, "candidate_noise", None),
                   "episodes": ev["episodes"], "success_rate": ev["success_rate"], "ci_low": ev["ci_low"],
                   "ci_high": ev["ci_high"],
                   "route_left": ev["route_left"], "route_right": ev["route_right"],
                   "collision_rate": ev["collision_rate"]}  # fmt: skip
            print(row, flush=True)
            rows.append(row)
    meta = {**machine(), "command": "python benchmarks/rl_best_of_n.py " + " ".join(sys.argv[1:]),
            "seeds": f"{seeds[0]}..{seeds[-1]}", "wall_min": round((time.perf_counter() - t0) / 60, 1)}  # fmt: skip
    write_results(args.name, rows, meta, list(rows[0]))


if __name__ == "__main__":
    main()
