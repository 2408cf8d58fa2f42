"""Decision latency of trained policies at batch 1 on one CPU thread: ms per act() call and per chunk.

Run: ``python benchmarks/latency.py --runs outputs/compare_state/runs`` (every */checkpoint below it).
Writes benchmarks/results/latency.json and .md. `act` is timed over closed-loop episodes (most calls pop the
action queue; every Ta-th call plans a chunk), `chunk` is predict_chunk alone.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from _common import machine, parse_args, write_results
from dmrl.policies.checkpoint import load_policy
from dmrl.train.evaluate import measure_latency


@dataclass
class Args:
    runs: list[Path]
    """directories holding */checkpoint"""
    steps: int = 400
    """closed-loop env steps timed per policy"""


def main() -> None:
    args = parse_args(Args, __doc__)
    torch.set_num_threads(1)
    rows = []
    for ckpt in sorted(c for runs in args.runs for c in runs.glob("*/checkpoint")):
        policy, meta = load_policy(ckpt)
        act_med, act_p95 = measure_latency(policy, meta["env_id"], steps=args.steps)
        obs = {"state": torch.zeros(1, policy.chunk.n_obs_steps, policy.obs_dims["state"])}
        times = []
        for i in range(60):
            t = time.perf_counter()
            policy.predict_chunk(obs)
            if i >= 10:
                times.append((time.perf_counter() - t) * 1e3)
        rows.append(
            {
                "run": f"{ckpt.parent.parent.name}/{ckpt.parent.name}",
                "policy": policy.name,
                "act_ms_median": act_med,
                "act_ms_p95": act_p95,
                "chunk_ms_median": float(np.median(times)),
                "params": sum(p.numel() for p in policy.parameters()),
            }
        )
        print(rows[-1], flush=True)
    meta = {
        **machine(),
        "command": "python benchmarks/latency.py --runs " + " ".join(map(str, args.runs)),
        "threads": 1,
        "batch": 1,
    }
    write_results("latency", rows, meta, list(rows[0]))


if __name__ == "__main__":
    main()
