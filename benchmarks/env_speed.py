"""Environment speed: state-only steps/s, RGB-D ms/frame at 64 and 128, expert episodes per minute.

Run: ``python benchmarks/env_speed.py`` (or ``make bench``). Targets on 2 CPU cores: state-only >= 2000
steps/s; RGB-D 64x64 <= 3 ms/frame; 100 Grasp episodes with RGB-D collected in <= 5 minutes.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from _common import machine, parse_args, write_results
from dmrl.data.collect import CollectConfig, collect, record_episode
from dmrl.envs import make_env
from dmrl.envs.experts import ScriptedExpert

GRASP = "dmrl/MultiPathGrasp-v0"


def state_steps_per_second(n: int) -> float:
    """Random actions, resets included; one process."""
    env = make_env(GRASP, obs_modes=("state",))
    rng = np.random.default_rng(0)
    actions = rng.uniform(-1, 1, (n, 6)).astype(np.float32)
    env.reset(seed=0)
    t = time.perf_counter()
    for i in range(n):
        *_, term, trunc, _ = env.step(actions[i])
        if term or trunc:
            env.reset()
    return n / (time.perf_counter() - t)


def rgbd_ms_per_frame(size: int, n: int) -> float:
    env = make_env(GRASP, obs_modes=("rgb", "depth"), image_size=size)
    env.reset(seed=0)
    t = time.perf_counter()
    for _ in range(n):
        env._get_obs()  # render only: the cost a step adds for RGB-D
    return (time.perf_counter() - t) / n * 1e3


def expert_episodes_per_minute(obs_modes: tuple[str, ...], n: int) -> tuple[float, float]:
    env = make_env(GRASP, obs_modes=obs_modes)
    expert = ScriptedExpert(env)
    t = time.perf_counter()
    eps = [record_episode(env, expert, seed) for seed in range(n)]
    dt = time.perf_counter() - t
    return n / dt * 60, float(np.mean([e.success for e in eps]))


def collect_wall_seconds(episodes: int, workers: int) -> tuple[float, float]:
    tmp = Path(tempfile.mkdtemp())
    try:
        cfg = CollectConfig(
            out=tmp / "rgbd.zarr",
            env=GRASP,
            episodes=episodes,
            workers=workers,
            obs_modes=("rgb", "depth", "joints", "force", "instruction", "state"),
        )
        t = time.perf_counter()
        store = collect(cfg, progress=False)
        return time.perf_counter() - t, store.summary()["success_rate"]
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


@dataclass
class Args:
    quick: bool = False
    """fewer repetitions (smoke run)"""


def main() -> None:
    args = parse_args(Args, __doc__)
    k = 10 if args.quick else 1
    rows = []
    rows.append(
        {
            "measure": "state-only env steps/s (1 process)",
            "value": state_steps_per_second(20000 // k),
            "target": ">= 2000",
        }
    )
    for size in (64, 128):
        rows.append(
            {
                "measure": f"RGB-D render ms/frame {size}x{size}",
                "value": rgbd_ms_per_frame(size, 1000 // k),
                "target": "<= 3" if size == 64 else "",
            }
        )
    for label, modes in (("state", ("state",)), ("rgb+depth+all", ("rgb", "depth", "joints", "force", "state"))):
        epm, sr = expert_episodes_per_minute(modes, 100 // k)
        rows.append(
            {
                "measure": f"expert Grasp episodes/min, {label} (1 process)",
                "value": epm,
                "target": "",
                "expert_success": sr,
            }
        )
    n_eps = 100 // k
    wall, sr = collect_wall_seconds(n_eps, workers=2)
    rows.append(
        {
            "measure": f"dmrl collect {n_eps} Grasp episodes, RGB-D + all modes, 2 workers: seconds",
            "value": wall,
            "target": "<= 300" if n_eps == 100 else "",
            "expert_success": sr,
        }
    )
    meta = {
        **machine(),
        "command": "python benchmarks/env_speed.py" + (" --quick" if args.quick else ""),
        "settings": "Grasp, 3 cups, 1 camera, shadows off, 10 Hz control (10 x 10 ms physics steps)",
    }
    write_results(
        "env_speed" if not args.quick else "env_speed_quick",
        rows,
        meta,
        ["measure", "value", "target", "expert_success"],
    )


if __name__ == "__main__":
    main()
