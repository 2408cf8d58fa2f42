"""Shared pieces of the RL benchmarks (rl_offline.py, rl_truncation.py, ...): the `mixed` offline dataset, one
training run in a spawned worker, and result rows with success, Wilson interval and episode count.

The `mixed` dataset (expert + suboptimal + failures) is what offline RL is for: behaviour cloning imitates the
failures along with the successes, a critic trained on the rewards can tell them apart.
"""

from __future__ import annotations

import concurrent.futures as cf
import json
import multiprocessing as mp
from pathlib import Path

from dmrl.config_utils import load_yaml, merge
from dmrl.train.config import TrainConfig

ROOT = Path(__file__).resolve().parents[1]

#: The reward the RL benchmarks collect with: the env's default (potential-based shaping, docs/tasks.md). Results
#: made before the reward fix of issue 27 used "shaped_v1"; pass --reward shaped_v1 to reproduce them.
REWARD = "shaped"
#: The reward before that fix: the runs and stores made with it (mixed.zarr, weak.zarr) keep their old names.
REWARD_V1 = "shaped_v1"

# (name, episodes, first seed, noise_std, suboptimal): the three parts of `mixed`; seeds never overlap the
# evaluation seeds (100000..) or the selection seeds (200000..).
MIXED_PARTS = (
    ("expert", 60, 0, 0.0, False),
    ("suboptimal", 120, 10_000, 0.0, True),
    ("failures", 120, 20_000, 1.0, True),  # suboptimal plan under heavy action noise: almost never succeeds
)


def mixed_path(reward: str) -> Path:
    """Where the RL benchmarks keep `mixed` collected with ``reward`` (one store per reward)."""
    return ROOT / "outputs" / "rl" / ("mixed.zarr" if reward == REWARD_V1 else f"mixed_{reward}.zarr")


def make_mixed(path: Path, workers: int = 2, reward: str = REWARD) -> Path:
    """Collect the `mixed` state dataset at ``path`` with ``reward`` unless a complete one is there; -> path."""
    from dmrl.data import EpisodeStore
    from dmrl.data.collect import CollectConfig, collect
    from dmrl.train.offline import env_kwargs_from_store

    want = sum(p[1] for p in MIXED_PARTS)
    if path.exists():
        store = EpisodeStore.open(path)
        has = env_kwargs_from_store(store).get("reward")  # what training reads the store's reward as
        if store.n_episodes == want and has == reward:
            return path
        raise ValueError(
            f"{path}: holds {store.n_episodes} episodes with reward {has!r}, not the {want} of `mixed` with reward "
            f"{reward!r}; delete it and rerun"
        )
    for i, (name, n, seed, noise, subopt) in enumerate(MIXED_PARTS):
        cfg = CollectConfig(
            out=path,
            episodes=n,
            seed=seed,
            obs_modes=("state",),
            noise_std=noise,
            suboptimal=subopt,
            workers=workers,
            append=i > 0,
            reward=reward,
        )
        s = collect(cfg, progress=False).summary()
        print(f"mixed/{name}: {n} episodes, success {s['success_rate']:.2f} (store total)", flush=True)
    return path


def template(config: Path, **overrides) -> TrainConfig:
    """The preset (a plain `dmrl train --config` file) with ``overrides`` merged (nested dicts key by key)."""
    return merge(merge(TrainConfig(), load_yaml(config)), overrides)


def train_one(cfg: TrainConfig) -> dict:
    """One offline run (bc or an offline-RL algorithm) -> its summary (with "eval" when eval_episodes > 0)."""
    from dmrl.train.run import train

    return train(cfg, progress=False)


def finished(cfg: TrainConfig, need_eval: bool = True) -> dict | None:
    """The summary of a finished run at cfg.out trained with exactly these settings (an evaluation included unless
    ``need_eval`` is False: online runs are evaluated apart), else None: benchmarks sharing a run (rl_truncation's
    k = S is rl_offline's diffusion-ql; rl_per's and rl_finetune's bc_rl) train it once."""
    from dmrl.config_utils import to_dict
    from dmrl.train.config import flat
    from dmrl.train.run import saved_settings

    summary, saved = cfg.out / "summary.json", cfg.out / "config.json"
    if not (summary.is_file() and saved.is_file()):
        return None
    now = json.loads(json.dumps(to_dict(cfg), default=str))
    a, b = saved_settings(saved), flat(now)
    for settings in (a, b):  # --overwrite and --out say how and where a run was started, not what it trained
        settings.pop("overwrite", None)
        settings.pop("out", None)
        if settings.get("dataset"):  # one store however its path was spelled (relative to the working directory)
            settings["dataset"] = str(Path(settings["dataset"]).resolve())
    out = json.loads(summary.read_text())
    return out if a == b and ("eval" in out or not need_eval) else None


def run_all(runs: dict, parallel: int) -> dict:
    """{key: TrainConfig} -> {key: summary}, ``parallel`` spawned runs at a time (1 thread each); runs already
    finished with the same settings are read back instead of trained again."""
    done = {k: s for k, c in runs.items() if (s := finished(c)) is not None}
    todo = {k: c for k, c in runs.items() if k not in done}
    if done:
        print(f"reusing {len(done)} finished runs: {', '.join(str(c.out) for k, c in runs.items() if k in done)}")
    if parallel == 1 or len(todo) <= 1:
        return {**done, **{k: train_one(c) for k, c in todo.items()}}
    with cf.ProcessPoolExecutor(parallel, mp_context=mp.get_context("spawn")) as pool:
        return {**done, **dict(zip(todo, pool.map(train_one, todo.values()), strict=True))}


def eval_row(summary: dict) -> dict:
    """The evaluation fields every RL result row carries."""
    ev = summary["eval"]
    return {
        "success_rate": ev["success_rate"],
        "ci_low": ev["ci_low"],
        "ci_high": ev["ci_high"],
        "episodes": ev["episodes"],
        "route_left": ev["route_left"],
        "route_right": ev["route_right"],
        "collision_rate": ev["collision_rate"],
    }


def read_curve(run: Path) -> list[tuple[int, float]]:
    """(update, success) learning-curve points of an offline run trained with curve_every (its metrics.jsonl)."""
    lines = (run / "metrics.jsonl").read_text().splitlines()
    recs = [json.loads(x) for x in lines if "curve_success" in x]
    return [(r["step"], r["curve_success"]) for r in recs]


def plot_curves(curves: dict[str, list[list]], path: Path, title: str) -> None:
    """{label: one [(update, success), ...] per seed} -> a PNG: each seed a thin line, their mean a thick one."""
    import matplotlib
    import numpy as np

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.5))
    for i, (label, seeds) in enumerate(curves.items()):
        color = f"C{i}"
        for pts in seeds:
            ax.plot([p[0] for p in pts], [p[1] for p in pts], color=color, alpha=0.3, lw=0.8)
        common = sorted(set.intersection(*[{p[0] for p in pts} for pts in seeds]))  # steps every seed has
        if common:
            ys = [[dict(pts)[x] for x in common] for pts in seeds]
            ax.plot(common, np.mean(ys, 0), color=color, lw=2, label=label)
    ax.set_xlabel("updates")
    ax.set_ylabel("success (curve evaluations)")
    ax.set_ylim(-0.02, 1.02)
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    print(f"wrote {path}")


def load_run(run: Path):
    """(algo with the run's newest state, its TrainConfig, its store) for a finished run directory of an algorithm
    with a critic (diffusion-ql, qc, idql: best-of-N acting; fql: its student; dsrl: its noise actor; dppo: its
    chain of means); the exported checkpoint holds the actor alone."""
    from dmrl.config_utils import from_dict
    from dmrl.data import EpisodeStore
    from dmrl.train.engine import Engine, EngineConfig, load_latest_state
    from dmrl.train.run import build_algo

    cfg_file = run / "config.json"
    if not cfg_file.is_file():
        raise FileNotFoundError(f"--runs {run}: no config.json (pass a dmrl train run directory)")
    cfg = from_dict(TrainConfig, {**json.loads(cfg_file.read_text()), "init": None})  # weights come from state/
    if cfg.algo_type not in ("diffusion-ql", "qc", "idql", "fql", "dsrl", "dppo"):
        raise ValueError(
            f"--runs {run}: algo {cfg.algo_type!r} has no critic (diffusion-ql, qc, idql, fql, dsrl, dppo do)"
        )
    store = EpisodeStore.open(cfg.dataset)
    engine = Engine(EngineConfig(device="cpu", precision="fp32"), cfg.seed)
    algo = build_algo(cfg, store, engine)
    state = load_latest_state(run, engine.dist, cfg.seed)
    if state is None:
        raise FileNotFoundError(f"--runs {run}: no training state under {run / 'state'} (did the run finish?)")
    algo.load_state_dict(state.tensors["algo"])
    return algo.eval(), cfg, store
