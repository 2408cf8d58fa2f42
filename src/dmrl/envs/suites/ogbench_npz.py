"""OGBench's dataset files (``<dataset>.npz``) as dmrl episodes, with the single-task rewards relabelled.

The layout ``generate_manipspace.py`` writes: flat per-step arrays over all trajectories, ``observations`` (N, S),
``actions`` (N, Da), ``terminals`` (N,) 1 at each trajectory's last row, ``qpos`` / ``qvel`` (N, ·) the simulator
state of each row's observation and, for scene, ``button_states`` (N, 2). A trajectory of L rows holds L-1
transitions: its last row is the observation after the last action, its action was never executed into the file
(OGBench's ``load_dataset`` drops it the same way). Rewards are OGBench's single-task relabelling of each row's
state (``successes - n``, :meth:`OGBenchEnv.task_successes`), and so are the per-step terminals: ``Episode.terminals``
is 1 - OGBench's ``masks`` (the task holds at the row). The file's own ``terminals`` only end trajectories; they are
episode boundaries here, never TD terminals.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np

from dmrl.envs.suites.ogbench import PROPRIO_DIM, OGBenchEnv
from dmrl.types import Episode

REQUIRED = ("observations", "actions", "terminals", "qpos")


def load_npz(path: str | Path, env: str, task: int, obs_modes: tuple[str, ...] = ("state",)) -> Iterator[Episode]:
    """Yield one :class:`Episode` per trajectory of an OGBench ``.npz`` (see the module docstring).

    ``env`` / ``task``: the single-task env whose rewards and terminals are relabelled (e.g. "cube-single", 2).
    Episodes are ``truncated`` (play data never terminates), ``success`` if the task held at any row, seed =
    trajectory index; write them to a store made with ``terminals=True``.
    """
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"ogbench npz: {path} does not exist; generate one (docs/suites.md) or give its path")
    with np.load(path) as f:
        missing = [k for k in REQUIRED if k not in f]
        if missing:
            raise ValueError(f"ogbench npz {path}: missing {missing}; OGBench's layout has {', '.join(REQUIRED)}")
        data = {k: f[k] for k in f.files}
    bad = [m for m in obs_modes if m not in ("joints", "state")]
    if bad:
        raise ValueError(f"obs_modes: an OGBench npz holds joints and state; got {bad}")
    n = len(data["observations"])
    ends = np.flatnonzero(data["terminals"]) + 1
    if n == 0 or len(ends) == 0 or ends[-1] != n:
        raise ValueError(f"ogbench npz {path}: terminals must mark the last row of every trajectory (rows {n})")
    judge = OGBenchEnv(env, task)
    buttons = data.get("button_states")
    try:
        ok = np.stack(
            [judge.task_successes(data["qpos"][i], None if buttons is None else buttons[i]) for i in range(n)]
        )
    finally:
        judge.close()
    rewards = (ok.sum(-1) - ok.shape[-1]).astype(np.float32)
    held = ok.all(-1)  # (N,) relabel_dataset's masks == 0
    start = 0
    for i, end in enumerate(ends):
        if end - start < 2:
            raise ValueError(f"ogbench npz {path}: trajectory {i} has {end - start} row(s); at least 2 needed")
        obs = data["observations"][start:end].astype(np.float32)
        views = {"joints": obs[:, :PROPRIO_DIM], "state": obs}
        yield Episode(
            obs={k: views[k][:-1] for k in obs_modes},
            final_obs={k: views[k][-1] for k in obs_modes},
            actions=data["actions"][start : end - 1].astype(np.float32),
            rewards=rewards[start : end - 1],
            terminated=False,
            truncated=True,
            instruction="",
            success=bool(held[start : end - 1].any()),
            seed=i,
            terminals=held[start : end - 1].copy(),
        )
        start = end
