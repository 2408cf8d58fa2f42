"""Online Diffusion-QL throughput with 1 vs 2 collector processes on this machine: env steps/s collected and
updates/s trained, measured over the training phase (after the replay holds learning_starts transitions).

Run: ``python benchmarks/rl_throughput.py [--collectors 1 2] [--updates 300]`` with nothing else running.
Writes benchmarks/results/rl_throughput.json and .md. Actor and critic settings: configs/rl_offline.yaml (the
`mixed` dataset only shapes the actor and its normaliser; online training never reads its transitions).
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from _common import machine, parse_args, write_results
from _rl import REWARD_V1, ROOT, make_mixed, mixed_path, template


def rates(metrics: Path) -> dict:
    """Updates/s and env steps/s between the first and last logged update (the trainer's waiting excluded).

    Each record carries step, env_steps and updates_per_s = step / elapsed, so elapsed = step / updates_per_s."""
    recs = [r for r in map(json.loads, metrics.read_text().splitlines()) if "updates_per_s" in r]
    a, b = recs[0], recs[-1]
    ta, tb = a["step"] / a["updates_per_s"], b["step"] / b["updates_per_s"]
    return {
        "updates_per_s": (b["step"] - a["step"]) / (tb - ta),
        "env_steps_per_s": (b["env_steps"] - a["env_steps"]) / (tb - ta),
        "env_steps_per_s_before_training": a["env_steps"] / ta,
        "window_s": tb - ta,
    }


@dataclass
class Args:
    config: Path = ROOT / "configs" / "rl_offline.yaml"
    """actor and critic preset"""
    dataset: Path = mixed_path(REWARD_V1)  # its published numbers predate the reward fix (issue 27)
    """the mixed dataset (shapes the actor and its normaliser; made when missing)"""
    collectors: list[int] = field(default_factory=lambda: [1, 2])
    """collector process counts to measure"""
    updates: int = 300
    """updates per run"""
    algo: Literal["diffusion-ql", "td3-bc"] = "diffusion-ql"
    """algorithm"""
    out: Path = ROOT / "outputs" / "rl_throughput"
    """run directories go here"""


def main() -> None:
    args = parse_args(Args, __doc__)
    from dmrl.train.run import train

    make_mixed(args.dataset, reward=REWARD_V1)
    rows = []
    for n in args.collectors:
        cfg = template(
            args.config,
            dataset=args.dataset,
            out=args.out / f"{args.algo}_c{n}",
            algo=args.algo,
            policy="diffusion" if args.algo == "diffusion-ql" else "gaussian",
            overwrite=True,
            steps=args.updates,
            eval_episodes=0,
            source={"type": "online", "n_collectors": n, "learning_starts": 1000},
        )
        t0 = time.perf_counter()
        train(cfg)
        rows.append(
            {
                "algo": args.algo,
                "collectors": n,
                **rates(cfg.out / "metrics.jsonl"),
                "wall_s": time.perf_counter() - t0,
            }
        )
        print(rows[-1], flush=True)
    meta = {
        **machine(),
        "command": "python benchmarks/rl_throughput.py " + " ".join(sys.argv[1:]),
        "config": str(args.config.relative_to(ROOT)),
        "batch_size": cfg.batch_size,
        "envs_per_collector": cfg.source.envs_per_collector,
        "publish_every": cfg.source.publish_every,
        "note": "trainer and collectors share the same 2 cores; each process runs torch with 1 thread",
    }
    write_results("rl_throughput", rows, meta, list(rows[0]))


if __name__ == "__main__":
    main()
