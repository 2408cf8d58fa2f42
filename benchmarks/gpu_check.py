"""One short GPU check of the training engine (CUDA; a few minutes on one GPU). CI has no GPU: run it by hand.

Run: ``python benchmarks/gpu_check.py [--steps 300]`` on a machine with CUDA (after ``pip install -e .``).
Writes benchmarks/results/engine_gpu.{json,md}:
  1. precision   fp32 / bf16 / fp16 training of the diffusion policy on fixed synthetic batches: the bf16 and fp16
                 loss curves must stay within tolerance of fp32 (mean of the last 50 steps within 10%), and fp16's
                 dynamic loss scale and skipped steps are reported;
  2. ddp         torchrun with one rank (NCCL) against no torchrun: same final loss, samples/s of each;
  3. compile     eager vs torch.compile step time and the first (compiling) step;
  4. memory      the CUDA allocator's peak at batch 128 with and without gradient checkpointing, and the
                 largest batch (multiple of 64) that fits in the un-checkpointed peak.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch

from _common import machine, parse_args, write_results
from dmrl.train.engine import Engine, EngineConfig, set_grad_checkpointing
from engine import DENOISERS, _batch, _policy, _step_times, _synthetic_store


def _losses(precision: str, steps: int) -> tuple[list[float], Engine]:
    torch.manual_seed(0)
    engine = Engine(EngineConfig(device="cuda", precision=precision), seed=0)
    policy = _policy("unet")
    module = engine.prepare(policy)
    opt = torch.optim.AdamW(policy.parameters(), lr=3e-4)
    data = [_batch(256 + i, "cuda") for i in range(4)]
    out = []
    for i in range(steps):
        out.append(float(engine.forward_backward(module, data[i % 4])["loss"]))
        engine.step(opt)
    return out, engine


def check_precision(steps: int) -> list[dict]:
    rows, ref = [], None
    for precision in ("fp32", "bf16", "fp16"):
        losses, engine = _losses(precision, steps)
        tail = statistics.mean(losses[-50:])
        ref = tail if precision == "fp32" else ref
        rows.append(
            {
                "check": f"precision {precision}",
                "value": f"final loss {tail:.4f}",
                "ok": abs(tail - ref) / ref < 0.10,
                "detail": f"loss scale {engine.scaler.get_scale():.0f}" if precision == "fp16" else "",
            }
        )
    return rows


def check_ddp() -> list[dict]:
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        store = Path(tmp) / "d.zarr"
        _synthetic_store(store)
        res = {}
        for label, pre in [
            ("plain", [sys.executable, "-m", "dmrl"]),
            ("torchrun 1 rank", [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=1",
                                 "-m", "dmrl"]),
        ]:  # fmt: skip
            out = Path(tmp) / label.replace(" ", "_")
            args = ["train", "--dataset", str(store), "--out", str(out), "--source.val-fraction", "0", "--steps", "200",
                    "--engine.device", "cuda", "--engine.precision", "fp32"]  # fmt: skip
            subprocess.run(pre + args, check=True, capture_output=True, text=True)
            res[label] = json.loads((out / "summary.json").read_text())
        a, b = res["plain"], res["torchrun 1 rank"]
        rows.append(
            {
                "check": "ddp 1 rank vs none",
                "value": f"{b['samples_per_s']:.0f} vs {a['samples_per_s']:.0f} samples/s",
                "ok": abs(a["loss"] - b["loss"]) <= 0.05 * abs(a["loss"]) + 1e-4,
                "detail": f"final loss {b['loss']:.4f} vs {a['loss']:.4f}",
            }
        )
    return rows


def check_compile() -> list[dict]:
    rows = []
    for name in ("mlp", "unet", "transformer"):
        eager = _step_times(Engine(EngineConfig(device="cuda")), _policy(name), _batch(256, "cuda"), 30)
        comp = _step_times(Engine(EngineConfig(device="cuda", compile=True)), _policy(name), _batch(256, "cuda"), 30)
        e, c = statistics.median(eager[5:]), statistics.median(comp[5:])
        rows.append(
            {
                "check": f"compile {name}",
                "value": f"{e / c:.2f}x ({1e3 * e:.1f} -> {1e3 * c:.1f} ms/step)",
                "ok": True,  # reported, not judged: a small model may not gain
                "detail": f"first step {comp[0]:.1f} s",
            }
        )
    return rows


def _peak(name: str, batch: int, ckpt: bool) -> int:
    policy = _policy(name).cuda().train()
    set_grad_checkpointing(policy, ckpt)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    policy.loss(_batch(batch, "cuda"))["loss"].backward()
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated()
    del policy
    torch.cuda.empty_cache()
    return peak


def check_memory(batch: int = 128) -> list[dict]:
    rows = []
    for name in DENOISERS:
        plain, ckpt = _peak(name, batch, False), _peak(name, batch, True)
        largest = batch
        while largest < 64 * batch and _peak(name, largest + 64, True) <= plain:
            largest += 64
        rows.append(
            {
                "check": f"memory {name} batch {batch}",
                "value": f"{plain / 2**20:.0f} -> {ckpt / 2**20:.0f} MiB with checkpointing",
                "ok": ckpt < plain,
                "detail": f"largest batch in {plain / 2**20:.0f} MiB: {largest} (vs {batch})",
            }
        )
    return rows


@dataclass
class Args:
    steps: int = 300
    """training steps of the precision check"""


def main() -> None:
    args = parse_args(Args, __doc__)
    if not torch.cuda.is_available():
        sys.exit("gpu_check.py: no CUDA device here; run it on a GPU machine (CI has none)")
    rows = check_precision(args.steps) + check_ddp() + check_compile() + check_memory()
    meta = {**machine(), "gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
            "command": f"python benchmarks/gpu_check.py --steps {args.steps}"}  # fmt: skip
    write_results("engine_gpu", rows, meta, ["check", "value", "ok", "detail"])
    if not all(r["ok"] for r in rows):
        sys.exit("gpu_check.py: some checks failed (see the table)")


if __name__ == "__main__":
    main()
