"""The task registry: a plain dict of env name -> (factory, task metadata), as gymnasium's registry keeps entry points.

``dmrl collect``, ``dmrl eval`` and training's evaluation build every environment through :func:`make_env`, so a
user's own task works everywhere once it is registered::

    register_env("me/Pick-v0", "my_pkg.envs:make_pick", episode_info={"bin": InfoField()}, expert=PickExpert)

A factory (a callable, or a lazy ``"module:attr"`` string) is called as ``factory(obs_modes=..., **options)`` and
returns a ``gymnasium.Env`` whose observations are a dict of the modalities asked for (DESIGN.md's observation
keys) and whose actions are a float32 Box in [-1, 1]. The metadata (:class:`EnvSpec`) says what the rest of dmrl
may expect of the task: which per-episode values it reports, whether it has a scripted expert, which options it
takes. Registering also registers the name with gymnasium, so ``gymnasium.make(name)`` works after ``import dmrl``.
Nothing here imports MuJoCo or torch: the built-in MultiPath tasks are registered by entry-point strings.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import gymnasium as gym
import numpy as np

from dmrl.types import OBS_MODES, ROUTES, InfoField, parse_obs_modes

Factory = Callable[..., gym.Env] | str


class Expert(Protocol):
    """A scripted expert for ``dmrl collect``: built as ``expert(env, **expert_options)``.

    ``reset(seed)`` is called right after ``env.reset(seed=seed)`` (draw the expert's own randomness from that
    seed, so an episode is a function of its seed), then ``act(obs)`` once per step until the episode ends. An
    expert may set ``first_step`` (int) during an episode to keep only the steps from there on (e.g. a
    recovery after a deliberate mistake); 0 or absent keeps the whole episode.
    """

    def reset(self, seed: int) -> None: ...

    def act(self, obs: Mapping[str, Any]) -> np.ndarray: ...


@dataclass(frozen=True)
class EnvSpec:
    """One registered task: its factory and what dmrl may expect of it."""

    name: str
    """Registered name, e.g. dmrl/MultiPathGrasp-v0 (gymnasium's namespace/Name-vN form)."""
    factory: Factory
    """Callable or "module:attr" string; called as factory(**kwargs, obs_modes=..., **options)."""
    kwargs: dict[str, Any] = field(default_factory=dict)
    """Fixed keyword arguments of the factory for this name (MultiPath: the task)."""
    obs_modes: tuple[str, ...] = ("state",)
    """Observation modalities the task can emit (a subset of types.OBS_MODES); collect and eval ask for a subset."""
    options: tuple[str, ...] | None = None
    """Keyword options the factory takes besides obs_modes (collect's --image-size etc. are passed only when
    listed); None: not declared, nothing but obs_modes is passed."""
    episode_info: dict[str, InfoField] = field(default_factory=dict)
    """Per-episode values the task reports in the info of an episode's last step, kept by the episode store
    (MultiPath: route and target). Evaluation reports the route split only for a task with ``route``."""
    episode_metrics: tuple[str, ...] = ()
    """Numeric info keys of the last step kept in each stored episode's ``info`` (MultiPath: collision)."""
    expert: Callable[..., Expert] | str | None = None
    """Scripted expert factory, expert(env, **expert_options) -> Expert; None: the task cannot be collected."""
    expert_options: tuple[str, ...] = ()
    """Keyword options the expert takes (collect's --noise-std, --suboptimal, --miss-prob when listed)."""
    action_meaning: tuple[str, ...] | None = None
    """Names of the action dimensions, stored with each dataset; None: the env's ``action_meaning`` attribute if
    it has one, else a0, a1, ..."""
    extra: dict[str, Any] = field(default_factory=dict)
    """Anything else a tool may want to know (MultiPath: its task, for the path plots)."""


#: name -> EnvSpec. A plain dict: read it, or extend it with register_env.
REGISTRY: dict[str, EnvSpec] = {}
_SPEC_FIELDS = tuple(f.name for f in dataclasses.fields(EnvSpec) if f.name not in ("name", "factory"))


def register_env(name: str, factory: Factory, *, overwrite: bool = False, **metadata: Any) -> EnvSpec:
    """Register ``name`` -> ``factory`` with its task metadata (the fields of :class:`EnvSpec`) in dmrl and gymnasium.

    Registering a name twice is an error unless ``overwrite``.
    """
    unknown = sorted(set(metadata) - set(_SPEC_FIELDS))
    if unknown:
        raise ValueError(f"register_env({name!r}): unknown metadata {unknown}; allowed: {', '.join(_SPEC_FIELDS)}")
    if name in REGISTRY and not overwrite:
        raise ValueError(f"register_env: {name!r} is already registered; pass overwrite=True to replace it")
    if "obs_modes" in metadata:
        metadata["obs_modes"] = parse_obs_modes(metadata["obs_modes"])
    spec = EnvSpec(name, factory, **metadata)
    REGISTRY[name] = spec
    if name not in gym.registry or overwrite:
        # disable_env_checker: the checker would step the env once at make time, which moves no seed of ours
        # but costs a MuJoCo step per construction in every vector-env worker.
        gym.register(name, entry_point=factory, kwargs=dict(spec.kwargs), disable_env_checker=True)
    return spec


def env_spec(name: str) -> EnvSpec:
    """The registered spec of ``name``; an unknown name is a one-line error listing the known ones."""
    if name not in REGISTRY:
        raise ValueError(
            f"--env: got {name!r}; known environments: {', '.join(REGISTRY)} (register your own with "
            "dmrl.envs.register_env, see docs/extending.md)"
        )
    return REGISTRY[name]


def resolve(ref: Callable[..., Any] | str) -> Callable[..., Any]:
    """A callable, or the object a "module:attr" string names (imported now)."""
    if callable(ref):
        return ref
    module, _, attr = ref.partition(":")
    return getattr(importlib.import_module(module), attr)


def env_factory(name: str, **kwargs: Any) -> Callable[[], gym.Env]:
    """A picklable no-argument callable that builds ``name`` with ``kwargs`` (for vector envs in spawned workers:
    it carries the factory itself, so the worker need not have registered ``name``)."""
    spec = env_spec(name)
    allowed = ("obs_modes", *(spec.options or ()))
    bad = sorted(set(kwargs) - set(allowed))
    if bad:
        raise ValueError(f"env option(s) {bad} unknown for {name}; allowed: {', '.join(sorted(allowed))}")
    return functools.partial(_build, spec.factory, {**spec.kwargs, **kwargs})


def _build(factory: Factory, kwargs: dict[str, Any]) -> gym.Env:
    return resolve(factory)(**kwargs)


def make_env(name: str, **kwargs: Any) -> gym.Env:
    """Build the registered env ``name``: factory(**spec.kwargs, **kwargs); unknown names are a one-line error."""
    return env_factory(name, **kwargs)()


def make_expert(name: str, env: gym.Env, **options: Any) -> Expert:
    """The task's scripted expert on ``env``; a one-line error if the task has none."""
    spec = env_spec(name)
    if spec.expert is None:
        raise ValueError(f"--env {name}: the task registered no scripted expert (register_env(..., expert=...))")
    return resolve(spec.expert)(env, **options)


# --------------------------------------------------------------------------- built-in tasks
#: MultiPathConfig's fields (but task), checked against the dataclass by the tests.
MULTIPATH_OPTIONS = (
    "image_size",
    "cameras",
    "n_objects",
    "max_steps",
    "paraphrases",
    "shadows",
    "substeps",
    "success_bonus",
    "collision_penalty",
    "shaping_scale",
    "reward",
    "gamma",
)
MULTIPATH_ENVS = {"dmrl/MultiPathReach-v0": "reach", "dmrl/MultiPathGrasp-v0": "grasp"}


def _register_builtin() -> None:
    for name, task in MULTIPATH_ENVS.items():
        if name in REGISTRY:
            continue
        register_env(
            name,
            "dmrl.envs.multipath:MultiPathEnv",
            kwargs={"task": task},
            obs_modes=OBS_MODES,
            options=MULTIPATH_OPTIONS,
            episode_info={"route": InfoField(categories=ROUTES), "target": InfoField()},
            episode_metrics=("collision",),
            expert="dmrl.envs.experts:scripted_expert",
            expert_options=("noise_std", "suboptimal", "miss_prob"),
            extra={"multipath_task": task},
        )
    from dmrl.envs.suites import suite_envs  # Meta-World and OGBench names; imports neither package

    for name, args in suite_envs().items():
        if name not in REGISTRY:
            register_env(name, **args)


_register_builtin()
