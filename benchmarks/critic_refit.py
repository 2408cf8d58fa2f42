"""Critic refit: does a QC critic rank perturbed candidates better with more updates on the same data (issue 27)?

Run: ``python benchmarks/critic_refit.py --run outputs/rl_finetune/qc_n16b4s0.3m1_successes_200k_r20_sel_seed0``.
An online run makes one update per ``--source.env-steps-per-update`` env steps (20 in the RL benchmarks: a
replay ratio of 0.05, where online RL usually runs 1 or more). This script holds the run's data and proposal fixed
(the replay of its newest training state, its EMA proposal) and trains only its critic further, uniformly over the
replay, QC's in-support backup over ``--backup-samples`` proposal chunks per next state (drawn once: the proposal
does not change). After every ``--every`` updates, the choice oracle (benchmarks/choice_oracle.py) scores the
critic's picks among perturbed candidates against a K-chunk simulator lookahead: if ``safe_pick_share`` rises
above the actor's own sample's, the critic was short of updates; if it stays, the data does not teach it.
Writes benchmarks/results/critic_refit.json and .md (or --name), one row per checkpoint of the refit.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from _common import machine, parse_args, write_results
from _rl import load_run
from choice_oracle import LookaheadChooser, rollouts
from dmrl.algos.best_of_n import repeat_obs
from dmrl.algos.critic import chunk_td_target, polyak_update, td_regression
from dmrl.envs import make_env
from dmrl.train.engine.state import state_dirs
from dmrl.train.metrics import wilson_interval
from dmrl.train.offline import env_kwargs_from_store


@dataclass
class Args:
    run: Path
    """a finished online qc run (its newest state holds replay.npz)"""
    updates: int = 20_000
    """critic updates of the refit"""
    every: int = 10_000
    """updates between oracle scorings (also scored before the first)"""
    batch_size: int = 256
    """replay items per update"""
    backup_samples: int = 4
    """proposal chunks per next state the backup maxes over"""
    n: int = 16
    """candidates per decision in the scoring"""
    noise: float = 0.3
    """candidate noise in the scoring"""
    horizon: int = 3
    """chunks looked ahead in the scoring"""
    margin: float = 0.0
    """Q margin a perturbed candidate needs over the actor's sample in the scoring (0: the critic's plain ranking)"""
    episodes: int = 30
    """scoring episodes per checkpoint"""
    seed: int = 200_000
    """first scoring episode seed (selection seeds)"""
    name: str = "critic_refit"
    """results file stem"""


def load_replay(run: Path) -> dict[str, torch.Tensor]:
    """The newest state's replay ring -> {field: (M, ...) tensor} of its M filled slots."""
    dirs = state_dirs(run)
    path = dirs[-1] / "replay.npz" if dirs else None
    if path is None or not path.is_file():
        sys.exit(f"--run {run}: no state/*/replay.npz (an online run's training state holds its replay)")
    z = np.load(path)
    m = min(int(z["__count__"]), len(z["episode"]))
    return {k: torch.as_tensor(z[k][:m]) for k in z.files if not k.startswith("__")}


def score(algo, env, args: Args) -> dict:
    """The critic's picks among perturbed candidates on the selection episodes, against the lookahead."""
    chooser = LookaheadChooser(algo.policy, env.unwrapped, args.n, args.noise, args.horizon, "critic",
                               algo.critic_target, args.margin)  # fmt: skip
    torch.manual_seed(0)
    wins, _ = rollouts(chooser, env, range(args.seed, args.seed + args.episodes))
    lo, hi = wilson_interval(wins, args.episodes)
    d = max(chooser.disagree, 1)
    return {"success_rate": wins / args.episodes, "ci_low": lo, "ci_high": hi,
            "disagree_share": chooser.disagree / max(chooser.decisions, 1),
            "safe_pick_share": chooser.safe_picks / d, "random_safe_share": chooser.safe_share / d}  # fmt: skip


def main() -> None:
    args = parse_args(Args, __doc__)
    counts = {"--updates": args.updates + 1, "--every": args.every, "--batch-size": args.batch_size,
              "--backup-samples": args.backup_samples, "--n": args.n - 1, "--episodes": args.episodes}  # fmt: skip
    bad = [flag for flag, v in counts.items() if v < 1]
    bad += [flag for flag, v in (("--noise", args.noise), ("--margin", args.margin)) if v < 0]
    if bad:
        sys.exit(f"{', '.join(bad)}: need --updates >= 0, --n >= 2, --noise and --margin >= 0, the other counts >= 1")
    torch.set_num_threads(1)
    t0, rows = time.perf_counter(), []
    algo, cfg, store = load_run(args.run)
    if cfg.algo_type != "qc":
        sys.exit(f"--run {args.run}: a {cfg.algo_type} run; the refit trains QC's critic (give a qc run)")
    data = load_replay(args.run)
    env = make_env(store.attrs["env_id"], **(env_kwargs_from_store(store) | {"obs_modes": ("state",)}))
    critic, target, k = algo.critic, algo.critic_target, args.backup_samples
    with torch.no_grad():  # the proposal is fixed: its backup chunks are drawn once per next state
        nxt = []
        for i in range(0, len(data["episode"]), 1024):
            rep = repeat_obs({"state": data["next_obs.state"][i : i + 1024]}, k)
            nxt.append(critic.executed(algo.policy.sample_chunk(*algo.policy.condition(rep))))
        next_chunks = torch.cat(nxt).view(-1, k, *nxt[0].shape[1:])  # (M, k, Ta, Da) normalised
    gen = torch.Generator().manual_seed(cfg.seed)

    def regression(b: dict) -> dict[str, torch.Tensor]:
        return {"loss": td_regression(critic(b["obs"], critic.executed_from_data(b["action"])), b["y"])[0]}

    losses: list[float] = []
    for done in range(0, args.updates + 1):
        if done % args.every == 0:
            row = {"updates": done, "replay_items": len(data["episode"]), "episodes": args.episodes,
                   "td_loss": float(np.mean(losses)) if losses else None, **score(algo, env, args)}  # fmt: skip
            losses.clear()
            print(row, flush=True)
            rows.append(row)
        if done == args.updates:
            break
        idx = torch.randint(len(data["episode"]), (args.batch_size,), generator=gen)
        obs, next_obs = {"state": data["obs.state"][idx]}, {"state": data["next_obs.state"][idx]}
        with torch.no_grad():
            chunks = next_chunks[idx].flatten(0, 1)  # (B·k, Ta, Da)
            q_next = target(repeat_obs(next_obs, k), chunks).min(0).values.view(-1, k).max(1).values
            y = chunk_td_target(data["reward"][idx], data["done"][idx], data["valid"][idx], data["next_valid"][idx],
                                q_next, critic.config.gamma)  # fmt: skip
        batch = {"obs": obs, "action": data["action"][idx], "y": y}
        logs = algo.engine.backward(regression, batch)
        algo.engine.step(algo.critic_opt)  # the run's optimizer state and gradient clipping
        losses.append(float(logs["loss"]))
        polyak_update(target, critic, critic.config.tau)
    meta = {**machine(), "command": "python benchmarks/critic_refit.py " + " ".join(sys.argv[1:]),
            "run": str(args.run), "n": args.n, "noise": args.noise, "horizon_chunks": args.horizon,
            "seeds": f"{args.seed}..{args.seed + args.episodes - 1}",
            "wall_min": round((time.perf_counter() - t0) / 60, 1)}  # fmt: skip
    write_results(args.name, rows, meta, list(rows[0]))


if __name__ == "__main__":
    main()
