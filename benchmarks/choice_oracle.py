"""Choice oracle: how much could any critic gain by choosing among a policy's candidate chunks (issue 27)?

Run: ``python benchmarks/choice_oracle.py --run outputs/rl_finetune/bc_rl_eta0_successes_200k_r20_seed0``.
At every decision the run's actor samples N chunks; with ``--noise s`` all but the first are perturbed in their
executed actions (std s, normalised action space, clipped to the bounds: what ``--algo.candidate-noise`` does).
Each candidate is then looked ahead in a copy of the simulator: its own chunk, then the actor for K-1 more chunks
(one rollout). Two ways to act on that, per setting:

- ``actor``: the first candidate, whatever the lookahead says (the actor alone; the lookahead is only counted);
- ``oracle``: the first candidate whose lookahead does not collide (the first one if all collide): what a critic
  that knew the next K chunks' collisions exactly could do with these candidates;
- ``critic`` (``--critic``; qc / idql runs): the run's own pick, its target critic's best candidate (perturbed ones
  less the run's ``candidate_margin``), scored against the lookahead: at decisions where the candidates disagree,
  the share where the pick is safe (``safe_pick_share``) against the share of safe candidates there (what a random
  pick gets, ``random_safe_share``).

Per row: success and collision over the episodes, and the share of decisions at which the candidates disagree (some
but not all collide within K chunks): where none disagree, no critic can change the outcome by choosing.
MultiPath state runs only. Writes benchmarks/results/choice_oracle.json and .md (or --name).
"""

from __future__ import annotations

import copy
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from _common import machine, parse_args, write_results
from _rl import load_run
from dmrl.algos.best_of_n import CriticRankedPolicy, PlanningWrapper
from dmrl.envs import make_env
from dmrl.train.metrics import wilson_interval
from dmrl.train.offline import env_kwargs_from_store


@dataclass
class Args:
    run: Path
    """a finished dmrl train run on a MultiPath state store (its EMA actor is the proposal)"""
    n: int = 8
    """candidates per decision"""
    noise: list[float] = field(default_factory=lambda: [0.0, 0.3])
    """candidate noise settings (0: the actor's samples alone)"""
    horizon: int = 3
    """K: chunks looked ahead (the candidate's, then the actor's)"""
    episodes: int = 50
    """episodes per (noise, mode)"""
    seed: int = 200_000
    """first episode seed (200000..: selection seeds)"""
    critic: bool = False
    """also act by the run's critic (mode ``critic``)"""
    name: str = "choice_oracle"
    """results file stem"""


class LookaheadChooser(PlanningWrapper):
    """Plans each chunk by sampling candidates and rolling each out K chunks in a copy of ``env`` (see module doc)."""

    def __init__(self, actor, env, n: int, noise: float, horizon: int, mode: str, critic=None, margin: float = 0.0):
        super().__init__(actor)
        self.env, self.n, self.horizon, self.mode = env, n, horizon, mode
        self.ranker = CriticRankedPolicy(actor, critic, n_samples=n, noise=noise, margin=margin)
        self.decisions = self.disagree = 0
        self.safe_picks, self.safe_share = 0, 0.0  # at disagreeing decisions: picks that avoid, share that avoid
        self.records: list | None = None  # set to [] to keep (window (To, D), raw executed (N, Ta, Da), collided (N,))

    def _sample(self, hist: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Raw windows (N, To, D) -> raw chunks (N, Tp, Da) and the critic's pick index (0 without a critic)."""
        chunks = self.actor.sample_chunk(*self.actor.condition({"state": hist}))
        if self.ranker.noise > 0:
            chunks = self.ranker.perturb(chunks, self.n)
        pick = torch.zeros((), dtype=torch.long)
        if self.mode == "critic":
            critic = self.ranker.critic
            q = critic({"state": hist}, critic.executed(chunks)).min(0).values  # (N,)
            if self.ranker.noise > 0:
                q[1:] -= self.ranker.margin
            pick = q.argmax()
        return self.actor.raw_actions(chunks), pick

    @torch.no_grad()
    def predict_chunk(self, obs: dict) -> torch.Tensor:
        n, to, ta = self.n, self.chunk.n_obs_steps, self.chunk.n_action_steps
        hist = obs["state"].repeat(n, 1, 1).clone()  # (N, To, D)
        first, pick = self._sample(hist)  # (N, Tp, Da) raw; row 0 unperturbed
        envs = [copy.deepcopy(self.env) for _ in range(n)]
        alive, collided = np.ones(n, bool), np.zeros(n, bool)
        actions = first[:, to - 1 : to - 1 + ta].numpy()
        for k in range(self.horizon):
            if k > 0:  # the continuation: the actor's own samples, unperturbed
                actions = self.actor.raw_actions(self.actor.sample_chunk(*self.actor.condition({"state": hist})))
                actions = actions[:, to - 1 : to - 1 + ta].numpy()
            for t in range(ta):
                for j in np.flatnonzero(alive):
                    o, _, terminated, truncated, info = envs[j].step(actions[j, t].astype(np.float32))
                    hist[j] = torch.cat([hist[j, 1:], torch.as_tensor(o["state"], dtype=hist.dtype)[None]])
                    collided[j] |= bool(info["collision"])
                    alive[j] &= not (terminated or truncated)
            if not alive.any():
                break
        self.decisions += 1
        if self.records is not None:
            self.records.append((obs["state"][0].clone(), first[:, to - 1 : to - 1 + ta].clone(), collided.copy()))
        safe = np.flatnonzero(~collided)
        j = int(safe[0]) if self.mode == "oracle" and len(safe) else int(pick)
        if collided.any() and not collided.all():
            self.disagree += 1
            self.safe_picks += int(not collided[j])
            self.safe_share += len(safe) / n
        return first[j : j + 1]


def rollouts(chooser: LookaheadChooser, env, seeds: range) -> tuple[int, int]:
    """Run ``chooser`` on the episodes of ``seeds`` -> (successes, collisions)."""
    wins = collisions = 0
    for seed in seeds:
        obs, _ = env.reset(seed=seed)
        chooser.reset()
        while True:
            obs, _, terminated, truncated, info = env.step(chooser.act(obs))
            if terminated or truncated:
                break
        wins += bool(info["is_success"])
        collisions += bool(info["collision"])
    return wins, collisions


def main() -> None:
    args = parse_args(Args, __doc__)
    if args.n < 2 or args.horizon < 1 or min(args.noise) < 0:
        sys.exit(f"--n {args.n}, --horizon {args.horizon}, --noise {args.noise}: need n >= 2, horizon >= 1, noise >= 0")
    torch.set_num_threads(1)
    t0, rows = time.perf_counter(), []
    algo, cfg, store = load_run(args.run)
    actor = algo.policy.cpu().eval()
    if tuple(actor.chunk.obs_keys) != ("state",):
        sys.exit(f"--run {args.run}: the oracle reads state windows only; this run's keys are {actor.chunk.obs_keys}")
    env = make_env(store.attrs["env_id"], **(env_kwargs_from_store(store) | {"obs_modes": ("state",)}))
    critic, margin = getattr(algo, "critic_target", None), getattr(algo.config, "candidate_margin", 0.0)
    if args.critic and critic is None:
        sys.exit(f"--critic: {args.run} is a {cfg.algo_type} run without a chunk critic; give a qc or idql run")
    modes = ("actor", "oracle") + (("critic",) if args.critic else ())
    for noise in args.noise:
        for mode in modes:
            torch.manual_seed(0)
            chooser = LookaheadChooser(actor, env.unwrapped, args.n, noise, args.horizon, mode,
                                       critic.cpu() if critic is not None else None, margin)  # fmt: skip
            wins, collisions = rollouts(chooser, env, range(args.seed, args.seed + args.episodes))
            lo, hi = wilson_interval(wins, args.episodes)
            n_dec = max(chooser.decisions, 1)
            row = {"noise": noise, "mode": mode, "episodes": args.episodes, "success_rate": wins / args.episodes,
                   "ci_low": lo, "ci_high": hi, "collision_rate": collisions / args.episodes,
                   "decisions": chooser.decisions, "disagree_share": chooser.disagree / n_dec,
                   "safe_pick_share": chooser.safe_picks / max(chooser.disagree, 1),
                   "random_safe_share": chooser.safe_share / max(chooser.disagree, 1)}  # fmt: skip
            print(row, flush=True)
            rows.append(row)
    meta = {**machine(), "command": "python benchmarks/choice_oracle.py " + " ".join(sys.argv[1:]),
            "run": str(args.run), "n": args.n, "horizon_chunks": args.horizon, "candidate_margin": margin,
            "seeds": f"{args.seed}..{args.seed + args.episodes - 1}",
            "wall_min": round((time.perf_counter() - t0) / 60, 1)}  # fmt: skip
    write_results(args.name, rows, meta, list(rows[0]))


if __name__ == "__main__":
    main()
