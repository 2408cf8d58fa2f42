"""Where an exported graph's batch-1 time goes: the same graph run as it is and with one thing changed at a time.

Run: ``python benchmarks/export_latency_probe.py --checkpoint RUN/checkpoint`` (default: a random-weight 512x4
one-step student in the MultiPathGrasp state shapes, as ``export_latency.py``'s row). One thread, batch 1; every
variant is timed ``--repeats`` times, interleaved, each the median of ``--reps`` calls; the row keeps the median.

Rows (``variant``): ``graph`` the exported file as onnxruntime runs it; ``gemm as matmul`` every Gemm as MatMul
with the weight pre-transposed + Add; ``mish as softplus`` / ``mish as onnx Mish`` the written-out Mish
(x * tanh(log(1 + exp(x))), 5 ops, kept for Ascend ATC) as Softplus + Tanh + Mul or as one ONNX Mish; ``relu
instead of mish`` a probe, not the same function: how much any Mish rewrite could save at most; ``no spinning``
``session.intra_op.allow_spinning`` 0; ``io_binding`` inputs bound and the output pre-allocated once;
``planner`` the whole OnnxPlanner decision; ``weights, numpy`` batch-1 products with each 2-D weight once (one BLAS
thread), ``one cached buffer, numpy`` the same products on views of one buffer that stays in cache: the
gap between the two is the cost of reading the weights. ``max_abs_diff`` against ``graph`` (the probe's is large by
design); ``nodes`` after onnxruntime's optimisations. Writes benchmarks/results/export_latency_probe.json and .md.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import torch
from onnx import helper, numpy_helper

from _common import machine, median_ms, parse_args, write_results
from dmrl.export import OnnxPlanner, export_onnx, input_spec
from dmrl.export.onnx import example_inputs

CASE = "student mlp 512x4 1-step"


def _median_ms(fn: Callable[[], object], reps: int) -> float:
    return median_ms(fn, reps, warmup=min(20, reps))


def _replace_mish(model: onnx.ModelProto, make: Callable[[str, list[str], str], list]) -> int:
    """Replace each written-out Mish (Exp, Add 1, Log, Tanh, Mul with x) by ``make(x, outputs, name)``."""
    g = model.graph
    producer = {o: n for n in g.node for o in n.output}
    drop, new = set(), {}
    for n in g.node:
        if n.op_type != "Mul":
            continue
        chain, x = [n], n.input[0]
        for op in ("Tanh", "Log", "Add", "Exp"):
            prev = producer.get(chain[-1].input[1 if op == "Tanh" else 0])
            if prev is None or prev.op_type != op:
                break
            chain.append(prev)
        if len(chain) == 5 and chain[-1].input[0] == x:
            drop |= {id(c) for c in chain}
            new[id(n)] = make(x, list(n.output), n.name)
    nodes = []
    for n in g.node:
        nodes += new.get(id(n), []) if id(n) in drop else [n]
    del g.node[:]
    g.node.extend(nodes)
    return len(new)


def _gemm_as_matmul(model: onnx.ModelProto) -> None:
    g = model.graph
    inits = {t.name: t for t in g.initializer}
    nodes = []
    for n in g.node:
        attrs = {a.name: helper.get_attribute_value(a) for a in n.attribute}
        if n.op_type != "Gemm" or attrs.get("transB") != 1 or attrs.get("transA", 0) or n.input[1] not in inits:
            nodes.append(n)
            continue
        w = n.input[1] + "__t"
        g.initializer.append(numpy_helper.from_array(numpy_helper.to_array(inits[n.input[1]]).T.copy(), w))
        mm = n.output[0] + "__mm"
        nodes.append(helper.make_node("MatMul", [n.input[0], w], [mm], name=n.name + "_mm"))
        nodes.append(helper.make_node("Add", [mm, n.input[2]], list(n.output), name=n.name + "_add"))
    del g.node[:]
    g.node.extend(nodes)


def _session(model: bytes, spin: bool = True, optimized: str | None = None) -> ort.InferenceSession:
    opts = ort.SessionOptions()
    opts.intra_op_num_threads, opts.inter_op_num_threads, opts.log_severity_level = 1, 1, 3
    if not spin:
        opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
    if optimized:
        opts.optimized_model_filepath = optimized
    return ort.InferenceSession(model, opts, providers=["CPUExecutionProvider"])


@dataclass
class Args:
    checkpoint: Path | None = None
    """a trained checkpoint (default: the random-weight 512x4 one-step student)"""
    reps: int = 300
    """timed calls per measurement"""
    repeats: int = 5
    """measurements per variant, interleaved; the row keeps their median"""


def main() -> None:
    args = parse_args(Args, __doc__)
    if args.reps < 1 or args.repeats < 1:
        raise SystemExit(f"--reps / --repeats: got {args.reps} / {args.repeats}; both must be >= 1")
    torch.set_num_threads(1)
    if args.checkpoint is not None:
        from dmrl.policies.checkpoint import load_policy

        policy, _ = load_policy(args.checkpoint)
    else:
        from export_latency import CASES, _randomise

        torch.manual_seed(0)
        policy = CASES[CASE]()
        _randomise(policy)
    policy.eval()
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        path = tmp / "p.onnx"
        export_onnx(policy, path)
        raw = path.read_bytes()
        feeds = example_inputs(input_spec(policy, 1))
        obs = {k: torch.from_numpy(feeds[k]) for k in policy.chunk.obs_keys}

        def variant(edit: Callable[[onnx.ModelProto], object]) -> bytes:
            m = onnx.load_from_string(raw)
            edit(m)
            return m.SerializeToString()

        sessions = {
            "graph": _session(raw, optimized=str(tmp / "opt.onnx")),
            "gemm as matmul": _session(variant(_gemm_as_matmul)),
            "mish as softplus": _session(variant(lambda m: _replace_mish(m, _softplus_mish))),
            "mish as onnx Mish": _session(variant(lambda m: _replace_mish(m, _onnx_mish))),
            "relu instead of mish": _session(variant(lambda m: _replace_mish(m, _relu))),
            "no spinning": _session(raw, spin=False),
        }
        nodes = {"graph": len(onnx.load(str(tmp / "opt.onnx")).graph.node)}
        ref = sessions["graph"].run(["chunk"], feeds)[0]
        bound = sessions["graph"]
        binding = bound.io_binding()
        for k, v in feeds.items():
            binding.bind_cpu_input(k, v)
        out = np.empty(ref.shape, np.float32)
        binding.bind_output("chunk", "cpu", 0, np.float32, out.shape, out.ctypes.data)
        planner = OnnxPlanner(path, threads=1)
        weights = [numpy_helper.to_array(t) for t in onnx.load_from_string(raw).graph.initializer if len(t.dims) == 2]
        vecs = [np.ones((1, w.shape[1]), np.float32) for w in weights]
        # The same products (shapes, FLOPs) on views of one buffer as large as the largest weight (1 MB for the
        # 512x4 MLP), which stays in the 2 MB per-core L2 cache: what the products cost with no weight to fetch.
        cache = np.ones((max(w.shape[0] for w in weights), max(w.shape[1] for w in weights)), np.float32)
        views = [cache[: w.shape[0], : w.shape[1]] for w in weights]
        timed: dict[str, Callable[[], object]] = {k: (lambda s=s: s.run(["chunk"], feeds)) for k, s in sessions.items()}
        timed["io_binding"] = lambda: bound.run_with_iobinding(binding)
        timed["planner"] = lambda: planner(obs)
        timed["weights, numpy"] = lambda: [x @ w.T for x, w in zip(vecs, weights, strict=True)]
        timed["one cached buffer, numpy"] = lambda: [x @ v.T for x, v in zip(vecs, views, strict=True)]
        try:
            from threadpoolctl import threadpool_limits

            blas = threadpool_limits(1)
        except ImportError:
            blas = None
        runs: dict[str, list[float]] = {k: [] for k in timed}
        for _ in range(args.repeats):
            for k, fn in timed.items():
                runs[k].append(_median_ms(fn, args.reps))
        rows = []
        for k, v in runs.items():
            diff = float(np.abs(sessions[k].run(["chunk"], feeds)[0] - ref).max()) if k in sessions else None
            row = {"variant": k, "ms": float(np.median(v)), "ms_min_of_repeats": float(min(v)), "max_abs_diff": diff}
            rows.append(row | ({"nodes": nodes[k]} if k in nodes else {}))
            print(rows[-1], flush=True)
    command = "python benchmarks/export_latency_probe.py"
    command += f" --checkpoint {args.checkpoint}" if args.checkpoint else ""
    command += f" --reps {args.reps}" if args.reps != 300 else ""
    command += f" --repeats {args.repeats}" if args.repeats != 5 else ""
    meta = {
        **machine(),
        "command": command,
        "policy": str(args.checkpoint) if args.checkpoint else f"{CASE} (random weights)",
        "weights_mb": sum(w.nbytes for w in weights) / 2**20,
        "threads": 1,
        "batch": 1,
        "blas_threads": 1 if blas is not None else "BLAS default (no threadpoolctl)",
        "load_average_1min_at_end": round(os.getloadavg()[0], 2),
        "nice": os.nice(0),
        "onnxruntime": ort.__version__,
    }
    write_results("export_latency_probe", rows, meta, ["variant", "ms", "ms_min_of_repeats", "max_abs_diff", "nodes"])


def _softplus_mish(x: str, outputs: list[str], name: str) -> list:
    return [
        helper.make_node("Softplus", [x], [name + "_sp"], name=name + "_sp"),
        helper.make_node("Tanh", [name + "_sp"], [name + "_th"], name=name + "_th"),
        helper.make_node("Mul", [x, name + "_th"], outputs, name=name + "_mul"),
    ]


def _onnx_mish(x: str, outputs: list[str], name: str) -> list:
    return [helper.make_node("Mish", [x], outputs, name=name + "_mish")]


def _relu(x: str, outputs: list[str], name: str) -> list:
    return [helper.make_node("Relu", [x], outputs, name=name + "_relu")]


if __name__ == "__main__":
    main()
