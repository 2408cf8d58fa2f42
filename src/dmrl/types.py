"""Shared data types and the shape vocabulary used at every boundary (see DESIGN.md).

Letters: B batch, To observation frames, Tp predicted actions, Ta executed actions, Da action dim,
T episode length (in this module; diffusion steps elsewhere), H/W image size, J joints, F force dims,
S privileged state dims.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

#: Every observation modality an environment may emit, in canonical order.
OBS_MODES: tuple[str, ...] = ("rgb", "depth", "joints", "force", "instruction", "state")
#: Modalities stored as per-step numeric arrays (``instruction`` is one string per episode).
ARRAY_MODES: tuple[str, ...] = ("rgb", "depth", "joints", "force", "state")

#: Route labels: index in a stored int8 column -> name. ``None`` (0) means neither side was taken.
ROUTES: tuple[str | None, ...] = (None, "left", "right")


def route_to_id(route: str | None) -> int:
    """Map a route name ("left", "right" or None) to its stored int8 code."""
    if route not in ROUTES:
        raise ValueError(f"route must be one of {ROUTES}, got {route!r}")
    return ROUTES.index(route)


def parse_obs_modes(modes: str | tuple[str, ...] | list[str]) -> tuple[str, ...]:
    """Normalise ``"rgb,depth"`` or a sequence to a tuple in canonical order; unknown names raise."""
    items = [m.strip() for m in modes.split(",")] if isinstance(modes, str) else [str(m) for m in modes]
    items = [m for m in items if m]
    unknown = [m for m in items if m not in OBS_MODES]
    if unknown or not items:
        raise ValueError(f"obs_modes: got {items!r}; allowed values are a non-empty subset of {', '.join(OBS_MODES)}")
    return tuple(m for m in OBS_MODES if m in items)


@dataclass(frozen=True)
class InfoField:
    """One task-specific value an episode reports (task metadata ``episode_info``, see envs/registry.py).

    Free text by default; with ``categories`` one of those values (None allowed), stored as an int8 code.
    """

    categories: tuple[str | None, ...] | None = None

    def check(self, name: str, value: Any) -> None:
        """One-line ValueError for a value this field cannot store."""
        if self.categories is not None and value not in self.categories:
            raise ValueError(f"Episode.task_info[{name!r}]: got {value!r}; allowed: {list(self.categories)}")
        if self.categories is None and not isinstance(value, str):
            raise ValueError(f"Episode.task_info[{name!r}]: got {value!r}; allowed a string")

    def to_json(self) -> dict[str, Any]:
        return {"categories": list(self.categories)} if self.categories is not None else {}

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> InfoField:
        cats = doc.get("categories")
        return cls(tuple(cats) if cats is not None else None)


@dataclass(init=False)
class Episode:
    """One recorded episode, as the collector hands it to the episode store.

    Shapes (T = number of actions taken):
      obs[k]      (T, ...) the observation *before* each action, one entry per array modality:
                  rgb uint8 (T,3,H,W) · depth float32 (T,1,H,W) metres · joints float32 (T,J)
                  · force float32 (T,F) · state float32 (T,S)
      final_obs[k] (...)   the observation after the last action (for bootstrapping truncated episodes)
      actions     float32 (T, Da) in [-1, 1]
      rewards     float32 (T,)
      terminals   bool (T,) or None: a per-step terminal for TD backups where the recording goes on past it
                  (OGBench single-task play data: the task holds before the action); None: only ``terminated``

    ``info`` holds numbers (e.g. collision, first_step of a recovery); ``task_info`` the task's own per-episode
    values that its metadata declares (MultiPath: route, target; another task: its own keys, or none).
    """

    obs: dict[str, np.ndarray]
    final_obs: dict[str, np.ndarray]
    actions: np.ndarray
    rewards: np.ndarray
    terminated: bool
    truncated: bool
    instruction: str
    success: bool
    seed: int
    info: dict[str, float]
    task_info: dict[str, Any]
    terminals: np.ndarray | None

    def __init__(
        self,
        obs: dict[str, np.ndarray],
        final_obs: dict[str, np.ndarray],
        actions: np.ndarray,
        rewards: np.ndarray,
        terminated: bool,
        truncated: bool,
        instruction: str,
        success: bool,
        seed: int,
        info: dict[str, float] | None = None,
        task_info: dict[str, Any] | None = None,
        terminals: np.ndarray | None = None,
        **legacy: Any,
    ) -> None:
        # route= / target= are MultiPath's task_info, accepted as keywords for code written before task_info.
        bad = sorted(set(legacy) - {"route", "target"})
        if bad:
            raise TypeError(f"Episode: unexpected keyword argument(s) {bad}")
        self.obs, self.final_obs, self.actions, self.rewards = obs, final_obs, actions, rewards
        self.terminated, self.truncated, self.instruction = terminated, truncated, instruction
        self.success, self.seed = success, seed
        self.info = {} if info is None else info
        self.task_info = {**legacy, **(task_info or {})}
        self.terminals = None if terminals is None else np.asarray(terminals)
        t = len(self.actions)
        if self.actions.ndim != 2 or t == 0:
            raise ValueError(f"Episode.actions must be (T, Da) with T >= 1, got shape {self.actions.shape}")
        if self.rewards.shape != (t,):
            raise ValueError(f"Episode.rewards must be ({t},), got {self.rewards.shape}")
        term = self.terminals
        if term is not None and (term.shape != (t,) or term.dtype != np.bool_):
            raise ValueError(f"Episode.terminals must be bool ({t},), got {term.dtype}{list(term.shape)}")
        for k, v in self.obs.items():
            if len(v) != t:
                raise ValueError(f"Episode.obs[{k!r}] has {len(v)} steps, actions have {t}")
        if "route" in self.task_info:
            route_to_id(self.task_info["route"])

    # MultiPath's task_info under its old attribute names (None where the task has no such value).
    @property
    def route(self) -> str | None:
        return self.task_info.get("route")

    @property
    def target(self) -> str | None:
        return self.task_info.get("target")

    @property
    def length(self) -> int:
        return len(self.actions)

    @property
    def episode_return(self) -> float:
        return float(self.rewards.sum())
