"""Online Diffusion-QL throughput with 1 vs 2 collectors on this machine, as processes (--source.backend process) and
as Ray actors (ray): env steps/s collected and updates/s trained, measured over the training phase (after the replay
holds learning_starts transitions). Ray rows add the learner's cost of taking the actors' batches in (ray.wait, get,
replay add): per batch (one episode) and as a share of the training time; the process backend's collectors write the
shared ring themselves.

Run: ``python benchmarks/rl_throughput.py [--collectors 1 2] [--backends process ray] [--updates 300]`` with nothing
else running.
Writes benchmarks/results/rl_throughput.json and .md. Actor and critic settings: configs/rl_offline.yaml (the
`mixed` dataset only shapes the actor and its normaliser; online training never reads its transitions).
"""

from __future__ import annotations

import json
import os
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
    """collector counts to measure"""
    backends: list[Literal["process", "ray"]] = field(default_factory=lambda: ["process", "ray"])
    """where collectors run (ray: a local Ray started by the run)"""
    updates: int = 300
    """updates per run"""
    algo: Literal["diffusion-ql", "td3-bc"] = "diffusion-ql"
    """algorithm"""
    out: Path = ROOT / "outputs" / "rl_throughput"
    """run directories go here"""
    name: str = "rl_throughput"
    """results file name (benchmarks/results/<name>.json and .md)"""


def main() -> None:
    args = parse_args(Args, __doc__)
    from dmrl.train.run import train

    make_mixed(args.dataset, reward=REWARD_V1)
    rows = []
    for backend, n in [(b, n) for b in args.backends for n in args.collectors]:
        cfg = template(
            args.config,
            dataset=args.dataset,
            out=args.out / f"{args.algo}_{backend}_c{n}",
            algo=args.algo,
            policy="diffusion" if args.algo == "diffusion-ql" else "gaussian",
            overwrite=True,
            steps=args.updates,
            eval_episodes=0,
            source={"type": "online", "n_collectors": n, "learning_starts": 1000, "backend": backend},
        )
        seen: dict = {}
        t0 = time.perf_counter()
        summary = train(cfg, hook=lambda info, seen=seen: seen.update(collectors=info["collectors"]))
        row = {"backend": backend, "algo": args.algo, "collectors": n, **rates(cfg.out / "metrics.jsonl")}
        row["wall_s"] = time.perf_counter() - t0
        row["load_avg_1m"] = os.getloadavg()[0]  # other jobs on the machine at the end of this row
        if backend == "ray":  # the learner's cost of the batches (RayCollectors counts it)
            c = seen["collectors"]
            row["intake_ms_per_batch"] = 1000 * c.intake_s / max(c.batches, 1)
            row["intake_share"] = c.intake_s / summary["train_seconds"]
        rows.append(row)
        print(rows[-1], flush=True)
    meta = {
        **machine(),
        "command": "python benchmarks/rl_throughput.py " + " ".join(sys.argv[1:]),
        "config": str(args.config.relative_to(ROOT)),
        "batch_size": cfg.batch_size,
        "envs_per_collector": cfg.source.envs_per_collector,
        "publish_every": cfg.source.publish_every,
        "note": "trainer and collectors share the same 2 cores; each process (or actor) runs torch with 1 thread",
        "ray_worker_niceness": os.environ.get("RAY_worker_niceness", "default (15)"),  # noqa: SIM112 (Ray spells it so)
    }
    columns = list(dict.fromkeys(k for r in rows for k in r))
    write_results(args.name, rows, meta, columns)


if __name__ == "__main__":
    main()
