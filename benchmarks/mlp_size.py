"""Success against DDIM-10 latency for MLP denoisers of several sizes, at the comparison's full budget.

Run: ``python benchmarks/mlp_size.py --dataset outputs/compare_state/dataset.zarr [--sizes 256x2 384x3 512x4]``.
Writes benchmarks/results/mlp_size.json and .md. Each size trains with configs/compare_state.yaml's diffusion
settings and its best learning rate (4000 steps x 256), then runs 100 episodes on the evaluation seeds; the
chunk latency is predict_chunk at batch 1 on one thread, measured after training with nothing else running.
The issue's target is DDIM-10 <= 3 ms per chunk with the MLP denoiser: this table shows which sizes meet it and
what they give up.
"""

from __future__ import annotations

import concurrent.futures as cf
import multiprocessing as mp
import sys
from dataclasses import dataclass, field
from pathlib import Path

from _common import machine, parse_args, write_results
from ablation_denoiser import _chunk_ms, _run, _template
from dmrl.config_utils import load_yaml, merge

ROOT = Path(__file__).resolve().parents[1]


@dataclass
class Args:
    dataset: Path
    """the comparison's dataset (zarr store)"""
    config: Path = ROOT / "configs" / "compare_state.yaml"
    """preset whose diffusion settings every run uses"""
    sizes: list[str] = field(default_factory=lambda: ["256x2", "384x3", "512x4"])
    """HIDDENxBLOCKS"""
    episodes: int = 100
    """evaluation episodes per size"""
    out: Path = ROOT / "outputs" / "mlp_size"
    """run directories go here"""


def main() -> None:
    args = parse_args(Args, __doc__)
    preset = load_yaml(args.config)
    template, lr = _template(preset, args.dataset, args.out)
    runs = {}
    for size in args.sizes:
        hidden, blocks = (int(v) for v in size.split("x"))
        runs[size] = merge(
            template,
            {
                "out": args.out / size,
                "eval_episodes": args.episodes,
                "eval_envs": 1,
                "policy": {"denoiser": "mlp", "denoiser_kwargs": {"hidden_dim": hidden, "n_blocks": blocks}},
            },
        )
    with cf.ProcessPoolExecutor(2, mp_context=mp.get_context("spawn")) as pool:
        results = dict(zip(runs, pool.map(_run, runs.values()), strict=True))
    rows = []
    for size, res in results.items():
        ev = res["eval"]
        ms, params = _chunk_ms(runs[size].out)
        rows.append(
            {
                "mlp": size,
                "denoiser_params": params,
                "episodes": ev["episodes"],
                "success_rate": ev["success_rate"],
                "ci_low": ev["ci_low"],
                "ci_high": ev["ci_high"],
                "collision_rate": ev["collision_rate"],
                "route_left": ev["route_left"],
                "route_right": ev["route_right"],
                "chunk_latency_ms": ms,
                "meets_3ms": ms <= 3.0,
            }
        )
        print(rows[-1], flush=True)
    meta = {
        **machine(),
        "command": "python benchmarks/mlp_size.py " + " ".join(sys.argv[1:]),
        "lr": lr,
        "steps": template.steps,
        "batch_size": template.batch_size,
        "prediction_type": template.policy.prediction_type,
    }
    write_results("mlp_size", rows, meta, list(rows[0]))


if __name__ == "__main__":
    main()
