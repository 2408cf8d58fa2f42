"""Chunk-planning latency at batch 1 on one CPU thread: the torch policy (eager, inference_mode) against its
exported ONNX graph in onnxruntime, for the denoisers and DDIM step counts we use.

Run: ``python benchmarks/export_latency.py`` (random weights in the MultiPathGrasp state-policy shapes: the cost of
a dense network does not depend on its weight values) or ``--checkpoints RUN/checkpoint ...`` for trained ones.
Writes benchmarks/results/export_latency.json and .md. Each row also reports the export's own parity check.
"""

from __future__ import annotations

import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from _common import machine, parse_args, write_results
from dmrl.export import OnnxPlanner, export_onnx, input_spec
from dmrl.export.onnx import example_inputs
from dmrl.policies import build_policy
from dmrl.policies.base import ChunkConfig
from dmrl.policies.checkpoint import load_policy
from dmrl.policies.diffusion import DiffusionPolicyConfig

STATE_DIM, ACTION_DIM = 31, 6  # MultiPathGrasp-v0, 3 cups
CASES = [  # (name, denoiser, kwargs, DDIM steps)
    ("mlp 256x2", "mlp", {"hidden_dim": 256, "n_blocks": 2}, (10,)),
    ("mlp 512x4", "mlp", {"hidden_dim": 512, "n_blocks": 4}, (2, 5, 10)),
    ("unet", "unet", {}, (10,)),
    ("transformer", "transformer", {}, (10,)),
]


def _median_ms(fn, reps: int) -> float:
    for _ in range(10):
        fn()
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t) * 1e3)
    return float(np.median(times))


def _row(name: str, policy, reps: int, tmp: Path) -> dict:
    policy.eval()
    report = export_onnx(policy, tmp / "p.onnx", batch_size=1)
    planner = OnnxPlanner(tmp / "p.onnx", threads=1)
    feeds = example_inputs(input_spec(policy, 1))
    obs = {k: torch.from_numpy(feeds[k]) for k in policy.chunk.obs_keys}
    torch_ms = _median_ms(lambda: policy.predict_chunk(obs), reps)
    ort_ms = _median_ms(lambda: planner.run(feeds), reps)
    return {
        "policy": name,
        "ddim_steps": policy.sampler.num_steps,
        "params": sum(p.numel() for p in policy.parameters()),
        "torch_ms": torch_ms,
        "onnxruntime_ms": ort_ms,
        "speedup": torch_ms / ort_ms,
        "max_abs_diff": report.max_abs_diff,
        "onnx_mb": report.file_mb,
    }


@dataclass
class Args:
    checkpoints: list[Path] = field(default_factory=list)
    """trained diffusion checkpoints instead"""
    reps: int = 200
    """timed calls per measurement"""


def main() -> None:
    args = parse_args(Args, __doc__, allow_empty=("checkpoints",))
    torch.set_num_threads(1)
    rows = []
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        if args.checkpoints:
            for ckpt in args.checkpoints:
                policy, _ = load_policy(ckpt)
                rows.append(_row(str(ckpt), policy, args.reps, tmp))
                print(rows[-1], flush=True)
        else:
            for name, denoiser, kwargs, steps in CASES:
                for s in steps:
                    torch.manual_seed(0)
                    cfg = DiffusionPolicyConfig(
                        denoiser=denoiser, denoiser_kwargs=kwargs, prediction_type="sample", num_inference_steps=s
                    )
                    policy = build_policy(
                        "diffusion", ChunkConfig(obs_keys=("state",)), cfg, {"state": STATE_DIM}, ACTION_DIM
                    )
                    # An untrained head is zero (a constant chunk): give it weights so the parity check means something.
                    for q in policy.denoiser.parameters():
                        if not q.any():
                            torch.nn.init.normal_(q, std=0.02)
                    rows.append(_row(name, policy, args.reps, tmp))
                    print(rows[-1], flush=True)
    meta = {
        **machine(),
        "command": "python benchmarks/export_latency.py"
        + (" --checkpoints " + " ".join(map(str, args.checkpoints)) if args.checkpoints else ""),
        "threads": 1,
        "batch": 1,
        "onnxruntime": __import__("onnxruntime").__version__,
        "weights": "trained checkpoints" if args.checkpoints else "random (MultiPathGrasp state-policy shapes)",
    }
    write_results("export_latency", rows, meta, list(rows[0]))


if __name__ == "__main__":
    main()
