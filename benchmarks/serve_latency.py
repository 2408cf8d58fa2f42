"""Round trip of ``dmrl serve`` on localhost against a direct ``policy.act`` call: p50 / p99 per env step, 1 and 4
clients, torch and onnxruntime planners.

Run: ``python benchmarks/serve_latency.py`` (random weights in the shapes of the README's policies: the state
diffusion policy, 256 x 2 MLP DDIM-10, and the multimodal preset configs/grasp_multimodal_cpu.yaml at 64 px; the
cost of a network does not depend on its weight values) or ``--checkpoints RUN/checkpoint ...`` for trained ones.
The server is a ``dmrl serve`` process (one torch thread); clients are threads of this process, each with its own
connection, session and seed, stepping at once. Every step counts: with Ta 8, seven in eight steps pop the action
queue (their p50 is the server's own cost) and one plans a chunk (p99; ``plan_p50_ms`` is those steps alone).
Writes benchmarks/results/serve_latency.json and .md.
"""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from _common import machine, parse_args, write_results
from dmrl.policies import build_policy
from dmrl.policies.base import ChunkConfig
from dmrl.policies.checkpoint import load_policy, save_policy
from dmrl.policies.diffusion import DiffusionPolicyConfig

ROOT = Path(__file__).resolve().parents[1]
STATE_DIM, ACTION_DIM = 31, 6  # MultiPathGrasp-v0, 3 cups
MM_DIMS = {"rgb": (3, 64, 64), "depth": (1, 64, 64), "joints": 6, "force": 4}


def _opened(policy):
    """An untrained denoiser head is zero (every chunk the same): give it weights, as export_latency does."""
    for q in policy.parameters():
        if q.dtype.is_floating_point and not q.any():
            torch.nn.init.normal_(q, std=0.02)
    return policy.eval()


def state_policy():
    torch.manual_seed(0)
    cfg = DiffusionPolicyConfig(denoiser_kwargs={"hidden_dim": 256, "n_blocks": 2}, prediction_type="sample")
    return _opened(build_policy("diffusion", ChunkConfig(obs_keys=("state",)), cfg, {"state": STATE_DIM}, ACTION_DIM))


def multimodal_policy():
    from dmrl.config_utils import load_yaml, merge
    from dmrl.train.config import TrainConfig

    torch.manual_seed(0)
    cfg = merge(TrainConfig(), load_yaml(ROOT / "configs" / "grasp_multimodal_cpu.yaml"))
    return _opened(build_policy("diffusion", cfg.chunk, cfg.policy, MM_DIMS, ACTION_DIM))


def observations(policy, n: int, seed: int) -> list[dict]:
    """n env steps of random observations in the policy's unbatched shapes (one instruction for the episode)."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        obs: dict = {}
        for k in policy.chunk.obs_keys:
            if k == "instruction":
                obs[k] = "pick up the red cup"
                continue
            dim = policy.obs_dims[k]
            shape = tuple(dim) if isinstance(dim, (tuple, list)) else (int(dim),)
            if k == "rgb":
                obs[k] = rng.integers(0, 256, shape, dtype=np.uint8)
            else:
                obs[k] = rng.uniform(0.2, 2.0, shape).astype(np.float32)
        out.append(obs)
    return out


def _stats(ms: list[float], planned: list[bool]) -> tuple[float, float, float]:
    """(p50, p99 over every step, p50 over the steps that planned a chunk)."""
    a, p = np.asarray(ms), np.asarray(planned)
    return float(np.percentile(a, 50)), float(np.percentile(a, 99)), float(np.percentile(a[p], 50))


def direct(policy, steps: list[dict], warmup: int) -> tuple[list[float], list[bool]]:
    """Per-step ms of ``policy.act`` over ``steps`` (after ``warmup`` untimed steps), and which steps planned."""
    ta = policy.chunk.n_action_steps
    policy.reset()
    for o in steps[:warmup]:
        policy.act(o)
    policy.reset()
    ms, planned = [], []
    for i, o in enumerate(steps):
        t = time.perf_counter()
        policy.act(o)
        ms.append((time.perf_counter() - t) * 1e3)
        planned.append(i % ta == 0)
    return ms, planned


def start_server(checkpoint: Path, onnx: Path | None) -> tuple[subprocess.Popen, str]:
    env = {**os.environ, "PYTHONPATH": f"{ROOT / 'src'}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    cmd = [sys.executable, "-m", "dmrl", "serve", "--checkpoint", str(checkpoint), "--port", "0"]
    cmd += ["--onnx", str(onnx)] if onnx is not None else []
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env)
    if not select.select([proc.stdout], [], [], 120)[0]:
        proc.kill()
        raise RuntimeError("dmrl serve printed no ready line in 120 s")
    line = proc.stdout.readline()  # type: ignore[union-attr]
    if not line:
        raise RuntimeError(f"dmrl serve exited with {proc.wait()}")
    return proc, json.loads(line)["url"]


def served(url: str, steps: list[dict], clients: int, warmup: int) -> tuple[list[float], list[bool]]:
    """Per-step round-trip ms of ``clients`` clients stepping ``steps`` at once (each after ``warmup`` untimed)."""
    from dmrl.serve.client import PolicyClient

    conns = [PolicyClient(url) for _ in range(clients)]
    barrier = threading.Barrier(clients)
    results: list[tuple[list[float], list[bool]]] = [([], []) for _ in range(clients)]

    def run(i: int) -> None:
        c, (ms, planned) = conns[i], results[i]
        c.reset(seed=i)
        for o in steps[:warmup]:
            c.act(o)
        c.reset(seed=i)
        barrier.wait()
        for o in steps:
            t = time.perf_counter()
            reply = c.request({"cmd": "act", "obs": o})
            ms.append((time.perf_counter() - t) * 1e3)
            planned.append(bool(reply["planned"]))

    threads = [threading.Thread(target=run, args=(i,)) for i in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for c in conns:
        c.close()
    return sum((r[0] for r in results), []), sum((r[1] for r in results), [])


@dataclass
class Args:
    checkpoints: list[Path] = field(default_factory=list)
    """trained checkpoints instead of the random-weight state and multimodal policies"""
    steps: int = 200
    """timed env steps per client and round for a state policy (a multimodal one: a quarter)"""
    rounds: int = 4
    """alternating rounds of direct and served blocks"""
    clients: list[int] = field(default_factory=lambda: [1, 4])
    """numbers of clients stepping at once"""
    onnx: bool = True
    """serve an exported graph (--onnx) of each policy that exports as well (--no-onnx: torch only)"""
    name: str = "serve_latency"
    """results file: benchmarks/results/<name>.json and .md"""


def main() -> None:
    args = parse_args(Args, __doc__, allow_empty=("checkpoints",))
    torch.set_num_threads(1)
    rows = []
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        if args.checkpoints:
            cases = [(str(c), c) for c in args.checkpoints]
        else:
            cases = [
                ("state diffusion mlp 256x2 DDIM-10", save_policy(tmp / "state", state_policy())),
                ("multimodal (grasp_multimodal_cpu, 64 px)", save_policy(tmp / "mm", multimodal_policy())),
            ]
        for name, ckpt in cases:
            policy = load_policy(ckpt)[0]
            mm = policy.chunk.encoder_type == "multimodal"
            n = args.steps // 4 if mm else args.steps
            steps, warmup = observations(policy, n, seed=0), 2 * policy.chunk.n_action_steps
            planners: list[tuple[str, Path | None]] = [("torch", None)]
            if args.onnx:
                try:
                    from dmrl.export import OnnxPlanner, export_onnx

                    export_onnx(policy, tmp / f"{len(rows)}.onnx")
                    planners.append(("onnxruntime", tmp / f"{len(rows)}.onnx"))
                except (
                    ValueError,
                    RuntimeError,
                ) as e:  # e.g. a policy that reads an instruction, on a dmrl that cannot export it
                    print(f"{name}: no onnx row ({e})", flush=True)
            for planner, graph in planners:
                if graph is not None:
                    text = (
                        {"text_encoder": policy.encoder.text_encoder} if "instruction" in policy.chunk.obs_keys else {}
                    )
                    policy.set_planner(OnnxPlanner(graph, threads=1, **text))
                proc, url = start_server(ckpt, graph)
                # Direct and served blocks alternate over the rounds: the load of a shared machine drifts.
                times: dict[int, tuple[list[float], list[bool]]] = {c: ([], []) for c in [0, *args.clients]}
                try:
                    for _ in range(args.rounds):
                        for c in times:
                            ms, planned = direct(policy, steps, warmup) if c == 0 else served(url, steps, c, warmup)
                            times[c][0].extend(ms)
                            times[c][1].extend(planned)
                finally:
                    proc.terminate()
                    proc.wait(30)
                policy.set_planner(None)
                d50, d99, dplan = _stats(*times[0])
                for c in args.clients:
                    p50, p99, plan = _stats(*times[c])
                    rows.append(
                        {
                            "policy": name,
                            "planner": planner,
                            "clients": c,
                            "p50_ms": p50,
                            "p99_ms": p99,
                            "plan_p50_ms": plan,
                            "direct_ms": d50,
                            "direct_p99_ms": d99,
                            "direct_plan_ms": dplan,
                            "added_p50_ms": p50 - d50,
                            "added_plan_ms": plan - dplan,
                            "steps": len(times[c][0]),
                        }
                    )
                    print(rows[-1], flush=True)
    meta = {
        **machine(),
        "command": "python benchmarks/serve_latency.py"
        + f" --steps {args.steps} --rounds {args.rounds} --clients {' '.join(map(str, args.clients))}"
        + (" --checkpoints " + " ".join(map(str, args.checkpoints)) if args.checkpoints else "")
        + ("" if args.onnx else " --no-onnx")
        + ("" if args.name == "serve_latency" else f" --name {args.name}"),
        "server": "dmrl serve, one process, one torch / onnxruntime thread; clients: threads of the benchmark process",
        "transport": "WebSocket on 127.0.0.1, msgpack messages",
        "Ta": "8 (checkpoint default): p50 is a queue pop, p99 and plan_p50_ms a planned chunk",
        "weights": "trained checkpoints" if args.checkpoints else "random (README policy shapes)",
        "added_p50_ms": "p50_ms - direct_ms (the issue's target: <= 1 ms with 1 client)",
        "load_avg_1m_at_end": round(os.getloadavg()[0], 2),  # other jobs on the machine inflate every column
    }
    write_results(args.name, rows, meta, list(rows[0]))


if __name__ == "__main__":
    main()
