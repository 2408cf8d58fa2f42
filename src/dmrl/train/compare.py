"""``dmrl compare``: MLP (Gaussian), VAE and diffusion policies trained on one dataset with one encoder and one
budget, each with its best learning rate chosen on selection seeds, then evaluated on the same held-out seeds.

It tests the claim that on a task with several good routes a diffusion policy beats a Gaussian MLP and a
conditional VAE (MLP 52% / VAE 68% / diffusion 87% in the reference report, docs/results.md): the route split and
collision rate show *why* a policy fails, not only that it does.
"""

from __future__ import annotations

import concurrent.futures as cf
import dataclasses
import json
import logging
import multiprocessing as mp
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Generic, TypeVar

from dmrl.algos.bc import BCConfig
from dmrl.config_utils import merge, to_dict
from dmrl.data import EpisodeStore
from dmrl.envs import env_spec
from dmrl.paths import check_output_path
from dmrl.policies import ChunkConfig
from dmrl.policies.diffusion import DiffusionPolicyConfig
from dmrl.policies.gaussian import GaussianPolicyConfig
from dmrl.policies.vae import VAEPolicyConfig
from dmrl.train.config import OfflineConfig, TrainConfig
from dmrl.train.engine.core import EngineConfig

log = logging.getLogger(__name__)

POLICY_LABELS = {  # (table name, how the policy generates an action chunk)
    "gaussian": ("MLP (Gaussian)", "direct output (mean of a Gaussian)"),
    "vae": ("VAE (conditional, ACT-like)", "latent sampling z ~ N(0, I)"),
    "diffusion": ("Diffusion", "iterative denoising (DDIM)"),
}


C = TypeVar("C", bound=ChunkConfig)
T = TypeVar("T", bound="CompareTrainConfig")


@dataclass
class CompareTrainConfig(Generic[C]):
    """What every training run of the comparison shares; dataset, run directory, policy type and learning rate
    (swept by --lrs) are set per run."""

    steps: int = 3000
    """Optimizer steps of every run."""
    batch_size: int = 256
    """Samples per optimizer step."""
    seed: int = 0
    """Seed of initialisation, data order and sampling noise."""
    weight_decay: float = 1e-6
    """AdamW weight decay."""
    warmup_steps: int = 200
    """Linear learning-rate warm-up, then cosine decay to 0."""
    ema_decay: float = 0.995
    """Decay of the exported weights' moving average (warmed up)."""
    chunk: C = field(default_factory=ChunkConfig)  # type: ignore[assignment]
    """Horizons, observation keys and their encoder, the same for every policy."""
    diffusion: DiffusionPolicyConfig = field(default_factory=DiffusionPolicyConfig)
    gaussian: GaussianPolicyConfig = field(default_factory=GaussianPolicyConfig)
    vae: VAEPolicyConfig = field(default_factory=VAEPolicyConfig)
    source: OfflineConfig = field(default_factory=OfflineConfig)
    engine: EngineConfig = field(default_factory=EngineConfig)

    def run(self, dataset: Path, out: Path, policy: str, lr: float) -> TrainConfig:
        """The TrainConfig of one run: behaviour cloning of ``policy`` at learning rate ``lr``."""
        bc = BCConfig(lr=lr, weight_decay=self.weight_decay, warmup_steps=self.warmup_steps, ema_decay=self.ema_decay)
        return TrainConfig(
            dataset=dataset,
            out=out,
            steps=self.steps,
            batch_size=self.batch_size,
            seed=self.seed,
            overwrite=True,
            chunk=self.chunk,
            policy=getattr(self, policy),
            algo=bc,
            source=self.source,
            engine=self.engine,
        )


@dataclass
class CompareConfig(Generic[T]):
    """``dmrl compare``: the policy comparison on one dataset, same encoder, data and budget for every policy."""

    out: Path = Path("outputs/compare")
    """Directory for runs/, compare.json, compare.md, paths.png and the GIFs."""
    dataset: Path | None = None
    """Episode store; None collects ``episodes`` expert episodes into <out>/dataset.zarr first."""
    env: str = "dmrl/MultiPathGrasp-v0"
    episodes: int = 300
    """Expert episodes to collect when no --dataset is given."""
    policies: tuple[str, ...] = ("gaussian", "vae", "diffusion")
    lrs: tuple[float, ...] = (3e-4, 1e-3)
    """Learning-rate sweep, the same for every policy; the best on the selection seeds is kept."""
    select_episodes: int = 30
    """Episodes per sweep candidate on the selection seeds (never the evaluation seeds)."""
    select_seed: int = 200_000
    eval_episodes: int = 100
    eval_seed: int = 100_000
    eval_envs: int = 2
    eval_workers: bool = True
    """Step evaluation envs in worker processes (False: in this process)."""
    gifs: bool = True
    """Save a GIF of two evaluation rollouts per policy."""
    parallel: int = 2
    """Trainings run at once (each single-threaded)."""
    train: T = field(default_factory=CompareTrainConfig)  # type: ignore[assignment]
    """Settings of every training run."""
    overwrite: bool = True
    """Reuse --out (its runs are replaced)."""

    def __post_init__(self) -> None:
        if not self.policies or any(p not in POLICY_LABELS for p in self.policies):
            raise ValueError(f"--policies: got {self.policies}; allowed: {', '.join(POLICY_LABELS)}")
        if not self.lrs or any(lr <= 0 for lr in self.lrs):
            raise ValueError(f"--lrs: got {self.lrs}; need one or more positive learning rates")
        if self.eval_episodes < 1 or self.select_episodes < 0 or self.parallel < 1:
            raise ValueError("--eval-episodes >= 1, --select-episodes >= 0 and --parallel >= 1 are required")
        if self.episodes < 1 or self.eval_envs < 1 or self.select_seed < 0 or self.eval_seed < 0:
            raise ValueError(
                f"need --episodes >= 1, --eval-envs >= 1, --select-seed >= 0 and --eval-seed >= 0; got "
                f"{self.episodes}, {self.eval_envs}, {self.select_seed} and {self.eval_seed}"
            )
        env_spec(self.env)  # one-line error naming the registered envs


def _train_one(cfg: TrainConfig) -> dict[str, Any]:
    from dmrl.train.run import train

    return train(cfg, progress=False)


def _collect(cfg: CompareConfig, path: Path) -> None:
    """``cfg.episodes`` expert episodes (state only) into a new store at ``path``."""
    from dmrl.data.collect import CollectConfig, collect

    log.info("compare: collecting %d expert episodes into %s", cfg.episodes, path)
    collect(
        CollectConfig(out=path, env=cfg.env, episodes=cfg.episodes, obs_modes=("state",), overwrite=True),
        progress=False,
    )


def run_compare(cfg: CompareConfig) -> dict[str, Any]:
    from dmrl.policies.checkpoint import load_policy
    from dmrl.train.engine import configure_cpu_threads
    from dmrl.train.evaluate import evaluate, measure_latency, save_rollout_gif

    configure_cpu_threads(cfg.train.engine.cpu_threads)  # policy inference here runs next to env worker processes
    t_start = time.perf_counter()
    # Every input check before --out is created: the output path, the dataset, each run's settings.
    check_output_path(cfg.out)
    if cfg.dataset is not None:
        EpisodeStore.open(cfg.dataset).close()
    dataset = cfg.dataset if cfg.dataset is not None else cfg.out / "dataset.zarr"  # collected below if absent
    runs = {
        (policy, lr): cfg.train.run(dataset, cfg.out / "runs" / f"{policy}_lr{lr:g}", policy, lr)
        for policy in cfg.policies
        for lr in cfg.lrs
    }
    cfg.out.mkdir(parents=True, exist_ok=True)
    if cfg.dataset is None:
        _collect(cfg, dataset)
    log.info("compare: training %d runs (%d steps each, %d at a time)", len(runs), cfg.train.steps, cfg.parallel)
    if cfg.parallel == 1:
        summaries = {key: _train_one(run) for key, run in runs.items()}
    else:
        with cf.ProcessPoolExecutor(cfg.parallel, mp_context=mp.get_context("spawn")) as pool:
            futures = {key: pool.submit(_train_one, run) for key, run in runs.items()}
            summaries = {key: f.result() for key, f in futures.items()}
    env_id = summaries[next(iter(summaries))]["env_id"]
    select_seeds = list(range(cfg.select_seed, cfg.select_seed + cfg.select_episodes))
    eval_seeds = list(range(cfg.eval_seed, cfg.eval_seed + cfg.eval_episodes))
    rows, results, sweep = [], {}, []
    for policy in cfg.policies:
        best_key, best = None, (-1.0, 0.0)
        for lr in cfg.lrs:
            ckpt = runs[(policy, lr)].out / "checkpoint"
            pol, _ = load_policy(ckpt)
            sel = (
                evaluate(pol, env_id, select_seeds, n_envs=cfg.eval_envs, workers=cfg.eval_workers)
                if select_seeds
                else None
            )
            score = (sel.success_rate if sel else 0.0, -summaries[(policy, lr)].get("val_loss", 0.0))
            sweep.append(
                {
                    "policy": policy,
                    "lr": lr,
                    "val_loss": summaries[(policy, lr)].get("val_loss"),
                    "select_success": sel.success_rate if sel else None,
                }
            )
            if score > best:
                best_key, best = (policy, lr), score
        pol, _ = load_policy(runs[best_key].out / "checkpoint")
        res = evaluate(pol, env_id, eval_seeds, n_envs=cfg.eval_envs, workers=cfg.eval_workers)
        res.latency_ms, res.latency_p95_ms = measure_latency(pol, env_id)
        if cfg.gifs:
            save_rollout_gif(pol, env_id, cfg.out / f"rollouts_{policy}.gif", eval_seeds[:2])
        results[policy] = res
        label, generation = POLICY_LABELS[policy]
        rows.append(
            {
                "policy": policy,
                "label": label,
                "encoder": "state MLP (same for all)",
                "action_generation": generation,
                "lr": best_key[1],
                "train_seconds": summaries[best_key]["train_seconds"],
                **res.summary(),
            }
        )
        log.info(
            "compare: %s lr=%g success %.2f [%.2f, %.2f]",
            *(policy, best_key[1], res.success_rate, res.ci_low, res.ci_high),
        )
    _plot(results, env_id, cfg.out / "paths.png")
    report = {
        "env_id": env_id,
        "dataset": str(dataset),
        "eval_seeds": [eval_seeds[0], eval_seeds[-1]],
        "select_seeds": [select_seeds[0], select_seeds[-1]] if select_seeds else [],
        "train": to_dict(dataclasses.replace(cfg.train)),
        "sweep": sweep,
        "results": rows,
        "wall_seconds": time.perf_counter() - t_start,
    }
    (cfg.out / "compare.json").write_text(json.dumps(report, indent=2, default=str))
    (cfg.out / "compare.md").write_text(markdown_table(report))
    print(markdown_table(report))
    return report


def markdown_table(report: dict[str, Any]) -> str:
    lines = [
        f"Policy comparison on {report['env_id']}: {report['results'][0]['episodes']} evaluation episodes per policy "
        f"(seeds {report['eval_seeds'][0]}..{report['eval_seeds'][1]}), success with 95% Wilson interval.",
        "",
        "| policy | encoder | action generation | success [95% CI] | route L / R / none | collisions | "
        "jerk (mean sq.) | max Δa | latency ms (median / p95) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in report["results"]:
        lines.append(
            f"| {r['label']} | {r['encoder']} | {r['action_generation']} | {r['success_rate']:.0%} "
            f"[{r['ci_low']:.0%}, {r['ci_high']:.0%}] | {r['route_left']:.0%} / {r['route_right']:.0%} / "
            f"{r['route_none']:.0%} | {r['collision_rate']:.0%} | {r['jerk']:.4f} | {r['max_action_change']:.2f} | "
            f"{r['latency_ms']:.2f} / {r['latency_p95_ms']:.2f} |"
        )
    lines += [
        "",
        f"Wall time {report['wall_seconds'] / 60:.1f} min; learning rate chosen per policy on selection "
        "seeds from the sweep below.",
        "",
        "| policy | lr | val loss | selection success |",
        "|---|---|---|---|",
    ]
    for s in report["sweep"]:
        sel = "–" if s["select_success"] is None else f"{s['select_success']:.0%}"
        val = "–" if s["val_loss"] is None else f"{s['val_loss']:.4f}"
        lines.append(f"| {s['policy']} | {s['lr']:g} | {val} | {sel} |")
    return "\n".join(lines) + "\n"


def _plot(results: dict, env_id: str, path: Path) -> None:
    import matplotlib.pyplot as plt

    from dmrl.envs.plotting import plot_paths

    task = "grasp" if "Grasp" in env_id else "reach"
    fig, axes = plt.subplots(1, len(results), figsize=(4.2 * len(results), 5))
    for ax, (policy, res) in zip(list(getattr(axes, "flat", [axes])), results.items(), strict=True):
        plot_paths(
            ax,
            [r.tip_path for r in res.records],
            [r.route for r in res.records],
            task,
            title=f"{POLICY_LABELS[policy][0]}: {res.success_rate:.0%} success",
        )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


@dataclass
class DemoConfig:
    """``dmrl demo`` (make demo): scene pictures, then the quick policy comparison on MultiPathGrasp (state)."""

    out: Path = Path("outputs/demo")
    """Directory for scene.png and the comparison (compare.md, paths.png, GIFs, runs/)."""
    quick: bool = True
    """The quick preset (QUICK below, about 15 minutes on 2 CPU cores); --no-quick uses CompareConfig's defaults."""


#: The embedded default of ``dmrl demo`` (configs/compare_quick.yaml holds the same values for `dmrl compare`):
#: one learning rate per policy (the best of the full sweep in configs/compare_state.yaml), 3000 steps.
QUICK: dict[str, Any] = {
    "episodes": 300,
    "lrs": [1e-3],
    "select_episodes": 0,
    "eval_episodes": 100,
    "eval_envs": 2,
    "parallel": 2,
    "train": {
        "steps": 3000,
        "batch_size": 256,
        "diffusion": {
            "prediction_type": "sample",  # chosen on selection seeds: see configs/compare_state.yaml
            "denoiser": "mlp",
            "num_inference_steps": 10,
            "denoiser_kwargs": {"hidden_dim": 512, "n_blocks": 4},
        },
    },
}


def run_demo(cfg: DemoConfig) -> None:
    from dmrl.envs.plotting import save_scene_figure

    check_output_path(cfg.out)  # before the scene is rendered
    save_scene_figure(_scene_frames(), cfg.out / "scene.png")
    log.info("scene: %s", cfg.out / "scene.png")
    compare_cfg = merge(CompareConfig(), QUICK) if cfg.quick else CompareConfig()
    run_compare(dataclasses.replace(compare_cfg, out=cfg.out))


def _scene_frames() -> dict:
    import numpy as np

    from dmrl.envs import make_env

    frames = {}
    for env_id, task in (("dmrl/MultiPathGrasp-v0", "grasp"), ("dmrl/MultiPathReach-v0", "reach")):
        env = make_env(env_id, obs_modes=("rgb", "depth"), image_size=128, cameras=("front", "top"))
        obs, _ = env.reset(seed=0)
        frames[f"{task}: front rgb"] = np.moveaxis(obs["rgb"][:3], 0, -1)
        frames[f"{task}: top rgb"] = np.moveaxis(obs["rgb"][3:], 0, -1)
        depth = obs["depth"][0]
        frames[f"{task}: front depth (m)"] = (
            np.stack([1 - (depth - depth.min()) / np.ptp(depth)] * 3, -1) * 255
        ).astype(np.uint8)
        env.close()
    return frames
