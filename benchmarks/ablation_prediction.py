"""Prediction-type ablation: epsilon vs sample (x0) vs v vs hybrid, several training seeds each (mean ± std).

Run: ``python benchmarks/ablation_prediction.py --dataset outputs/compare_state/dataset.zarr [--seeds 0 1 2]``.
Writes benchmarks/results/ablation_prediction.json and .md. Every run uses the diffusion settings of
configs/compare_state.yaml; only the prediction type and the seed change. Two runs train at a time.
"""

from __future__ import annotations

import concurrent.futures as cf
import multiprocessing as mp
import sys
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from _common import machine, parse_args, write_results
from ablation_denoiser import _template
from dmrl.config_utils import load_yaml, merge
from dmrl.train.config import TrainConfig

ROOT = Path(__file__).resolve().parents[1]


def _run(cfg: TrainConfig) -> dict:
    from dmrl.train.run import train

    return train(cfg, progress=False)


@dataclass
class Args:
    dataset: Path
    """the comparison's dataset (zarr store)"""
    config: Path = ROOT / "configs" / "compare_state.yaml"
    """preset whose diffusion settings every run uses"""
    types: list[str] = field(default_factory=lambda: ["epsilon", "sample", "v", "hybrid"])
    """prediction types to train"""
    seeds: list[int] = field(default_factory=lambda: [0, 1, 2])
    """training seeds per prediction type"""
    episodes: int = 100
    """evaluation episodes per run"""
    steps: int | None = None
    """override the preset's training steps"""
    out: Path = ROOT / "outputs" / "ablation_prediction"
    """run directories go here"""


def main() -> None:
    args = parse_args(Args, __doc__)
    template, lr = _template(load_yaml(args.config), args.dataset, args.out)
    if args.steps is not None:
        template = merge(template, {"steps": args.steps})
    runs = {
        (t, s): merge(
            template,
            {
                "out": args.out / f"{t}_seed{s}",
                "seed": s,
                "eval_episodes": args.episodes,
                "eval_envs": 1,
                "policy": {"prediction_type": t},
            },
        )
        for t in args.types
        for s in args.seeds
    }
    with cf.ProcessPoolExecutor(2, mp_context=mp.get_context("spawn")) as pool:
        results = dict(zip(runs, pool.map(_run, runs.values()), strict=True))
    rows = []
    for t in args.types:
        sr = [results[(t, s)]["eval"]["success_rate"] for s in args.seeds]
        rows.append(
            {
                "prediction_type": t,
                "seeds": len(sr),
                "episodes_per_seed": args.episodes,
                "success_mean": float(np.mean(sr)),
                "success_std": float(np.std(sr)),
                "per_seed": ", ".join(f"{x:.2f}" for x in sr),
                "val_loss_mean": float(np.mean([results[(t, s)]["val_loss"] for s in args.seeds])),
            }
        )
        print(rows[-1], flush=True)
    meta = {
        **machine(),
        "command": "python benchmarks/ablation_prediction.py " + " ".join(sys.argv[1:]),
        "lr": lr,
        "steps": template.steps,
    }
    write_results("ablation_prediction", rows, meta, list(rows[0]))


if __name__ == "__main__":
    main()
