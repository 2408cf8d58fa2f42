"""Denoiser ablation: MLP vs FiLM U-Net vs transformer inside the same diffusion policy, at one equal budget.

Run: ``python benchmarks/ablation_denoiser.py --dataset outputs/compare_state/dataset.zarr [--steps N]``.
Writes benchmarks/results/ablation_denoiser.json and .md. Every run uses the diffusion settings of
configs/compare_state.yaml (prediction type, DDIM-10, lr) except the denoiser; the budget is given in optimizer
steps x batch, the same for all three, and smaller than the comparison's by default because the U-Net trains
~20x slower per sample on these CPUs. Success is on the evaluation seeds (100000..); nothing here was used to
choose the comparison's settings. Two runs train at a time, each on one thread.
"""

from __future__ import annotations

import concurrent.futures as cf
import multiprocessing as mp
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from _common import machine, parse_args, write_results
from dmrl.algos.bc import BCConfig
from dmrl.config_utils import from_dict, load_yaml, merge
from dmrl.train.compare import CompareTrainConfig
from dmrl.train.config import TrainConfig

ROOT = Path(__file__).resolve().parents[1]
DENOISERS = {
    "mlp": {"hidden_dim": 512, "n_blocks": 4},
    "unet": {"down_dims": [64, 128, 256]},
    "transformer": {"d_model": 128, "n_layers": 4, "n_heads": 4},
}


def _run(cfg: TrainConfig) -> dict:
    from dmrl.train.run import train

    return train(cfg, progress=False)


def _template(preset: dict, dataset: Path, out: Path) -> tuple[TrainConfig, float]:
    """(TrainConfig, lr): the comparison preset's shared training settings (its ``train`` block) as one BC run of its
    diffusion policy at the last of its ``lrs``; steps, when the block gives none, TrainConfig's default."""
    lr = float(preset.get("lrs", [BCConfig().lr])[-1])
    train = from_dict(CompareTrainConfig, {"steps": TrainConfig().steps, **preset.get("train", {})})
    return train.run(dataset, out, "diffusion", lr), lr


def _chunk_ms(run_dir: Path) -> tuple[float, int]:
    from dmrl.policies.checkpoint import load_policy

    torch.set_num_threads(1)
    policy, _ = load_policy(run_dir / "checkpoint")
    obs = {"state": torch.zeros(1, policy.chunk.n_obs_steps, policy.obs_dims["state"])}
    times = []
    for i in range(40):
        t = time.perf_counter()
        policy.predict_chunk(obs)
        if i >= 10:
            times.append(1e3 * (time.perf_counter() - t))
    return float(np.median(times)), sum(p.numel() for p in policy.denoiser.parameters())


@dataclass
class Args:
    dataset: Path
    """the comparison's dataset (zarr store)"""
    config: Path = ROOT / "configs" / "compare_state.yaml"
    """preset whose diffusion settings every run uses"""
    denoisers: list[str] = field(default_factory=lambda: list(DENOISERS))
    """denoisers to train (mlp, unet, transformer)"""
    steps: int = 1500
    """optimizer steps of each run"""
    batch_size: int = 128
    """batch size of each run"""
    episodes: int = 100
    """evaluation episodes per run"""
    out: Path = ROOT / "outputs" / "ablation_denoiser"
    """run directories go here"""


def main() -> None:
    args = parse_args(Args, __doc__)
    preset = load_yaml(args.config)
    template, lr = _template(preset, args.dataset, args.out)
    runs = {
        name: merge(
            template,
            {
                "out": args.out / name,
                "steps": args.steps,
                "batch_size": args.batch_size,
                "eval_episodes": args.episodes,
                "eval_envs": 1,
                "policy": {"denoiser": name, "denoiser_kwargs": DENOISERS[name]},
            },
        )
        for name in args.denoisers
    }
    with cf.ProcessPoolExecutor(2, mp_context=mp.get_context("spawn")) as pool:
        results = dict(zip(runs, pool.map(_run, runs.values()), strict=True))
    rows = []
    for name, res in results.items():
        ev = res["eval"]
        ms, params = _chunk_ms(runs[name].out)
        rows.append(
            {
                "denoiser": name,
                "params": params,
                "episodes": ev["episodes"],
                "success_rate": ev["success_rate"],
                "ci_low": ev["ci_low"],
                "ci_high": ev["ci_high"],
                "route_left": ev["route_left"],
                "route_right": ev["route_right"],
                "collision_rate": ev["collision_rate"],
                "train_samples_per_s": res["samples_per_s"],
                "train_minutes": res["train_seconds"] / 60,
                "chunk_latency_ms": ms,
            }
        )
        print(rows[-1], flush=True)
    meta = {
        **machine(),
        "command": "python benchmarks/ablation_denoiser.py " + " ".join(sys.argv[1:]),
        "lr": lr,
        "steps": args.steps,
        "batch_size": args.batch_size,
        "prediction_type": template.policy.prediction_type,
        "note": "two trainings at a time on 2 cores, one thread each; latency at batch 1, one thread, DDIM-10",
    }
    write_results("ablation_denoiser", rows, meta, list(rows[0]))


if __name__ == "__main__":
    main()
