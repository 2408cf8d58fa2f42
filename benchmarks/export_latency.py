"""Chunk-planning latency at batch 1 on one CPU thread, for every policy kind: the torch policy (eager,
inference_mode) against its exported ONNX graph in onnxruntime.

Run: ``python benchmarks/export_latency.py`` (random weights: the cost of a network does not depend on its weight
values) or ``--checkpoints RUN/checkpoint ...`` for trained ones; ``--cases NAME ...`` picks rows by name.
Rows: state policies in the MultiPathGrasp state shapes (31 -> 6): the diffusion policy with each denoiser and
DDIM step count, the Gaussian and VAE heads, the distilled student (1 and 2 network calls); and multimodal ones
built from configs/grasp_multimodal_cpu.yaml at 64 px (rgb, depth, joints, force, an instruction; ResNet keypoints
with FiLM, Perceiver fusion, frozen MiniLM): the diffusion policy and its student.

Columns: torch_ms is ``predict_chunk`` on raw observations (strings for the instruction, which the LanguageEncoder
caches per string); onnxruntime_ms is the graph alone; planner_ms is ``OnnxPlanner(obs)``, the whole onnxruntime
decision (conversion, noise, the cached instruction embedding); ascend_ok is the export's ATC operator check.
weights_mb is the graph's float weights; gemv_floor_ms is numpy ``x @ W.T`` (batch 1, one thread) once over each
2-D weight, i.e. the cost of reading the weights a Gemm / MatMul graph must stream per call: at batch 1 an MLP is
bound by it, not by its FLOPs. ``--profile`` adds gemm_share, the share of the graph's node time in Gemm / MatMul
(onnxruntime's profiler). ``--repeats N`` runs every measurement N times, interleaved, and keeps the median of the
N medians (for a loaded machine). Writes benchmarks/results/<--name>.json and .md (default export_latency).
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from _common import machine, median_ms, parse_args, write_results
from dmrl.config_utils import from_dict, load_yaml
from dmrl.export import OnnxPlanner, export_onnx, input_spec
from dmrl.export.onnx import example_inputs
from dmrl.policies import POLICIES, ChunkConfig, build_policy
from dmrl.policies.checkpoint import load_policy
from dmrl.policies.diffusion import DiffusionPolicyConfig
from dmrl.policies.gaussian import GaussianPolicyConfig
from dmrl.policies.vae import VAEPolicyConfig

STATE_DIM, ACTION_DIM = 31, 6  # MultiPathGrasp-v0, 3 cups
MM_PRESET = Path(__file__).resolve().parents[1] / "configs" / "grasp_multimodal_cpu.yaml"
MM_DIMS = {"rgb": (3, 64, 64), "depth": (1, 64, 64), "joints": 6, "force": 4}  # one camera, 64 px
INSTRUCTION = "pick up the red cup"


def _state(name: str, config) -> torch.nn.Module:  # noqa: ANN001
    return build_policy(name, ChunkConfig(obs_keys=("state",)), config, {"state": STATE_DIM}, ACTION_DIM)


def _diffusion(denoiser: str, kwargs: dict, steps: int) -> Callable[[], torch.nn.Module]:
    cfg = DiffusionPolicyConfig(denoiser=denoiser, denoiser_kwargs=kwargs, prediction_type="sample")
    cfg.num_inference_steps = steps
    return lambda: _state("diffusion", cfg)


def _student(kwargs: dict, steps: int, teacher_steps: int = 10) -> Callable[[], torch.nn.Module]:
    def build() -> torch.nn.Module:
        from dmrl.policies.student import StudentPolicyConfig  # imported when run: a checkout may lack it

        return _state("student", StudentPolicyConfig(steps=steps, denoiser_kwargs=kwargs, teacher_steps=teacher_steps))

    return build


def _multimodal(kind: str) -> Callable[[], torch.nn.Module]:
    def build() -> torch.nn.Module:
        preset = load_yaml(MM_PRESET)
        chunk = from_dict(ChunkConfig, preset["chunk"], "chunk")
        pol = {k: v for k, v in preset["policy"].items() if k != "type"}
        if kind == "diffusion":
            cfg = DiffusionPolicyConfig(**pol)
        else:  # the student a distillation of this preset starts from: the teacher's denoiser, one call
            from dmrl.policies.student import StudentPolicyConfig

            cfg = StudentPolicyConfig(steps=1, denoiser=pol["denoiser"], denoiser_kwargs=pol["denoiser_kwargs"])
        return build_policy(kind, chunk, cfg, MM_DIMS, ACTION_DIM)

    return build


CASES: dict[str, Callable[[], torch.nn.Module]] = {
    "diffusion mlp 256x2 DDIM-10": _diffusion("mlp", {"hidden_dim": 256, "n_blocks": 2}, 10),
    "diffusion mlp 512x4 DDIM-2": _diffusion("mlp", {"hidden_dim": 512, "n_blocks": 4}, 2),
    "diffusion mlp 512x4 DDIM-10": _diffusion("mlp", {"hidden_dim": 512, "n_blocks": 4}, 10),
    "diffusion unet DDIM-10": _diffusion("unet", {}, 10),
    "diffusion transformer DDIM-10": _diffusion("transformer", {}, 10),
    "gaussian 512x3": lambda: _state("gaussian", GaussianPolicyConfig()),
    "vae 512x3 (z sampled)": lambda: _state("vae", VAEPolicyConfig()),
    "student mlp 256x2 1-step": _student({"hidden_dim": 256, "n_blocks": 2}, 1),
    "student mlp 512x4 1-step": _student({"hidden_dim": 512, "n_blocks": 4}, 1),
    "student mlp 512x4 2-step": _student({"hidden_dim": 512, "n_blocks": 4}, 2),
    "multimodal diffusion (preset) DDIM-10": _multimodal("diffusion"),
    "multimodal student (preset) 1-step": _multimodal("student"),
}


def _median_ms(fn: Callable[[], object], reps: int) -> float:
    return median_ms(fn, reps, warmup=min(10, reps))


def _weights(path: Path) -> list[np.ndarray]:
    """The graph's float initializers (its weights, biases and folded constants)."""
    import onnx
    from onnx import numpy_helper

    return [
        numpy_helper.to_array(t)
        for t in onnx.load(str(path)).graph.initializer
        if t.data_type in (onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16, onnx.TensorProto.DOUBLE)
    ]


def _gemv_floor(weights: list[np.ndarray]) -> Callable[[], object]:
    """One batch-1 product with every 2-D weight: reads each once, as the graph's Gemm / MatMul nodes do."""
    mats = [np.ascontiguousarray(w, dtype=np.float32) for w in weights if w.ndim == 2]
    vecs = [np.ones((1, w.shape[1]), np.float32) for w in mats]
    return lambda: [x @ w.T for x, w in zip(vecs, mats, strict=True)]


def _gemm_share(path: Path, feeds: dict[str, np.ndarray], reps: int) -> float:
    """Share of the summed per-node medians (onnxruntime profiler, one thread) spent in Gemm / MatMul nodes."""
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads, opts.inter_op_num_threads, opts.log_severity_level = 1, 1, 3
    opts.enable_profiling = True
    with tempfile.TemporaryDirectory() as d:
        opts.profile_file_prefix = str(Path(d) / "ort")
        session = ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
        for _ in range(reps + 10):
            session.run(None, feeds)
        events = json.loads(Path(session.end_profiling()).read_text())
    nodes: dict[tuple[str, str], list[float]] = {}
    for e in events:
        if e.get("cat") == "Node" and e["name"].endswith("_kernel_time"):
            nodes.setdefault((e["args"]["op_name"], e["name"]), []).append(e["dur"])
    medians = {key: float(np.median(d)) for key, d in nodes.items()}
    total = sum(medians.values())
    return sum(m for (op, _), m in medians.items() if op in ("Gemm", "MatMul")) / total if total else float("nan")


def _randomise(policy: torch.nn.Module) -> None:
    # An untrained output layer is zero (a constant chunk): give it weights so the parity check means something.
    for name, q in policy.named_parameters():
        if not name.startswith("encoder.text_encoder.") and not q.any():
            torch.nn.init.normal_(q, std=0.02)


def _row(name: str, policy: torch.nn.Module, args: Args, tmp: Path) -> dict:
    policy.eval()
    report = export_onnx(policy, tmp / "p.onnx", batch_size=1)
    text = getattr(policy.encoder, "text_encoder", None)
    planner = OnnxPlanner(tmp / "p.onnx", threads=1, text_encoder=text)
    feeds = example_inputs(input_spec(policy, 1))
    obs: dict = {k: torch.from_numpy(feeds[k]) for k in policy.chunk.obs_keys if k in feeds}
    if text is not None:
        obs["instruction"] = [INSTRUCTION]
        feeds["instruction_tokens"], feeds["instruction_mask"] = planner.embed([INSTRUCTION])
    weights = _weights(report.path)
    timed = {
        "torch_ms": lambda: policy.predict_chunk(obs),
        "onnxruntime_ms": lambda: planner.run(feeds),
        "planner_ms": lambda: planner(obs),
        "gemv_floor_ms": _gemv_floor(weights),
    }
    runs: dict[str, list[float]] = {k: [] for k in timed}
    for _ in range(args.repeats):  # interleaved, so a change of load hits every column alike
        for k, fn in timed.items():
            runs[k].append(_median_ms(fn, args.reps))
    ms = {k: float(np.median(v)) for k, v in runs.items()}
    torch_ms, ort_ms, planner_ms = ms["torch_ms"], ms["onnxruntime_ms"], ms["planner_ms"]
    side = json.loads(Path(f"{report.path}.json").read_text())
    params = sum(p.numel() for n, p in policy.named_parameters() if not n.startswith("encoder.text_encoder."))
    sampler = getattr(policy, "sampler", None)
    calls = sampler.num_steps if sampler is not None else len(getattr(policy, "starts", (0,)))
    return {
        "policy": name,
        "kind": policy.name,
        "network_calls": calls,  # DDIM steps, the student's calls, 1 for the one-shot heads
        "params": params,
        "torch_ms": torch_ms,
        "onnxruntime_ms": ort_ms,
        "planner_ms": planner_ms,
        "speedup": torch_ms / ort_ms,
        "max_abs_diff": report.max_abs_diff,
        "onnx_mb": report.file_mb,
        "n_ops": sum(report.ops.values()),
        "ascend_ok": side["ascend_atc"]["ok"],
        "weights_mb": sum(w.nbytes for w in weights) / 2**20,
        "gemv_floor_ms": ms["gemv_floor_ms"],
        **({"gemm_share": _gemm_share(report.path, feeds, args.reps)} if args.profile else {}),
    }


@dataclass
class Args:
    checkpoints: list[Path] = field(default_factory=list)
    """trained checkpoints instead of the random-weight cases"""
    cases: list[str] = field(default_factory=list)
    """rows to run, by name (default: all); see CASES in this file"""
    reps: int = 200
    """timed calls per measurement"""
    repeats: int = 1
    """measurements per column, interleaved; the row keeps their median"""
    profile: bool = False
    """add gemm_share (onnxruntime's profiler over --reps calls)"""
    name: str = "export_latency"
    """results file stem under benchmarks/results/"""

    def __post_init__(self) -> None:
        if self.reps < 1 or self.repeats < 1:
            raise SystemExit(f"--reps / --repeats: got {self.reps} / {self.repeats}; both must be >= 1")
        if not self.name or "/" in self.name:
            raise SystemExit(f"--name: got {self.name!r}; a file stem without '/' (e.g. export_latency_student)")


def main() -> None:
    args = parse_args(Args, __doc__, allow_empty=("checkpoints", "cases"))
    unknown = [c for c in args.cases if c not in CASES]
    if unknown:
        raise SystemExit(f"--cases: got {unknown[0]!r}; allowed: {', '.join(CASES)}")
    torch.set_num_threads(1)
    try:  # gemv_floor_ms on one BLAS thread, as the graph runs (threadpoolctl comes with scikit-learn)
        from threadpoolctl import threadpool_limits

        blas = threadpool_limits(1)
    except ImportError:
        blas = None
    rows = []
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        if args.checkpoints:
            for ckpt in args.checkpoints:
                policy, _ = load_policy(ckpt)
                rows.append(_row(str(ckpt), policy, args, tmp))
                print(rows[-1], flush=True)
        else:
            for name in args.cases or list(CASES):
                if "student" in name and "student" not in POLICIES:
                    print(f"skip {name}: no student policy in this checkout", flush=True)
                    continue
                torch.manual_seed(0)
                policy = CASES[name]()
                _randomise(policy)
                rows.append(_row(name, policy, args, tmp))
                print(rows[-1], flush=True)
    command = "python benchmarks/export_latency.py"
    if args.checkpoints:
        command += " --checkpoints " + " ".join(map(str, args.checkpoints))
    if args.cases:
        command += " --cases " + " ".join(f"'{c}'" for c in args.cases)
    if args.reps != 200:
        command += f" --reps {args.reps}"
    if args.repeats != 1:
        command += f" --repeats {args.repeats}"
    if args.profile:
        command += " --profile"
    if args.name != "export_latency":
        command += f" --name {args.name}"
    meta = {
        **machine(),
        "command": command,
        "threads": 1,
        "batch": 1,
        "load_average_1min_at_end": round(os.getloadavg()[0], 2),  # other jobs on the machine inflate timings
        "onnxruntime": __import__("onnxruntime").__version__,
        "blas_threads_for_gemv_floor": 1 if blas is not None else "BLAS default (no threadpoolctl)",
        "dmrl_src": str(Path(__import__("dmrl").__file__).parent),  # which dmrl was timed (PYTHONPATH may pick one)
        "nice": os.nice(0),
        "weights": "trained checkpoints" if args.checkpoints else "random (MultiPathGrasp shapes; multimodal preset)",
    }
    write_results(args.name, rows, meta, list(rows[0]))


if __name__ == "__main__":
    main()
