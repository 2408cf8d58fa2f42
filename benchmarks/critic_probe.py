"""Critic probe: how well does each trained critic rank chunks by their true returns (issue 27 §2)?

Run: ``python benchmarks/critic_probe.py --runs outputs/rl_offline/shaped/qc_seed0 [...] [--states 100]``.
Each run is a finished ``dmrl train`` run of diffusion-ql, qc or idql on a MultiPath state store; its target critic
(the one best-of-N ranks with) scores candidate chunks at branch states of held-out episodes (seeds 300000..: not
in any dataset, evaluation or selection range), against Monte-Carlo returns from the simulator (the chunk, then
the scripted expert; dmrl.train.critic_probe). Writes benchmarks/results/critic_probe.json and .md, one row per
run: ranking_accuracy (a critic may steer in the RL tables only at >= 0.9), spearman, calibration_mae, the
ensemble spread on colliding vs expert chunks, and in_support_accuracy (does best-of-N's favourite sample avoid a
collision where some samples collide; random_pick_accuracy is the share a random pick would get right).
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from _common import RESULTS, machine, parse_args, write_results
from _rl import load_run
from dmrl.envs import make_env
from dmrl.train.critic_probe import collect_states, probe_metrics, score
from dmrl.train.offline import env_kwargs_from_store

GATE = 0.9  # ranking accuracy a critic needs before it steers a benchmark arm


@dataclass
class Args:
    runs: list[Path]
    """finished diffusion-ql / qc / idql run directories (state observations, MultiPath)"""
    states: int = 100
    """branch states per run (half from expert rollouts, half from the run's policy)"""
    seed: int = 300_000
    """first episode seed of the probe's rollouts"""
    every: int = 4
    """env steps between branch states along a rollout"""
    policy_samples: int = 16
    """chunks sampled from the run's policy per state (candidates beside the scripted ones)"""
    name: str = "critic_probe"
    """results file stem"""


def main() -> None:
    args = parse_args(Args, __doc__)
    t0, rows = time.perf_counter(), []
    for run in args.runs:
        algo, cfg, store = load_run(run)
        kwargs = env_kwargs_from_store(store) | {"obs_modes": ("state",)}
        env_id = store.attrs["env_id"]
        critic = algo.critic_target
        states = collect_states(
            lambda: make_env(env_id, **kwargs).unwrapped,  # noqa: B023 (used within this iteration)
            algo.policy,
            args.states,
            args.seed,
            critic.config.gamma,
            args.every,
            args.policy_samples,
        )
        for st in states:
            score(critic, st)
        m = probe_metrics(states)
        by_source = {src: probe_metrics([s for s in states if s.source == src]) for src in ("expert", "policy")}
        row = {
            "method": cfg.algo_type,
            "run": str(run),
            "reward": kwargs.get("reward", "?"),
            "seed": cfg.seed,
            **m,
            "ranking_expert_states": by_source["expert"]["ranking_accuracy"],
            "ranking_policy_states": by_source["policy"]["ranking_accuracy"],
            "passes_gate": bool(m["ranking_accuracy"] >= GATE),
        }
        print(json.dumps(row), flush=True)
        rows.append(row)
    old = RESULTS / f"{args.name}.json"
    if old.is_file():  # keep rows of runs not probed this time
        done = {r["run"] for r in rows}
        rows = [r for r in json.loads(old.read_text())["results"] if r["run"] not in done] + rows
    meta = {
        **machine(),
        "command": "python benchmarks/critic_probe.py " + " ".join(sys.argv[1:]),
        "seeds": f"{args.seed}.. (alternate episodes: expert, policy)",
        "candidates": f"expert, straight at the goal, left and right detours, {args.policy_samples} policy samples",
        "return": "discounted (critic's gamma): the chunk open loop, then the scripted expert to the episode's end",
        "gate": f"ranking_accuracy >= {GATE}",
        "wall_min": round((time.perf_counter() - t0) / 60, 1),
    }
    write_results(args.name, rows, meta, list(rows[0]))


if __name__ == "__main__":
    main()
