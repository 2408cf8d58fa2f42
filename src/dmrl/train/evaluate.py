"""Closed-loop evaluation of a policy on fixed seeds with vectorised envs in worker processes.

Reports what the comparison needs: success with a Wilson interval and the episode count, collisions, the
route split (did the policy keep both modes?), smoothness, episode length and decision latency.
"""

from __future__ import annotations

import copy
import dataclasses
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch

from dmrl.envs import env_factory, env_spec, make_env
from dmrl.policies.base import ChunkPolicy
from dmrl.train.metrics import smoothness, wilson_interval


@dataclass
class EpisodeRecord:
    seed: int
    success: bool
    collision: bool
    route: str | None
    length: int
    jerk: float
    max_jump: float
    tip_path: np.ndarray = field(repr=False)  # (T, 3)
    target: str | None = None  # the named cup's colour, in a task that grasps (the env reports "held")
    first_grasp: str | None = None  # colour of the first cup the tool held; None if it held none
    grasp_step: int | None = None  # env step (1-based) at which it first held a cup


@dataclass
class EvalResult:
    episodes: int
    success_rate: float
    ci_low: float
    ci_high: float
    collision_rate: float
    route_left: float
    route_right: float
    route_none: float
    jerk: float
    max_action_change: float
    mean_length: float
    grasp_target: float = float("nan")
    """Grasp task: fraction of episodes whose first held cup was the named one (nan where the env has no cups)."""
    grasp_wrong: float = float("nan")
    """... whose first held cup was another one."""
    grasp_none: float = float("nan")
    """... that never held a cup."""
    grasp_step: float = float("nan")
    """Mean env step of the first grasp, over the episodes with one."""
    latency_ms: float = float("nan")
    latency_p95_ms: float = float("nan")
    records: list[EpisodeRecord] = field(default_factory=list, repr=False)

    def summary(self) -> dict:
        out = asdict(self)
        out.pop("records")
        return out


def check_drop(policy: ChunkPolicy, drop: tuple[str, ...]) -> tuple[str, ...]:
    """Validated modalities to withhold from the policy: keys it reads, leaving at least one, multimodal only."""
    drop = tuple(dict.fromkeys(drop))
    if not drop:
        return drop
    keys = tuple(policy.chunk.obs_keys)
    unknown = [k for k in drop if k not in keys]
    if unknown:
        raise ValueError(f"--drop-modality {unknown[0]}: the policy does not read it (its keys: {', '.join(keys)})")
    if policy.chunk.encoder_type != "multimodal":
        raise ValueError("--drop-modality needs a policy with chunk.encoder.type multimodal (lowdim cannot mask a key)")
    if set(drop) >= set(keys):
        raise ValueError(f"--drop-modality: dropping {', '.join(drop)} leaves the policy no observation")
    return drop


def set_action_steps(policy: ChunkPolicy, n: int) -> None:
    """Execute ``n`` actions of each chunk before replanning (Ta) instead of the trained setting. Every BC window
    predicts all Tp actions, so this is an inference-time choice: fewer steps close the loop more often and plan
    more often. One catch: unless the policy trained with ``chunk.pad_after`` Tp - To, its windows stopped Ta - 1
    steps past each episode's end, so its last steps were never a current step; a smaller Ta then replans from
    states it never learned to act in (MultiPath: the release, see benchmarks/release_timing.py)."""
    c = policy.chunk
    top = c.horizon - c.n_obs_steps + 1
    if not 1 <= n <= top:
        raise ValueError(f"--action-steps: got {n}; allowed 1 .. {top} (Tp - To + 1 of this checkpoint's chunk)")
    policy.chunk = dataclasses.replace(c, n_action_steps=n)
    policy.reset()


class NonFiniteObservationError(ValueError):
    """An env emitted NaN or ±inf in an observation the policy reads (one line: env, seed, key, step)."""


def check_obs(obs: dict, env_id: str, seeds: list[int], steps: list[int], active: np.ndarray | None = None) -> None:
    """Raise `NonFiniteObservationError` if a float observation (B, ...) of an active env holds NaN or ±inf.

    ``seeds``, ``steps`` (B,): each env's episode seed and env step (0: the reset observation). A policy would
    act on the NaN (its normalizer and network pass it on) and the episode's numbers would mean nothing.
    """
    for key, x in obs.items():
        if not (isinstance(x, np.ndarray) and np.issubdtype(x.dtype, np.floating)):
            continue  # rgb uint8, instruction strings
        finite = np.isfinite(x.reshape(len(x), -1)).all(axis=1)
        if active is not None:
            finite |= ~active  # a finished env's stale observation is never acted on
        bad = np.flatnonzero(~finite)
        if len(bad):
            i = int(bad[0])
            v = float(x[i][~np.isfinite(x[i])].flat[0])
            kind = "NaN" if np.isnan(v) else ("+inf" if v > 0 else "-inf")
            raise NonFiniteObservationError(
                f"env {env_id} (seed {seeds[i]}): observation {key!r} has {kind} at step {steps[i]}; "
                "the policy cannot act on it (check the env's observations)"
            )


def _without(obs: dict, drop: tuple[str, ...]) -> dict:
    # The env still emits the modality (same physics, same seeds); the policy just never sees it.
    return {k: v for k, v in obs.items() if k not in drop} if drop else obs


def evaluate(
    policy: ChunkPolicy,
    env_id: str,
    seeds: list[int],
    env_kwargs: dict | None = None,
    n_envs: int = 8,
    workers: bool = True,
    progress=None,
    drop: tuple[str, ...] = (),
) -> EvalResult:
    """Run one episode per seed; ``n_envs`` envs step in lockstep (in spawned processes if ``workers``).

    ``drop``: modalities removed from every observation before the policy sees it (its encoder masks them).
    """
    import gymnasium as gym

    drop = check_drop(policy, drop)
    env_kwargs = {"obs_modes": tuple(policy.chunk.obs_keys), **(env_kwargs or {})}
    n_envs = max(1, min(n_envs, len(seeds)))
    fns = [env_factory(env_id, **env_kwargs) for _ in range(n_envs)]  # picklable: carries the factory to workers
    mode = gym.vector.AutoresetMode.DISABLED
    envs = (
        gym.vector.AsyncVectorEnv(fns, context="spawn", shared_memory=False, autoreset_mode=mode)
        if workers
        else gym.vector.SyncVectorEnv(fns, autoreset_mode=mode)
    )
    policy.eval()
    torch.manual_seed(0)  # stochastic samplers draw the same noise for the same seeds
    pending = list(seeds)
    current = [pending.pop(0) for _ in range(n_envs)]
    records: list[EpisodeRecord] = []
    try:
        obs, info = envs.reset(seed=current)
        policy.reset()
        active = np.ones(n_envs, dtype=bool)
        actions: list[list[np.ndarray]] = [[] for _ in range(n_envs)]
        tips: list[list[np.ndarray]] = [[_tip(info, i)] for i in range(n_envs)]
        grasps: list[tuple[str, int] | None] = [None] * n_envs  # (colour, step) of each env's first held cup
        while active.any():
            seen = _without(obs, drop)
            check_obs(seen, env_id, current, [len(a) for a in actions], active)
            act = policy.act(seen)
            act[~active] = 0.0
            obs, _, term, trunc, info = envs.step(act)
            done = (term | trunc) & active
            for i in np.flatnonzero(active):
                actions[i].append(act[i])
                tips[i].append(_tip(info, i))
                held = info["held"][i] if "held" in info else None
                if grasps[i] is None and held is not None:
                    grasps[i] = (str(held), len(actions[i]))
            for i in np.flatnonzero(done):
                jerk, jump = smoothness(np.asarray(actions[i]))
                records.append(
                    EpisodeRecord(
                        seed=current[i],
                        success=bool(info["is_success"][i]),
                        collision=bool(info["collision"][i]) if "collision" in info else False,
                        route=info["route"][i] if "route" in info else None,
                        length=len(actions[i]),
                        jerk=jerk,
                        max_jump=jump,
                        tip_path=np.asarray(tips[i]),
                        target=info["target"][i] if "held" in info else None,
                        first_grasp=grasps[i][0] if grasps[i] else None,
                        grasp_step=grasps[i][1] if grasps[i] else None,
                    )
                )
                if progress is not None:
                    progress.update(1)
            if not done.any():
                continue
            for i in np.flatnonzero(done):
                if pending:
                    current[i] = pending.pop(0)
                else:
                    active[i] = False  # no seeds left: reset anyway (a finished env must not be stepped)
            if active.any():
                obs, info = envs.reset(seed=list(current), options={"reset_mask": done})
                policy.reset(mask=done)
                for i in np.flatnonzero(done):
                    actions[i], tips[i], grasps[i] = [], [_tip(info, i)], None
    finally:
        envs.close()
    records.sort(key=lambda r: r.seed)
    return summarize(records, routes="route" in env_spec(env_id).episode_info)


def _tip(info: dict, i: int) -> np.ndarray:
    # MultiPath reports the tool tip (the path plots); another task may not: an empty path then.
    return np.asarray(info["tip"][i]) if "tip" in info else np.zeros(3)


def curve_point(
    policy: ChunkPolicy, env_id: str, env_kwargs: dict, seeds: list[int], n_envs: int, device: torch.device
) -> dict[str, float]:
    """One learning-curve point in the middle of training.

    Runs a CPU copy of ``policy`` (so the training copy keeps its device and train mode) on ``seeds`` in ``n_envs``
    lockstep envs, inside fork_rng: evaluate() reseeds torch, which must not move training's stream.
    On CPU, the training device here, that is the cheapest place; on an accelerator it costs a host copy, and under
    DDP the other ranks wait for rank 0 in their next all-reduce (keep curve_episodes small there).
    """
    from dmrl.train.engine.device import fork_rng

    snapshot = copy.deepcopy(policy).cpu()
    for m in snapshot.modules():  # Module.compile's wrapper still calls the original module: drop it from the copy
        m.__dict__.pop("_compiled_call_impl", None)
    with fork_rng(device):
        r = evaluate(snapshot, env_id, seeds, env_kwargs, n_envs=n_envs)
    return {
        "curve_success": r.success_rate,
        "curve_ci_low": r.ci_low,
        "curve_ci_high": r.ci_high,
        "curve_collision": r.collision_rate,
    }


def summarize(records: list[EpisodeRecord], routes: bool = True) -> EvalResult:
    """Aggregate per-episode records; ``routes`` False (a task without routes) leaves the route split nan."""
    n = len(records)
    k = sum(r.success for r in records)
    lo, hi = wilson_interval(k, n)
    route_list = [r.route for r in records]
    grasp = {}
    if all(r.target is not None for r in records):  # a task with a named cup: where did the first grasp go
        steps = [r.grasp_step for r in records if r.grasp_step is not None]
        grasp = {
            "grasp_target": sum(r.first_grasp == r.target for r in records) / n,
            "grasp_wrong": sum(r.first_grasp not in (None, r.target) for r in records) / n,
            "grasp_none": sum(r.first_grasp is None for r in records) / n,
            "grasp_step": float(np.mean(steps)) if steps else float("nan"),
        }
    return EvalResult(
        episodes=n,
        success_rate=k / n,
        ci_low=lo,
        ci_high=hi,
        collision_rate=float(np.mean([r.collision for r in records])),
        route_left=route_list.count("left") / n if routes else float("nan"),
        route_right=route_list.count("right") / n if routes else float("nan"),
        route_none=route_list.count(None) / n if routes else float("nan"),
        jerk=float(np.mean([r.jerk for r in records])),
        max_action_change=float(np.max([r.max_jump for r in records])),
        mean_length=float(np.mean([r.length for r in records])),
        **grasp,
        records=records,
    )


def measure_latency(
    policy: ChunkPolicy,
    env_id: str,
    env_kwargs: dict | None = None,
    seed: int = 10_000,
    steps: int = 80,
    drop: tuple[str, ...] = (),
) -> tuple[float, float]:
    """(median, p95) milliseconds per ``act`` call at batch 1 in one closed-loop episode (replans included)."""
    drop = check_drop(policy, drop)
    env = make_env(env_id, **{"obs_modes": tuple(policy.chunk.obs_keys), **(env_kwargs or {})})
    obs, _ = env.reset(seed=seed)
    policy.eval()
    policy.reset()
    times = []
    episode_seed, t_env = seed, 0
    for _ in range(steps):
        seen = _without(obs, drop)
        check_obs({k: np.asarray(v)[None] for k, v in seen.items()}, env_id, [episode_seed], [t_env])
        t = time.perf_counter()
        a = policy.act(seen)
        times.append((time.perf_counter() - t) * 1e3)
        obs, _, term, trunc, _ = env.step(a)
        t_env += 1
        if term or trunc:
            episode_seed, t_env = seed + 1, 0
            obs, _ = env.reset(seed=episode_seed)
            policy.reset()
    env.close()
    return float(np.median(times)), float(np.percentile(times, 95))


def save_rollout_gif(
    policy: ChunkPolicy,
    env_id: str,
    path: Path,
    seeds: list[int],
    env_kwargs: dict | None = None,
    size: int = 96,
    drop: tuple[str, ...] = (),
) -> Path:
    """Render closed-loop episodes (the first camera) into one GIF."""
    import imageio.v2 as imageio

    from dmrl.envs.render import MultiCameraRenderer

    drop = check_drop(policy, drop)
    env = make_env(env_id, **{"obs_modes": tuple(policy.chunk.obs_keys), **(env_kwargs or {})})
    # A renderer of its own at the GIF size: the env's observations keep the size the policy was trained on.
    viewer = MultiCameraRenderer(env.model, size, env.cfg.cameras[:1], env.cfg.shadows)

    def frame() -> np.ndarray:
        return np.moveaxis(viewer.render(env.data, True, False)[0], 0, -1)

    frames = []
    policy.eval()
    try:
        for seed in seeds:
            obs, _ = env.reset(seed=seed)
            policy.reset()
            for _ in range(env.cfg.max_steps):
                frames.append(frame())
                obs, _, term, trunc, _ = env.step(policy.act(_without(obs, drop)))
                if term or trunc:
                    frames.extend([frame()] * 5)
                    break
    finally:
        viewer.close()
        env.close()
    path.parent.mkdir(parents=True, exist_ok=True)
    imageio.mimsave(path, frames, duration=0.1, loop=0)
    return path
