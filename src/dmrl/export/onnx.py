"""ONNX export of a diffusion policy's chunk planner (encoder + the whole unrolled DDIM chain) for deployment.

The graph is the policy's ``predict_chunk`` as one static program:

    inputs   one per observation key, raw as the env gives them with To frames: state / joints / force float32
             (B, To, dim), rgb uint8 (B, To, 3V, H, W), depth float32 (B, To, V, H, W); then ``init_noise``
             float32 (B, Tp, Da) and, for a stochastic sampler (eta > 0) only, ``step_noise`` (S, B, Tp, Da)
    output   ``chunk`` float32 (B, Tp, Da): raw actions in the env's units, clipped to [-1, 1]

Noise enters as inputs, so the graph has no random ops and gives the torch policy's numbers for the same noise
(the export checks this with onnxruntime before it keeps the file). B, S, To and every image size are fixed at
export: static shapes are what ONNX Runtime, TensorRT and Ascend ATC compile best. The instruction (strings) cannot
enter a graph; policies that read it are refused with a one-line error.

Why a graph at all: at batch 1 the eager loop is dominated by per-op dispatch (about 40 small ops per DDIM step),
which onnxruntime removes; ``benchmarks/export_latency.py`` measures both. The receding-horizon queue stays in
Python (:meth:`ChunkPolicy.act`), with :class:`OnnxPlanner` plugged in through ``ChunkPolicy.set_planner``.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import tempfile
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from dmrl.policies import ChunkPolicy
from dmrl.policies.observations import TEXT_KEYS

OPSET = 18


class ChunkGraph(nn.Module):
    """``predict_chunk`` of a diffusion policy with its noise as inputs: (*obs, init_noise[, step_noise]) -> chunk."""

    def __init__(self, policy: ChunkPolicy) -> None:
        super().__init__()
        if policy.name != "diffusion":
            raise ValueError(f"export: got a {policy.name} policy; ONNX export covers diffusion policies")
        text = [k for k in policy.chunk.obs_keys if k in TEXT_KEYS]
        if text:
            raise ValueError(
                f"export: the policy reads {text[0]!r} (strings), which cannot enter an ONNX graph; "
                "export a policy trained without it"
            )
        self.policy = policy
        self.keys = tuple(policy.chunk.obs_keys)
        self.stochastic = bool(policy.sampler.stochastic)

    def forward(self, *inputs: Tensor) -> Tensor:
        n = len(self.keys)
        obs = dict(zip(self.keys, inputs[:n], strict=True))
        init_noise = inputs[n]
        step_noise = inputs[n + 1] if self.stochastic else None
        p = self.policy
        # The policy's own sampling loop (no gradients): the graph is what predict_chunk runs, noise passed in.
        x = p.sample_chunk(*p.condition(obs), init_noise=init_noise, step_noise=step_noise)
        return p.normalizer.unnormalize("actions", x).clamp(-1.0, 1.0)


def input_spec(policy: ChunkPolicy, batch_size: int) -> dict[str, tuple[tuple[int, ...], str]]:
    """{input name: (shape, numpy dtype name)} of the exported graph, in argument order."""
    to, s = policy.chunk.n_obs_steps, policy.sampler.num_steps
    spec: dict[str, tuple[tuple[int, ...], str]] = {}
    for k in policy.chunk.obs_keys:
        dim = policy.obs_dims[k]
        shape = (batch_size, to, *dim) if isinstance(dim, (tuple, list)) else (batch_size, to, int(dim))
        spec[k] = (shape, "uint8" if k == "rgb" else "float32")
    chunk = (batch_size, policy.chunk.horizon, policy.action_dim)
    spec["init_noise"] = (chunk, "float32")
    if policy.sampler.stochastic:
        spec["step_noise"] = ((s, *chunk), "float32")
    return spec


def example_inputs(spec: dict[str, tuple[tuple[int, ...], str]], seed: int = 0) -> dict[str, np.ndarray]:
    """Random inputs of ``spec``'s shapes: observations in a plausible range, noise standard normal."""
    rng = np.random.default_rng(seed)
    out = {}
    for name, (shape, dtype) in spec.items():
        if dtype == "uint8":
            out[name] = rng.integers(0, 256, size=shape, dtype=np.uint8)
        elif name == "depth":
            out[name] = rng.uniform(0.2, 2.0, size=shape).astype(np.float32)
        else:
            out[name] = rng.standard_normal(shape).astype(np.float32)
    return out


@contextlib.contextmanager
def _quiet(logger: str) -> Iterator[None]:
    """Raise a logger to ERROR for a block (the exporter logs every torchvision op it skips, we have none)."""
    log = logging.getLogger(logger)
    level = log.level
    log.setLevel(logging.ERROR)
    try:
        yield
    finally:
        log.setLevel(level)


@dataclass
class ExportReport:
    path: Path
    inputs: dict[str, tuple[tuple[int, ...], str]]
    max_abs_diff: float
    """Largest |onnxruntime - torch| over the chunk for random inputs: the export's own check."""
    file_mb: float


def export_onnx(
    policy: ChunkPolicy, path: Path, batch_size: int = 1, atol: float = 1e-4, meta: dict[str, Any] | None = None
) -> ExportReport:
    """Write ``path`` (the graph) and ``path.json`` (its input spec and chunk settings); check against torch.

    The file appears only after onnxruntime reproduced torch's chunk to ``atol`` on random inputs, so a failed or
    interrupted export leaves whatever was at ``path`` before.
    """
    if batch_size < 1:
        raise ValueError(f"export --batch-size: got {batch_size}; must be >= 1")
    path = Path(path)
    if path.suffix != ".onnx":
        raise ValueError(f"export --out: got {path}; the file name must end in .onnx")
    path.parent.mkdir(parents=True, exist_ok=True)
    policy = policy.cpu().eval()
    graph = ChunkGraph(policy).eval()
    spec = input_spec(policy, batch_size)
    feeds = example_inputs(spec)
    args = tuple(torch.from_numpy(v) for v in feeds.values())
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".partial.onnx")
    os.close(fd)
    try:
        with torch.no_grad(), warnings.catch_warnings(), _quiet("torch.onnx"):
            warnings.simplefilter("ignore")  # the exporter's advisory chatter; failures still raise
            torch.onnx.export(
                graph,
                args,
                tmp,
                dynamo=True,
                input_names=list(spec),
                output_names=["chunk"],
                opset_version=OPSET,
                optimize=True,
                verbose=False,
                external_data=False,
            )
            expected = graph(*args).numpy()
        got = OnnxPlanner(Path(tmp), spec=spec).run(feeds)
        diff = float(np.abs(got - expected).max())
        if not diff <= atol:
            raise RuntimeError(f"export {path}: onnxruntime differs from torch by {diff:.3g} (> {atol}); file not kept")
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)
    sidecar = {
        "inputs": {k: {"shape": list(s), "dtype": d} for k, (s, d) in spec.items()},
        "output": {"chunk": [batch_size, policy.chunk.horizon, policy.action_dim]},
        "obs_keys": list(policy.chunk.obs_keys),
        "n_obs_steps": policy.chunk.n_obs_steps,
        "n_action_steps": policy.chunk.n_action_steps,
        "num_inference_steps": policy.sampler.num_steps,
        "stochastic": bool(policy.sampler.stochastic),
        "opset": OPSET,
        "max_abs_diff": diff,
        "meta": meta or {},
    }
    Path(f"{path}.json").write_text(json.dumps(sidecar, indent=2))
    return ExportReport(path, spec, diff, path.stat().st_size / 2**20)


class OnnxPlanner:
    """An exported chunk graph run by onnxruntime: ``planner(obs {key: (B, To, ...)}) -> chunk (B, Tp, Da)``.

    Plug it into a policy with ``policy.set_planner(planner)``: ``act`` keeps its history and action queue and
    asks the graph for each new chunk. Rows are run one graph batch at a time (a batch-1 graph serves any B).
    Noise comes from this planner's own generator, so runs are reproducible for a given ``seed``.
    """

    def __init__(
        self, path: Path, spec: dict[str, tuple[tuple[int, ...], str]] | None = None, threads: int = 1, seed: int = 0
    ) -> None:
        import onnxruntime as ort

        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"onnx model {path}: no such file (make one with `dmrl export`)")
        if spec is None:
            side = Path(f"{path}.json")
            if not side.is_file():
                raise FileNotFoundError(f"onnx model {path}: missing {side.name} (written by `dmrl export` beside it)")
            spec = {k: (tuple(v["shape"]), v["dtype"]) for k, v in json.loads(side.read_text())["inputs"].items()}
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = threads
        opts.inter_op_num_threads = 1
        opts.log_severity_level = 3  # ORT warns about ops it cannot constant-fold (e.g. Mish): not actionable
        self.session = ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
        self.spec = spec
        self.obs_keys = [k for k in spec if k not in ("init_noise", "step_noise")]
        self.batch = spec["init_noise"][0][0]
        self.rng = np.random.default_rng(seed)

    def run(self, feeds: dict[str, np.ndarray]) -> np.ndarray:
        """Raw session call on a full feed dict (shapes exactly as the spec)."""
        return self.session.run(["chunk"], feeds)[0]

    def __call__(self, obs: dict[str, Tensor]) -> Tensor:
        missing = [k for k in self.obs_keys if k not in obs]
        if missing:
            raise KeyError(f"onnx planner: obs lacks {missing[0]!r}; the graph needs {self.obs_keys}")
        arrays = {k: np.ascontiguousarray(obs[k].cpu().numpy()).astype(self.spec[k][1]) for k in self.obs_keys}
        b, g = len(arrays[self.obs_keys[0]]), self.batch
        out = []
        for start in range(0, b, g):
            rows = {k: v[start : start + g] for k, v in arrays.items()}
            n = len(rows[self.obs_keys[0]])
            if n < g:  # pad the last rows up to the graph's static batch, drop them after
                rows = {k: np.concatenate([v, np.repeat(v[-1:], g - n, axis=0)]) for k, v in rows.items()}
            for name in ("init_noise", "step_noise"):
                if name in self.spec:
                    rows[name] = self.rng.standard_normal(self.spec[name][0]).astype(np.float32)
            out.append(self.run(rows)[:n])
        return torch.from_numpy(np.concatenate(out))
