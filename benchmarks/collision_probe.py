"""Collision probe: can the chunk critic's network tell safe perturbed candidates from colliding ones when it is
given the true labels (issue 27)?

Run: ``python benchmarks/collision_probe.py --run outputs/rl_finetune/bc_rl_eta0_successes_200k_r20_seed0``.
The choice oracle (benchmarks/choice_oracle.py) labels every candidate of every decision on ``--train-episodes``
episodes: does the chunk, followed by the actor for K-1 chunks, collide? A network shaped as the run's critic
(ChunkCritic: its encoder and head sizes, one member) is fitted to those labels by binary cross-entropy, and then
acts on other episodes: at each decision it picks the candidate it thinks least likely to collide, scored by the
oracle's lookahead as choice_oracle's ``critic`` mode is. No TD, no reward: if this supervised network cannot
pick safe candidates well above a random pick, no critic of that shape will from returns; if it can, what the RL
critics miss is in their data or their targets.
Writes benchmarks/results/collision_probe.json and .md (or --name).
"""

from __future__ import annotations

import dataclasses
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from _common import machine, parse_args, write_results
from _rl import load_run
from choice_oracle import LookaheadChooser, rollouts
from dmrl.algos.critic import ChunkCritic
from dmrl.envs import make_env
from dmrl.train.metrics import wilson_interval
from dmrl.train.offline import env_kwargs_from_store


@dataclass
class Args:
    run: Path
    """a finished dmrl train run with a chunk critic (its EMA actor proposes, its critic's shape is probed)"""
    n: int = 16
    """candidates per decision"""
    noise: float = 0.3
    """candidate noise (all but the first)"""
    horizon: int = 3
    """chunks looked ahead for the labels and the scoring"""
    train_episodes: int = 60
    """episodes whose candidates are labelled for fitting (seeds 300000..: no evaluation or selection seed)"""
    episodes: int = 50
    """scoring episodes (selection seeds 200000..)"""
    steps: int = 3000
    """classifier updates (Adam, batch 256)"""
    gate: bool = False
    """keep the actor's own sample unless the classifier says it collides (p > 0.5); else its safest candidate"""
    name: str = "collision_probe"
    """results file stem"""


class SafetyScore(torch.nn.Module):
    """Wraps the classifier as a critic for the chooser: (1, B) scores = minus the collision logit of the B = N
    candidates of one decision; with ``gate``, the first (the actor's own sample) wins whenever its p <= 0.5."""

    def __init__(self, net: ChunkCritic, gate: bool = False):
        super().__init__()
        self.net, self.gate = net, gate

    def executed(self, chunk: torch.Tensor) -> torch.Tensor:
        return self.net.executed(chunk)

    def forward(self, obs: dict, actions: torch.Tensor) -> torch.Tensor:
        score = -self.net(obs, actions)  # (1, N)
        if self.gate and score[0, 0] >= 0:
            score[0, 0] = float("inf")
        return score


def main() -> None:
    args = parse_args(Args, __doc__)
    if min(args.n - 1, args.horizon, args.train_episodes, args.episodes, args.steps) < 1 or args.noise < 0:
        sys.exit(f"--n {args.n}, --horizon {args.horizon}, --train-episodes {args.train_episodes}, --episodes "
                 f"{args.episodes}, --steps {args.steps}, --noise {args.noise}: need n >= 2, noise >= 0, "
                 "the rest >= 1")  # fmt: skip
    torch.set_num_threads(1)
    t0 = time.perf_counter()
    algo, cfg, store = load_run(args.run)
    actor = algo.policy.cpu().eval()
    env = make_env(store.attrs["env_id"], **(env_kwargs_from_store(store) | {"obs_modes": ("state",)}))
    torch.manual_seed(0)
    labeller = LookaheadChooser(actor, env.unwrapped, args.n, args.noise, args.horizon, "actor")
    labeller.records = []
    rollouts(labeller, env, range(300_000, 300_000 + args.train_episodes))
    obs = torch.stack([w for w, _, c in labeller.records for _ in c])  # (M, To, D)
    chunks = torch.cat([a for _, a, _ in labeller.records])  # (M, Ta, Da) raw
    labels = torch.as_tensor(np.concatenate([c for *_, c in labeller.records]), dtype=torch.float32)  # (M,)
    critic_cfg = dataclasses.replace(algo.critic.config, n_critics=1)
    net = ChunkCritic(actor, critic_cfg)
    opt = torch.optim.Adam(net.parameters(), lr=3e-4)
    norm = actor.normalizer.normalize("actions", chunks)
    gen = torch.Generator().manual_seed(0)
    split = int(0.9 * len(labels))  # the last decisions' candidates: a held-out check of the fit
    perm = torch.randperm(len(labels), generator=gen)
    fit, held = perm[:split], perm[split:]
    for _ in range(args.steps):
        idx = fit[torch.randint(len(fit), (256,), generator=gen)]
        loss = F.binary_cross_entropy_with_logits(net({"state": obs[idx]}, norm[idx])[0], labels[idx])
        opt.zero_grad()
        loss.backward()
        opt.step()
    with torch.no_grad():
        p = torch.sigmoid(net({"state": obs[held]}, norm[held])[0])
    held_acc = float(((p > 0.5).float() == labels[held]).float().mean())
    torch.manual_seed(0)
    scorer = SafetyScore(net, args.gate)
    chooser = LookaheadChooser(actor, env.unwrapped, args.n, args.noise, args.horizon, "critic", scorer)
    wins, collisions = rollouts(chooser, env, range(200_000, 200_000 + args.episodes))
    lo, hi = wilson_interval(wins, args.episodes)
    d = max(chooser.disagree, 1)
    row = {"labels": len(labels), "colliding_share": float(labels.mean()), "fit_loss": float(loss),
           "heldout_accuracy": held_acc, "episodes": args.episodes, "success_rate": wins / args.episodes,
           "ci_low": lo, "ci_high": hi, "collision_rate": collisions / args.episodes,
           "disagree_share": chooser.disagree / max(chooser.decisions, 1),
           "safe_pick_share": chooser.safe_picks / d, "random_safe_share": chooser.safe_share / d}  # fmt: skip
    print(row, flush=True)
    meta = {**machine(), "command": "python benchmarks/collision_probe.py " + " ".join(sys.argv[1:]),
            "run": str(args.run), "n": args.n, "noise": args.noise, "horizon_chunks": args.horizon,
            "train_seeds": f"300000..{300_000 + args.train_episodes - 1}",
            "seeds": f"200000..{200_000 + args.episodes - 1}",
            "wall_min": round((time.perf_counter() - t0) / 60, 1)}  # fmt: skip
    write_results(args.name, [row], meta, list(row))


if __name__ == "__main__":
    main()
