"""Parallel collection of scripted-expert episodes into an episode store (spawned worker processes).

Workers roll out episodes and send them back; only the main process writes, one whole episode at a time,
so the store's commit-marker design keeps every completed episode readable after a crash or Ctrl-C.
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import signal
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from tqdm import tqdm

from dmrl.data import EpisodeStore
from dmrl.envs import ENV_IDS, make_env
from dmrl.envs.experts import ExpertConfig, ScriptedExpert
from dmrl.envs.multipath import ACTION_MEANING, MultiPathEnv
from dmrl.types import ARRAY_MODES, Episode, parse_obs_modes


@dataclass
class CollectConfig:
    """``dmrl collect``: roll out the scripted expert and store the episodes."""

    out: Path
    """Output episode store (a directory, conventionally *.zarr). Existing stores are never overwritten
    unless --overwrite; use --append to add episodes to an existing store."""
    env: str = "dmrl/MultiPathGrasp-v0"
    """Environment id: dmrl/MultiPathGrasp-v0 or dmrl/MultiPathReach-v0."""
    episodes: int = 100
    """Number of episodes to collect."""
    obs_modes: tuple[str, ...] = ("state", "joints", "force", "instruction")
    """Observation modalities to record (space or comma separated): rgb depth joints force instruction state."""
    seed: int = 0
    """Episode i is reset with seed + i (and the expert's route is drawn from the same seed)."""
    workers: int = 2
    """Worker processes (spawn); 0 runs everything in this process."""
    image_size: int = 64
    """H = W of rgb/depth."""
    cameras: tuple[str, ...] = ("front",)
    """Cameras for rgb/depth (front, top, side), stacked along channels."""
    n_objects: int = 3
    """Cups in the scene (2 or 3)."""
    paraphrases: str = "train"
    """Instruction paraphrase set: train, heldout or all."""
    noise_std: float = 0.0
    """Gaussian action noise of the expert."""
    suboptimal: bool = False
    """Expert hesitates, detours and sometimes fails on purpose (for offline-RL datasets)."""
    miss_prob: float = 0.0
    """Grasp only: fraction of episodes whose first grasp aims 2.6-4.5 cm off the cup and is then retried;
    such an episode is stored from the step the expert notices the miss (a recovery demonstration, which
    starts mid-task: info["first_step"] says where)."""
    overwrite: bool = False
    """Replace an existing store at --out (its episodes are deleted)."""
    append: bool = False
    """Add episodes to an existing store at --out (same env and modalities required)."""

    def __post_init__(self) -> None:
        self.out = Path(self.out)
        self.obs_modes = parse_obs_modes(",".join(self.obs_modes))
        if self.env not in ENV_IDS:
            raise ValueError(f"--env: got {self.env!r}; known environments: {', '.join(ENV_IDS)}")
        if self.episodes < 1:
            raise ValueError(f"--episodes: got {self.episodes}; must be >= 1")
        if self.workers < 0:
            raise ValueError(f"--workers: got {self.workers}; must be >= 0")
        if not 0 <= self.miss_prob <= 1:
            raise ValueError(f"--miss-prob: got {self.miss_prob}; allowed 0 .. 1")
        if self.miss_prob > 0 and (self.suboptimal or ENV_IDS[self.env] != "grasp"):
            raise ValueError("--miss-prob needs the grasp env and no --suboptimal (it retries a missed grasp)")
        if self.overwrite and self.append:
            raise ValueError("--overwrite and --append exclude each other; pick one")

    def env_kwargs(self) -> dict:
        return dict(
            obs_modes=self.obs_modes,
            image_size=self.image_size,
            cameras=tuple(self.cameras),
            n_objects=self.n_objects,
            paraphrases=self.paraphrases,
        )


def record_episode(env: MultiPathEnv, expert: ScriptedExpert, seed: int) -> Episode:
    """Roll out one expert episode from ``env.reset(seed=seed)`` and return it as an :class:`Episode`; with a
    deliberate miss, only its steps from ``expert.recovered_at`` on."""
    obs, _ = env.reset(seed=seed)
    # The route is a function of the episode seed, from a stream independent of the env's own draws.
    expert.rng = np.random.default_rng((seed, 0xE))
    expert.reset()
    keys = [k for k in env.cfg.obs_modes if k in ARRAY_MODES]
    steps: dict[str, list[np.ndarray]] = {k: [] for k in keys}
    actions, rewards = [], []
    while True:
        for k in keys:
            steps[k].append(obs[k])
        action = expert.act()
        obs, reward, terminated, truncated, info = env.step(action)
        actions.append(action)
        rewards.append(reward)
        if terminated or truncated:
            break
    # A deliberate miss (ExpertConfig.miss_prob) is not a demonstration: keep the recovery that follows it.
    first = expert.recovered_at or 0
    extra = {"first_step": float(first)} if first else {}
    return Episode(
        obs={k: np.stack(v[first:]) for k, v in steps.items()},
        final_obs={k: obs[k] for k in keys},
        actions=np.asarray(actions[first:], dtype=np.float32),
        rewards=np.asarray(rewards[first:], dtype=np.float32),
        terminated=bool(terminated),
        truncated=bool(truncated),
        instruction=env.instruction,
        target=info["target"],
        route=info["route"],
        success=bool(info["is_success"]),
        seed=int(seed),
        info={"collision": float(info["collision"]), **extra},
    )


# ---------------------------------------------------------------------- worker side
_WORKER: tuple[MultiPathEnv, ScriptedExpert] | None = None


def _init_worker(cfg: CollectConfig) -> None:
    global _WORKER
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent owns Ctrl-C and shuts workers down
    env = make_env(cfg.env, **cfg.env_kwargs())
    expert = ScriptedExpert(
        env, ExpertConfig(noise_std=cfg.noise_std, suboptimal=cfg.suboptimal, miss_prob=cfg.miss_prob)
    )
    _WORKER = (env, expert)


def _run_seed(seed: int) -> Episode:
    assert _WORKER is not None
    return record_episode(*_WORKER, seed)


def _episodes(cfg: CollectConfig, seeds: list[int]) -> Iterator[Episode]:
    if cfg.workers == 0:
        _init_worker(cfg)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        yield from map(_run_seed, seeds)
        return
    ctx = mp.get_context("spawn")  # fork would copy GL contexts and torch threads; spawn is safe everywhere
    with ctx.Pool(cfg.workers, initializer=_init_worker, initargs=(cfg,)) as pool:
        try:
            yield from pool.imap(_run_seed, seeds, chunksize=1)
        finally:
            pool.terminate()


@contextlib.contextmanager
def _sigint_deferred() -> Iterator[None]:
    """Hold Ctrl-C while an episode is being written; re-raise it once the write is complete."""
    pending: list[int] = []
    previous = signal.signal(signal.SIGINT, lambda signum, frame: pending.append(signum))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
        if pending:
            raise KeyboardInterrupt


def collect(cfg: CollectConfig, progress: bool = True) -> EpisodeStore:
    """Collect ``cfg.episodes`` expert episodes into ``cfg.out``; returns the open store."""
    probe = make_env(cfg.env, **cfg.env_kwargs())
    obs, _ = probe.reset(seed=cfg.seed)
    probe.close()
    spec = {k: (tuple(obs[k].shape), str(obs[k].dtype)) for k in cfg.obs_modes if k in ARRAY_MODES}
    if cfg.append:
        store = EpisodeStore.open(cfg.out, mode="a")
        if store.attrs.get("env_id") != cfg.env or tuple(store.obs_modes) != cfg.obs_modes:
            raise ValueError(
                f"--append: store {cfg.out} holds env {store.attrs.get('env_id')} with modalities "
                f"{','.join(store.obs_modes)}; this run asks for {cfg.env} with {','.join(cfg.obs_modes)}"
            )
        first_seed = cfg.seed + store.n_episodes
    else:
        store = EpisodeStore.create(
            cfg.out,
            env_id=cfg.env,
            obs_modes=cfg.obs_modes,
            action_meaning=list(ACTION_MEANING),
            obs_spec=spec,
            action_dim=len(ACTION_MEANING),
            overwrite=cfg.overwrite,
            extra_attrs={"collect": {k: str(v) for k, v in vars(cfg).items()}},
        )
        first_seed = cfg.seed
    seeds = list(range(first_seed, first_seed + cfg.episodes))
    bar = tqdm(total=cfg.episodes, desc=f"collect {cfg.env}", unit="ep", disable=not progress)
    successes = done = 0
    try:
        for ep in _episodes(cfg, seeds):
            with _sigint_deferred():
                store.append(ep)
            successes += ep.success
            done += 1
            bar.update(1)
            bar.set_postfix(success=f"{successes / done:.2f}")
    finally:
        bar.close()
    return store
