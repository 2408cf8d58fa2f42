"""Critic probe (MultiPath, state observations): does a chunk critic rank chunks the way their true returns do?

At branch states along held-out rollouts (the scripted expert's and the trained policy's, before and while carrying
the cup, near the obstacle) each candidate chunk is scored twice:

- by the critic: min over the ensemble of Q(obs window, executed chunk), and the ensemble's spread (std);
- by the simulator: the Monte-Carlo return of executing the chunk open loop from a copy of the env, then the
  scripted expert to the end of the episode, discounted by the critic's gamma (``mc_return``).

Candidates (``candidate_chunks``): the expert's own next chunk, a straight full-speed chunk at the current goal
(which the obstacle blocks), detours aimed past the left and right edges of the obstacle, and samples of the policy.
``probe_metrics`` turns the scores into: ranking accuracy (at states where some candidate collides, the share where
the expert chunk scores above every colliding one), Spearman correlation (per state, averaged), calibration error
(mean |Q - return|), the ensemble spread on colliding vs expert chunks, and best-of-N's own question: at states
where some but not all policy samples collide, how often the critic's favourite sample is a safe one
(in_support_accuracy), against picking one at random (random_pick_accuracy).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field

import numpy as np
import torch

from dmrl.algos.critic import ChunkCritic
from dmrl.envs.experts import SIDE_X, ScriptedExpert
from dmrl.envs.multipath import MultiPathEnv
from dmrl.policies.observations import roll_history

NEAR_Y, NEAR_X = 0.3, 0.25  # m: branch states lie within this band around the obstacle


@dataclass
class Candidate:
    """One chunk at one branch state: its kind, raw executed actions (Ta, Da), true return and critic scores."""

    kind: str  # expert, straight, left, right or policy
    actions: np.ndarray
    ret: float = 0.0
    collided: bool = False
    q: float = 0.0
    spread: float = 0.0


@dataclass
class BranchState:
    """A state along a rollout: the observation window (To frames of each key) and its candidates."""

    source: str  # expert or policy: whose rollout visited it
    obs: dict[str, np.ndarray]  # {key: (To, dim)}
    carrying: bool
    candidates: list[Candidate] = field(default_factory=list)


def mc_return(env: MultiPathEnv, expert: ScriptedExpert, actions: np.ndarray, gamma: float) -> tuple[float, bool]:
    """(discounted return, collided) of ``actions`` (Ta, Da) executed open loop from copies of ``env`` and
    ``expert``, then the expert until the episode ends; the originals are untouched."""
    env, expert = copy.deepcopy((env, expert))
    total, t, collided = 0.0, 0, False
    todo = list(actions)
    while True:
        a = todo.pop(0) if todo else expert.act()
        _, r, terminated, truncated, info = env.step(np.asarray(a, np.float32))
        total += gamma**t * float(r)
        collided |= bool(info["collision"])
        t += 1
        if terminated or truncated:
            return total, collided


def expert_chunk(env: MultiPathEnv, expert: ScriptedExpert, ta: int) -> np.ndarray:
    """The expert's next ``ta`` actions from the env's state (closed loop on copies) -> (Ta, Da); if the episode ends
    sooner, the last action repeats (the critic reads Ta actions; the return stops at the end anyway)."""
    env, expert = copy.deepcopy((env, expert))
    actions = []
    for _ in range(ta):
        actions.append(expert.act())
        *_, terminated, truncated, _ = env.step(actions[-1])
        if terminated or truncated:
            break
    return np.array(actions + [actions[-1]] * (ta - len(actions)), np.float32)


def _toward(env: MultiPathEnv, xy: np.ndarray, ta: int) -> np.ndarray:
    """A constant full-speed chunk (Ta, 6) moving the tip toward ``xy`` in the table plane, suction kept as is."""
    s = env.task_state()
    a = np.zeros(6, np.float32)
    d = xy - s.tip[:2]
    a[:2] = d / max(np.abs(d).max(), 1e-6)
    a[5] = 1.0 if s.attached >= 0 else -1.0
    return np.repeat(a[None], ta, 0)


def candidate_chunks(env: MultiPathEnv, expert: ScriptedExpert, ta: int) -> list[Candidate]:
    """The scripted candidates at the env's state: expert, straight at the goal, left and right detours."""
    s = env.task_state()
    goal = s.pad if s.attached >= 0 else s.cups[s.target][:2]
    out = [Candidate("expert", expert_chunk(env, expert, ta)), Candidate("straight", _toward(env, goal, ta))]
    for side, sign in (("left", -1.0), ("right", 1.0)):
        out.append(Candidate(side, _toward(env, np.array([sign * SIDE_X, s.obstacle_y]), ta)))
    return out


def is_branch(env: MultiPathEnv) -> bool:
    """Near the obstacle (where routes split and straight chunks can hit it)."""
    s = env.task_state()
    return abs(s.tip[1] - s.obstacle_y) < NEAR_Y and abs(s.tip[0]) < NEAR_X


@torch.no_grad()
def score(critic: ChunkCritic, state: BranchState) -> None:
    """Fill each candidate's q (min over the ensemble) and spread (std over it) from the critic."""
    k = len(state.candidates)
    obs = {key: torch.as_tensor(v, dtype=torch.float32)[None].expand(k, *v.shape) for key, v in state.obs.items()}
    acts = torch.as_tensor(np.stack([c.actions for c in state.candidates]), dtype=torch.float32)  # (K, Ta, Da) raw
    q = critic(obs, critic.normalizer.normalize("actions", acts)).float()  # (E, K)
    for c, qmin, sd in zip(state.candidates, q.min(0).values, q.std(0, unbiased=False), strict=True):
        c.q, c.spread = float(qmin), float(sd)


def _ranks(x: np.ndarray) -> np.ndarray:
    order = np.argsort(x, kind="stable")
    r = np.empty(len(x))
    r[order] = np.arange(len(x))
    for v in np.unique(x):  # ties share their mean rank
        tie = x == v
        r[tie] = r[tie].mean()
    return r


def spearman(a: np.ndarray, b: np.ndarray) -> float:
    """Spearman rank correlation of two 1-D arrays (ties averaged); nan when either is constant."""
    ra, rb = _ranks(np.asarray(a, float)), _ranks(np.asarray(b, float))
    if ra.std() == 0 or rb.std() == 0:
        return float("nan")
    return float(np.corrcoef(ra, rb)[0, 1])


def probe_metrics(states: list[BranchState]) -> dict:
    """Ranking accuracy, Spearman, calibration error and ensemble spreads over scored branch states."""
    ranked, rhos, picks, base = [], [], [], []
    for st in states:
        samples = [c for c in st.candidates if c.kind == "policy"]
        if 0 < sum(c.collided for c in samples) < len(samples):  # best-of-N has a choice to get right
            picks.append(not max(samples, key=lambda c: c.q).collided)
            base.append(1.0 - float(np.mean([c.collided for c in samples])))
        exp = [c for c in st.candidates if c.kind == "expert"]
        bad = [c for c in st.candidates if c.collided]
        if exp and bad and not exp[0].collided:
            ranked.append(exp[0].q > max(c.q for c in bad))
        rho = spearman(np.array([c.q for c in st.candidates]), np.array([c.ret for c in st.candidates]))
        if not np.isnan(rho):
            rhos.append(rho)
    cands = [c for st in states for c in st.candidates]
    colliding = [c.spread for c in cands if c.collided]
    expert = [c.spread for c in cands if c.kind == "expert"]
    return {
        "states": len(states),
        "candidates": len(cands),
        "ranked_states": len(ranked),
        "ranking_accuracy": float(np.mean(ranked)) if ranked else float("nan"),
        "spearman": float(np.mean(rhos)) if rhos else float("nan"),
        "choice_states": len(picks),
        "in_support_accuracy": float(np.mean(picks)) if picks else float("nan"),
        "random_pick_accuracy": float(np.mean(base)) if base else float("nan"),
        "calibration_mae": float(np.mean([abs(c.q - c.ret) for c in cands])) if cands else float("nan"),
        "spread_colliding": float(np.mean(colliding)) if colliding else float("nan"),
        "spread_expert": float(np.mean(expert)) if expert else float("nan"),
        "colliding_share": len(colliding) / max(len(cands), 1),
    }


@torch.no_grad()
def collect_states(
    env_fn, policy, n_states: int, seed: int, gamma: float, every: int = 4, policy_samples: int = 8
) -> list[BranchState]:
    """Branch states with their candidates' true returns, from alternate expert and ``policy`` rollouts on seeds
    ``seed``, ``seed + 1``, ... until ``n_states``. ``env_fn()`` -> a fresh MultiPathEnv (unwrapped, state obs);
    ``policy``: a ChunkPolicy whose chunk gives To, Ta and the observation keys, sampled ``policy_samples`` times
    per state (its executed actions are candidates too)."""
    to, ta = policy.chunk.n_obs_steps, policy.chunk.n_action_steps
    keys = tuple(k for k in policy.chunk.obs_keys)
    states: list[BranchState] = []
    episode = 0
    while len(states) < n_states:
        source = "expert" if episode % 2 == 0 else "policy"
        env = env_fn()
        obs, _ = env.reset(seed=seed + episode)
        driver = ScriptedExpert(env)
        driver.reset(seed + episode)
        policy.reset()
        hist = None
        for t in range(env.cfg.max_steps):
            step = {k: torch.as_tensor(np.asarray(obs[k], np.float32))[None] for k in keys}  # (1, dim)
            hist = roll_history(hist, step, torch.zeros(1, dtype=torch.bool), to)  # {key: (1, To, dim)}
            if t % every == 0 and is_branch(env) and len(states) < n_states:
                cont = driver
                if source == "policy":  # the expert continues from where the policy brought the arm
                    cont = ScriptedExpert(env)
                    cont.take_over()
                cands = candidate_chunks(env, cont, ta)
                batch = {k: v.expand(policy_samples, *v.shape[1:]) for k, v in hist.items()}
                chunks = policy.predict_chunk(batch)[:, to - 1 : to - 1 + ta].cpu().numpy()  # (M, Ta, Da) raw
                cands += [Candidate("policy", c.astype(np.float32)) for c in chunks]
                for c in cands:
                    c.ret, c.collided = mc_return(env, cont, c.actions, gamma)
                carrying = env.task_state().attached >= 0
                states.append(BranchState(source, {k: v[0].numpy().copy() for k, v in hist.items()}, carrying, cands))
            action = driver.act() if source == "expert" else policy.act(obs)
            obs, _, terminated, truncated, _ = env.step(action)
            if terminated or truncated:
                break
        episode += 1
    return states
