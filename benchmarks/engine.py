"""Training-engine benchmarks on this machine: activation memory with and without gradient checkpointing, the
torch.compile speed-up and compile time, and training throughput (precision, accumulation, torchrun ranks).

Run: ``python benchmarks/engine.py [--only memory compile throughput]``.
Writes benchmarks/results/engine_memory.{json,md}, engine_precision.*, engine_compile.*, engine_throughput.*.

Every number is one diffusion-policy training step (forward, backward, AdamW) through dmrl.train.engine on
synthetic MultiPathGrasp-shaped batches: state (B, 2, 31), action chunk (B, 16, 6). Activation memory is the
bytes autograd keeps for backward (counted with saved_tensors_hooks, so it is exact and device-independent);
on CUDA, benchmarks/gpu_check.py reports the allocator's real peak as well.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from _common import machine, parse_args, write_results
from dmrl.policies import ChunkConfig
from dmrl.policies.diffusion import DiffusionPolicy, DiffusionPolicyConfig
from dmrl.train.engine import Engine, EngineConfig, set_grad_checkpointing

DENOISERS = {
    "mlp": {"hidden_dim": 512, "n_blocks": 4},
    "unet": {"down_dims": [64, 128, 256]},
    "transformer": {"d_model": 128, "n_layers": 4},
}


def _policy(denoiser: str, seed: int = 0) -> DiffusionPolicy:
    torch.manual_seed(seed)
    cfg = DiffusionPolicyConfig(denoiser=denoiser, denoiser_kwargs=DENOISERS[denoiser], prediction_type="sample")
    return DiffusionPolicy(ChunkConfig(), cfg, {"state": 31}, 6)


def _batch(b: int, device: torch.device | str = "cpu") -> dict:
    g = torch.Generator().manual_seed(b)
    batch = {
        "obs": {"state": torch.randn(b, 2, 31, generator=g)},
        "action": torch.rand(b, 16, 6, generator=g) * 2 - 1,
        "action_mask": torch.ones(b, 16, dtype=torch.bool),
    }
    return {
        k: ({kk: vv.to(device) for kk, vv in v.items()} if isinstance(v, dict) else v.to(device))
        for k, v in batch.items()
    }


def saved_activation_bytes(policy: torch.nn.Module, batch: dict) -> int:
    """Bytes of distinct tensor storages autograd saves for backward during one loss forward."""
    seen: set[int] = set()
    total = 0

    def pack(t: torch.Tensor) -> torch.Tensor:
        nonlocal total
        storage = t.untyped_storage()
        if storage.data_ptr() not in seen and not isinstance(t, torch.nn.Parameter):
            seen.add(storage.data_ptr())
            total += storage.nbytes()
        return t

    params = {p.untyped_storage().data_ptr() for p in policy.parameters()}
    seen |= params  # weights are memory either way; count only what checkpointing can drop
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = policy.loss(batch)["loss"]
    loss.backward()
    return total


def bench_memory(batch: int = 128) -> None:
    rows = []
    for name in DENOISERS:
        policy = _policy(name).train()
        per = {}
        for on in (False, True):
            set_grad_checkpointing(policy, on)
            per[on] = saved_activation_bytes(policy, _batch(batch))
        set_grad_checkpointing(policy, True)
        per_sample = saved_activation_bytes(policy, _batch(2 * batch)) - per[True]  # linear part, per `batch`
        budget = per[False]
        fixed = per[True] - per_sample
        largest = int((budget - fixed) / (per_sample / batch)) // 8 * 8
        rows.append(
            {
                "denoiser": name,
                "batch": batch,
                "activations_MiB": per[False] / 2**20,
                "checkpointed_MiB": per[True] / 2**20,
                "saving_pct": 100 * (1 - per[True] / per[False]),
                "largest_batch_same_budget": largest,
            }
        )
        print(rows[-1], flush=True)
    meta = {
        **machine(),
        "command": "python benchmarks/engine.py --only memory",
        "note": "CPU peak RSS is not measurable per step here (import-time peaks dominate); gpu_check.py reports "
        "the CUDA allocator's peak",
        "activations": "bytes autograd saves for backward (saved_tensors_hooks); largest batch keeps them in budget",
    }
    write_results("engine_memory", rows, meta, list(rows[0]))


def _step_times(engine: Engine, policy: torch.nn.Module, batch: dict, steps: int) -> list[float]:
    module = engine.prepare(policy)
    opt = torch.optim.AdamW(policy.parameters(), lr=1e-4)
    times = []
    for _ in range(steps):
        t = time.perf_counter()
        engine.forward_backward(module, batch)
        engine.step(opt)
        if engine.device.type == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t)
    return times


def bench_compile(batch: int = 256, steps: int = 40) -> None:
    rows = []
    for name in ("mlp", "transformer"):
        eager = _step_times(Engine(EngineConfig(device="cpu")), _policy(name), _batch(batch), steps)
        comp = _step_times(Engine(EngineConfig(device="cpu", compile=True)), _policy(name), _batch(batch), steps)
        e, c = statistics.median(eager[5:]), statistics.median(comp[5:])
        rows.append(
            {
                "denoiser": name,
                "batch": batch,
                "eager_ms": 1e3 * e,
                "compiled_ms": 1e3 * c,
                "speedup": e / c,
                "first_compiled_step_s": comp[0],
            }
        )
        print(rows[-1], flush=True)
    meta = {**machine(), "command": "python benchmarks/engine.py --only compile", "threads": torch.get_num_threads()}
    write_results("engine_compile", rows, meta, list(rows[0]))


def bench_precision(steps: int = 12) -> None:
    from dmrl.train.engine.device import cpu_has_native

    rows = []
    for name in DENOISERS:
        batch = 256 if name == "mlp" else 64
        ms = {}
        for precision in ("fp32", "bf16"):
            engine = Engine(EngineConfig(device="cpu", precision=precision))
            ms[precision] = 1e3 * statistics.median(_step_times(engine, _policy(name), _batch(batch), steps)[3:])
        rows.append(
            {
                "denoiser": name,
                "batch": batch,
                "fp32_ms": ms["fp32"],
                "bf16_ms": ms["bf16"],
                "bf16_over_fp32": ms["bf16"] / ms["fp32"],
            }
        )
        print(rows[-1], flush=True)
    meta = {
        **machine(),
        "command": "python benchmarks/engine.py --only precision",
        "cpu_native_bf16": cpu_has_native("bf16"),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "threads": torch.get_num_threads(),
    }
    write_results("engine_precision", rows, meta, list(rows[0]))


def _synthetic_store(path: Path, episodes: int = 40, length: int = 60) -> None:
    from dmrl.data import EpisodeStore
    from dmrl.types import Episode

    st = EpisodeStore.create(
        path,
        env_id="dmrl/MultiPathGrasp-v0",
        obs_modes=("state",),
        action_meaning=[str(i) for i in range(6)],
        obs_spec={"state": ((31,), "float32")},
        action_dim=6,
    )
    for s in range(episodes):
        rng = np.random.default_rng(s)
        obs = {"state": rng.normal(size=(length, 31)).astype(np.float32)}
        st.append(
            Episode(
                obs,
                {"state": obs["state"][-1]},
                rng.uniform(-1, 1, (length, 6)).astype(np.float32),
                np.zeros(length, np.float32),
                terminated=True,
                truncated=False,
                instruction="",
                target="",
                route=None,
                success=True,
                seed=s,
            )  # fmt: skip
        )


def _train_samples_per_s(store: Path, out: Path, ranks: int, extra: list[str]) -> float:
    args = ["train", "--dataset", str(store), "--out", str(out), "--overwrite", "--source.val-fraction", "0",
            "--steps", "150", "--batch-size", "256", "--engine.device", "cpu", *extra]  # fmt: skip
    pre = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={ranks}", "-m", "dmrl"]
    cmd = pre + args if ranks > 1 else [sys.executable, "-m", "dmrl", *args]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    subprocess.run(cmd, env=env, check=True, capture_output=True, text=True)
    return float(json.loads((out / "summary.json").read_text())["samples_per_s"])


def bench_throughput() -> None:
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        store = Path(tmp) / "d.zarr"
        _synthetic_store(store)
        for label, ranks, extra in [
            ("fp32, 1 process", 1, []),
            ("fp32, accumulate 4 micro-batches", 1, ["--engine.accumulate", "4"]),
            ("fp32, 2 ranks (torchrun, gloo)", 2, []),
            ("bf16 autocast, 1 process", 1, ["--engine.precision", "bf16"]),
            ("fp32, grad checkpointing", 1, ["--engine.grad-checkpointing"]),
        ]:
            sps = _train_samples_per_s(store, Path(tmp) / "run", ranks, extra)
            rows.append({"setting": label, "global_batch": 256, "samples_per_s": sps})
            print(rows[-1], flush=True)
    meta = {
        **machine(),
        "command": "python benchmarks/engine.py --only throughput",
        "model": "diffusion, MLP denoiser 256x2 (the default), state obs",
        "threads_per_process": 1,
    }
    write_results("engine_throughput", rows, meta, list(rows[0]))


@dataclass
class Args:
    only: list[str] = field(default_factory=lambda: ["memory", "precision", "compile", "throughput"])
    """which benchmarks to run"""


def main() -> None:
    args = parse_args(Args, __doc__)
    torch.set_num_threads(1)
    warnings.filterwarnings("ignore", message=".*far slower.*")
    for name in args.only:
        benches = {"memory": bench_memory, "precision": bench_precision, "compile": bench_compile}
        {**benches, "throughput": bench_throughput}[name]()


if __name__ == "__main__":
    main()
