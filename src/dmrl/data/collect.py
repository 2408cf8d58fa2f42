"""Parallel collection of scripted-expert episodes into an episode store (spawned worker processes).

Any registered env with an expert can be collected (envs/registry.py): the expert acts, the task's metadata says
which per-episode values to keep. Workers roll out episodes and send them back; only the main process writes,
one whole episode at a time, so the store's commit-marker design keeps every completed episode readable after
a crash or Ctrl-C.

An env whose step info carries ``terminal`` (bool) at every step reports a per-step terminal for TD backups in a
recording that goes on past it (OGBench single-task play data: the task holds before the action); the store then
keeps it (``Episode.terminals``, data/terminals), or'd with ``terminated`` at the last step.
"""

from __future__ import annotations

import multiprocessing as mp
import signal
from collections.abc import Iterator
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
from tqdm import tqdm

from dmrl.data.episodes import EpisodeStore, sigint_deferred
from dmrl.envs.registry import EnvSpec, Expert, env_spec, resolve
from dmrl.paths import check_output_path
from dmrl.types import ARRAY_MODES, Episode, parse_obs_modes


@dataclass
class CollectConfig:
    """``dmrl collect``: roll out the scripted expert and store the episodes."""

    out: Path
    """Output episode store (a directory, conventionally *.zarr). Existing stores are never overwritten
    unless --overwrite; use --append to add episodes to an existing store."""
    env: str = "dmrl/MultiPathGrasp-v0"
    """Registered environment: dmrl/MultiPathGrasp-v0, dmrl/MultiPathReach-v0 or your own (docs/extending.md)."""
    episodes: int = 100
    """Number of episodes to collect."""
    obs_modes: tuple[str, ...] = ("state", "joints", "force", "instruction")
    """Observation modalities to record (space or comma separated): rgb depth joints force instruction state."""
    seed: int = 0
    """Episode i is reset with seed + i (and the expert's route is drawn from the same seed)."""
    workers: int = 2
    """Worker processes (spawn); 0 runs everything in this process."""
    image_size: int = 64
    """H = W of rgb/depth (env option; the flags from here to --reward apply to envs that take them)."""
    cameras: tuple[str, ...] = ("front",)
    """Cameras for rgb/depth (front, top, side), stacked along channels."""
    n_objects: int = 3
    """Cups in the scene (2 or 3)."""
    paraphrases: str = "train"
    """Instruction paraphrase set: train, heldout or all."""
    reward: str = "shaped"
    """Stored rewards: shaped, sparse or shaped_v1 (the reward of RL results before the fix; docs/tasks.md)."""
    noise_std: float = 0.0
    """Gaussian action noise of the expert (expert option, like --suboptimal and --miss-prob)."""
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
        spec = env_spec(self.env)  # one-line error naming the registered envs
        if self.episodes < 1:
            raise ValueError(f"--episodes: got {self.episodes}; must be >= 1")
        if self.workers < 0:
            raise ValueError(f"--workers: got {self.workers}; must be >= 0")
        if self.seed < 0:
            raise ValueError(f"--seed: got {self.seed}; must be >= 0 (env seeds are non-negative)")
        if not 0 <= self.miss_prob <= 1:
            raise ValueError(f"--miss-prob: got {self.miss_prob}; allowed 0 .. 1")
        if spec.expert is None:
            raise ValueError(f"--env {self.env}: the task registered no scripted expert, so it cannot be collected")
        unsupported = [m for m in self.obs_modes if m not in spec.obs_modes]
        if unsupported:
            raise ValueError(f"--obs-modes: {self.env} does not emit {unsupported}; it has {list(spec.obs_modes)}")
        for names, given in ((_ENV_FLAGS, spec.options or ()), (_EXPERT_FLAGS, spec.expert_options)):
            for name in names:
                if name not in given and getattr(self, name) != _DEFAULTS[name]:
                    flag = "--" + name.replace("_", "-")
                    raise ValueError(f"{flag}: {self.env} takes no option {name!r}; leave it at its default")
        if self.overwrite and self.append:
            raise ValueError("--overwrite and --append exclude each other; pick one")

    def env_kwargs(self) -> dict[str, Any]:
        """Keyword arguments of the env factory: obs_modes and the env options the task takes."""
        given = env_spec(self.env).options or ()
        options = {k: tuple(v) if isinstance(v, list | tuple) else v for k, v in vars(self).items() if k in given}
        return {"obs_modes": self.obs_modes, **{k: options[k] for k in _ENV_FLAGS if k in options}}

    def expert_kwargs(self) -> dict[str, Any]:
        """Keyword arguments of the expert factory: the expert options the task takes."""
        return {k: getattr(self, k) for k in _EXPERT_FLAGS if k in env_spec(self.env).expert_options}

    def recorded(self) -> dict[str, str]:
        """The settings stored with the dataset (attr ``collect``): all but flags that do not apply to the env."""
        spec = env_spec(self.env)
        skip = [k for k in _ENV_FLAGS if k not in (spec.options or ())]
        skip += [k for k in _EXPERT_FLAGS if k not in spec.expert_options]
        return {k: str(v) for k, v in vars(self).items() if k not in skip}


_ENV_FLAGS = ("image_size", "cameras", "n_objects", "paraphrases", "reward")
_EXPERT_FLAGS = ("noise_std", "suboptimal", "miss_prob")
_DEFAULTS = {f.name: f.default for f in fields(CollectConfig) if f.name in (*_ENV_FLAGS, *_EXPERT_FLAGS)}


def record_episode(env: gym.Env, expert: Expert, seed: int, spec: EnvSpec | None = None) -> Episode:
    """Roll out one expert episode from ``env.reset(seed=seed)`` and return it as an :class:`Episode`; only its
    steps from ``expert.first_step`` on (e.g. a recovery after a deliberate miss).

    ``spec``: the task's registry entry (which per-episode values to keep); default: looked up by the env's
    ``env_id`` attribute, or none kept.
    """
    if spec is None:
        name = getattr(env.unwrapped, "env_id", None)
        spec = env_spec(name) if name is not None else EnvSpec("unregistered", "")
    obs, _ = env.reset(seed=seed)
    expert.reset(seed)  # the expert's own draws (MultiPath: the route) are a function of the episode seed
    keys = [k for k in ARRAY_MODES if k in obs]
    instruction = str(getattr(env.unwrapped, "instruction", obs.get("instruction", "")))
    steps: dict[str, list[np.ndarray]] = {k: [] for k in keys}
    actions, rewards, terminals = [], [], []
    while True:
        for k in keys:
            steps[k].append(obs[k])
        action = expert.act(obs)
        obs, reward, terminated, truncated, info = env.step(action)
        actions.append(action)
        rewards.append(reward)
        if TERMINAL_KEY in info:
            terminals.append(bool(info[TERMINAL_KEY]))
        if terminated or truncated:
            break
    first = int(getattr(expert, "first_step", 0) or 0)
    missing = [k for k in (*spec.episode_info, *spec.episode_metrics) if k not in info]
    if missing:
        raise ValueError(f"{spec.name}: the last step's info lacks {missing}, which the task's metadata declares")
    extra = {"first_step": float(first)} if first else {}
    if terminals and len(terminals) != len(actions):
        raise ValueError(f"{spec.name}: info[{TERMINAL_KEY!r}] at {len(terminals)} of {len(actions)} steps; need all")
    term = np.asarray(terminals[first:], dtype=bool) if terminals else None
    if term is not None:
        term[-1] |= bool(terminated)
    return Episode(
        obs={k: np.stack(v[first:]) for k, v in steps.items()},
        final_obs={k: obs[k] for k in keys},
        actions=np.asarray(actions[first:], dtype=np.float32),
        rewards=np.asarray(rewards[first:], dtype=np.float32),
        terminated=bool(terminated),
        truncated=bool(truncated),
        instruction=instruction,
        success=bool(info.get("is_success", False)),
        seed=int(seed),
        info={**{k: float(info[k]) for k in spec.episode_metrics}, **extra},
        task_info={k: info[k] for k in spec.episode_info},
        terminals=term,
    )


#: The step info key of a per-step terminal (see the module docstring).
TERMINAL_KEY = "terminal"


def reports_terminals(env: gym.Env, expert: Expert, seed: int) -> bool:
    """Whether ``env`` reports per-step terminals: ``terminal`` in the info of one expert step from a reset."""
    obs, _ = env.reset(seed=seed)
    expert.reset(seed)
    return TERMINAL_KEY in env.step(expert.act(obs))[4]


# ---------------------------------------------------------------------- worker side
_WORKER: tuple[gym.Env, Expert, EnvSpec] | None = None


def _init_worker(spec: EnvSpec, env_kwargs: dict[str, Any], expert_kwargs: dict[str, Any]) -> None:
    # The spec travels to the worker (spawn), so an env registered only in the parent works too.
    global _WORKER
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent owns Ctrl-C and shuts workers down
    env = resolve(spec.factory)(**spec.kwargs, **env_kwargs)
    assert spec.expert is not None
    _WORKER = (env, resolve(spec.expert)(env, **expert_kwargs), spec)


def _run_seed(seed: int) -> Episode:
    assert _WORKER is not None
    env, expert, spec = _WORKER
    return record_episode(env, expert, seed, spec)


def _episodes(cfg: CollectConfig, seeds: list[int]) -> Iterator[Episode]:
    args = (env_spec(cfg.env), cfg.env_kwargs(), cfg.expert_kwargs())
    if cfg.workers == 0:
        _init_worker(*args)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        yield from map(_run_seed, seeds)
        return
    ctx = mp.get_context("spawn")  # fork would copy GL contexts and torch threads; spawn is safe everywhere
    with ctx.Pool(cfg.workers, initializer=_init_worker, initargs=args) as pool:
        try:
            yield from pool.imap(_run_seed, seeds, chunksize=1)
        finally:
            pool.terminate()


def collect(cfg: CollectConfig, progress: bool = True) -> EpisodeStore:
    """Collect ``cfg.episodes`` expert episodes into ``cfg.out``; returns the open store."""
    check_output_path(cfg.out)  # one line, nothing created, before the env is even built
    spec = env_spec(cfg.env)
    probe = resolve(spec.factory)(**spec.kwargs, **cfg.env_kwargs())
    obs, _ = probe.reset(seed=cfg.seed)
    assert spec.expert is not None
    expert = resolve(spec.expert)(probe, **cfg.expert_kwargs())  # a bad expert option fails here, before the store
    terminals = reports_terminals(probe, expert, cfg.seed)
    action_dim = int(np.prod(probe.action_space.shape))
    meaning = spec.action_meaning or getattr(probe.unwrapped, "action_meaning", None)
    meaning = tuple(meaning) if meaning is not None else tuple(f"a{i}" for i in range(action_dim))
    probe.close()
    obs_spec = {k: (tuple(obs[k].shape), str(obs[k].dtype)) for k in cfg.obs_modes if k in ARRAY_MODES}
    if cfg.append:
        store = EpisodeStore.open(cfg.out, mode="a")
        if store.attrs.get("env_id") != cfg.env or tuple(store.obs_modes) != cfg.obs_modes:
            raise ValueError(
                f"--append: store {cfg.out} holds env {store.attrs.get('env_id')} with modalities "
                f"{','.join(store.obs_modes)}; this run asks for {cfg.env} with {','.join(cfg.obs_modes)}"
            )
        if store.has_terminals != terminals:
            have, env_has = ("keeps", "no longer reports") if store.has_terminals else ("keeps no", "reports")
            raise ValueError(
                f"--append: store {cfg.out} {have} per-step terminals, but {cfg.env} {env_has} them; "
                "collect into a new --out"
            )
        first_seed = cfg.seed + store.n_episodes
    else:
        store = EpisodeStore.create(
            cfg.out,
            env_id=cfg.env,
            obs_modes=cfg.obs_modes,
            action_meaning=list(meaning),
            obs_spec=obs_spec,
            action_dim=action_dim,
            overwrite=cfg.overwrite,
            extra_attrs={"collect": cfg.recorded()},
            episode_info=spec.episode_info,
            terminals=terminals,
        )
        first_seed = cfg.seed
    seeds = list(range(first_seed, first_seed + cfg.episodes))
    bar = tqdm(total=cfg.episodes, desc=f"collect {cfg.env}", unit="ep", disable=not progress)
    successes = done = 0
    try:
        for ep in _episodes(cfg, seeds):
            with sigint_deferred():
                store.append(ep)
            successes += ep.success
            done += 1
            bar.update(1)
            bar.set_postfix(success=f"{successes / done:.2f}")
    finally:
        bar.close()
    return store
