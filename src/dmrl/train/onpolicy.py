"""The on-policy data source (``--source.type rollout``): each batch is a fresh rollout of the current policy.

N envs run in the learner's process, one after another (an env step costs ~0.5 ms; the chain's batched denoiser
calls dominate). Every env plans a chunk at each decision through ``algo.explore(obs)``, executes its Ta actions
and adds up their rewards discounted within the chunk (Σ_k γ^k r_k, the chunk's share of the return), so the
algorithm sees decisions, not env steps. An episode that ends inside a chunk ends the decision there; one cut by
the step limit adds γ^n V(its last observation) to that reward (a time limit is not a terminal state). The env is
reset at its next decision, with a seed of its own stream (never an evaluation or selection seed).

A batch (T decisions, N envs): obs {key: (T, N, To, ...)}, what ``explore`` returned stacked (T, N, ...), reward,
done (T, N) and next_value (N,): V at the history after the last decision (an env whose episode just ended has
already been reset there; done masks its value).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from dmrl.data import EpisodeStore
from dmrl.envs import env_factory
from dmrl.policies.observations import TEXT_KEYS, step_tensors
from dmrl.train.config import RolloutConfig, TrainConfig
from dmrl.train.engine import Engine
from dmrl.train.offline import env_kwargs_from_store

#: Rollout episodes draw their seeds from 10_000_000 + 1_000_000 · --seed on: apart from the datasets' (30000..),
#: evaluation (100000..) and selection (200000..) seeds.
SEED_BASE = 10_000_000


class RolloutSource:
    """Fresh rollouts of ``algo.explore`` in ``n_envs`` envs, one per update, until the env-step budget is spent."""

    log_every = 1

    def __init__(self, cfg: TrainConfig, store: EpisodeStore, engine: Engine) -> None:
        self.cfg, self.engine = cfg, engine
        self.src: RolloutConfig = cfg.source
        text = [k for k in cfg.chunk.obs_keys if k in TEXT_KEYS]
        if text:
            raise ValueError(f"--source.type rollout: observation key(s) {text} are text; rollouts take arrays only")
        self.env_id = store.attrs["env_id"]
        self.env_kwargs = {**env_kwargs_from_store(store), "obs_modes": tuple(cfg.chunk.obs_keys)}
        if self.src.max_episode_steps:
            self.env_kwargs["max_steps"] = self.src.max_episode_steps
        self.envs: list[Any] = []
        self.algo: Any = None
        self.stats = {"episodes": 0, "successes": 0, "collisions": 0}

    # ------------------------------------------------------------------ DataSource
    def start(self, algo: Any, start_step: int) -> None:
        self.algo = algo
        make = env_factory(self.env_id, **self.env_kwargs)
        self.envs = [make() for _ in range(self.src.n_envs)]
        # A resumed run continues the seed stream where its saved env-step count leaves it.
        self.next_seed = SEED_BASE + 1_000_000 * self.cfg.seed + int(algo.env_steps)
        self.frames: list[list[dict]] = [[] for _ in self.envs]  # each env's last To observations; [] : reset it
        self.hist: dict | None = None
        self.skip_next = False

    def exhausted(self) -> bool:
        return bool(self.src.env_steps) and int(self.algo.env_steps) >= self.src.env_steps

    def events(self, step: int) -> list[dict]:
        return []

    def next_batch(self, step: int) -> dict:
        """One rollout of T decisions in every env (see the module docstring)."""
        to, ta = self.cfg.chunk.n_obs_steps, self.cfg.chunk.n_action_steps
        gamma = self.algo.config.critic.gamma
        t_, n = self.src.decisions, len(self.envs)
        rows: list[dict] = []
        reward, done = torch.zeros(t_, n), torch.zeros(t_, n, dtype=torch.bool)
        self.stats = {"episodes": 0, "successes": 0, "collisions": 0}
        for t in range(t_):
            self._observe()
            out = self.algo.explore(self.hist)
            rows.append({"obs": self.hist, **out})
            actions = self.algo.actor.raw_actions(out["chain"][:, -1])[:, to - 1 : to - 1 + ta].cpu().numpy()
            for i, env in enumerate(self.envs):
                reward[t, i], done[t, i] = self._run_chunk(i, env, actions[i], gamma)
        self._observe()  # V's bootstrap reads it; the next rollout's first decision starts from it
        self.skip_next = True
        device = self.engine.device
        return {
            "obs": {k: torch.stack([r["obs"][k] for r in rows]) for k in rows[0]["obs"]},
            **{k: torch.stack([r[k] for r in rows]) for k in rows[0] if k != "obs"},
            "reward": reward.to(device),
            "done": done.to(device),
            "next_value": self.algo.state_value(self.hist),
        }

    def _observe(self) -> None:
        """Reset the envs whose episode ended and set the history to every env's last To frames, once per decision
        (the call right after a rollout's last decision serves the next rollout's first)."""
        if self.skip_next:
            self.skip_next = False
            return
        for i, env in enumerate(self.envs):
            if not self.frames[i]:
                obs, _ = env.reset(seed=self.next_seed)
                self.next_seed += 1
                self.frames[i] = [obs]
        self.hist = self._history(self.frames)

    def _history(self, frames: list[list[dict]]) -> dict:
        """Each env's last To frames (oldest first; a new episode's first frame repeated, as in the training
        windows) -> {key: (N, To, ...)}."""
        to, keys = self.cfg.chunk.n_obs_steps, tuple(self.cfg.chunk.obs_keys)
        padded = [[f[0]] * (to - len(f[-to:])) + f[-to:] for f in frames]
        steps = [step_tensors(_stack([p[j] for p in padded], keys), keys, self.engine.device)[0] for j in range(to)]
        return {k: torch.stack([s[k] for s in steps], 1) for k in keys}

    def _run_chunk(self, i: int, env: Any, actions: np.ndarray, gamma: float) -> tuple[float, bool]:
        """Execute env i's Ta actions (Ta, Da) -> (discounted chunk reward, whether its episode ended)."""
        total, disc = 0.0, 1.0
        for a in actions:
            obs, r, term, trunc, info = env.step(a)
            self.algo.env_steps += 1
            total += disc * float(r)
            disc *= gamma
            self.frames[i] = (self.frames[i] + [obs])[-self.cfg.chunk.n_obs_steps :]
            if term or trunc:
                self.stats["episodes"] += 1
                self.stats["successes"] += int(bool(info.get("is_success", False)))
                self.stats["collisions"] += int(bool(info.get("collision", False)))
                if trunc and not term:  # a time limit, not a terminal state: bootstrap from where it was cut
                    total += disc * float(self.algo.state_value(self._history([self.frames[i]]))[0])
                self.frames[i] = []
                return total, True
        return total, False

    def after_update(self, step: int, logs: dict, algo: Any) -> None:
        s = self.stats
        if s["episodes"]:
            logs["rollout_success"] = s["successes"] / s["episodes"]
            logs["rollout_collision"] = s["collisions"] / s["episodes"]
        logs["env_steps"] = int(algo.env_steps)

    def rates(self, steps: int, seconds: float) -> dict[str, float]:
        return {"updates_per_s": steps / seconds}

    def validation(self, step: int, algo: Any) -> dict[str, float]:
        return {}

    def curve(self, step: int, algo: Any) -> dict[str, float] | None:
        """A learning-curve point every curve_every updates: the evaluation policy on the evaluation seeds."""
        if not (self.src.curve_every and step % self.src.curve_every == 0):
            return None
        from dmrl.train.evaluate import curve_point

        seeds = list(range(self.cfg.eval_seed, self.cfg.eval_seed + self.src.curve_episodes))
        env = (self.env_id, self.eval_env_kwargs())
        point = curve_point(algo.evaluation_policy(), *env, seeds, self.cfg.eval_envs, self.engine.device)
        return {**point, "env_steps": int(algo.env_steps)}

    def eval_env_kwargs(self) -> dict[str, Any]:
        return {k: v for k, v in self.env_kwargs.items() if k != "obs_modes"}

    def meta(self) -> dict[str, Any]:
        return {"env_steps": int(self.algo.env_steps) if self.algo is not None else 0}

    def close(self) -> None:
        for env in self.envs:
            env.close()
        self.envs = []


def _stack(obs: list[dict], keys: tuple[str, ...]) -> dict:
    """Per-env observations -> {key: (N, ...)}."""
    return {k: np.stack([o[k] for o in obs]) for k in keys}
